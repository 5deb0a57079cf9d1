// Many sequences on the CPU backend: the paged KV pool (sharing, copy-on-write, running out), steps
// of mixed sequences, the scheduler (chunked prefill, preemption, cancellation), batch invariance,
// and `minfer batch`.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "batching_support.h"
#include "convert/synth.h"
#include "engine/scheduler.h"
#include "engine/session.h"
#include "support.h"
#include "util/error.h"

namespace minfer {
namespace {

const std::string& tiny_model() {
  static const std::string path = [] {
    synth::Options o;
    o.preset = "tiny";
    o.ftype = synth::FileType::Q8_0;
    o.seed = test::seed();
    o.out_path = (test::temp_dir("batching") / "tiny-q8_0.gguf").string();
    synth::write_model(o);
    return o.out_path;
  }();
  return path;
}

const Model& model() {
  static const Model m = Model::load(tiny_model());
  return m;
}

test::BackendFactory cpu_backend() {
  return [](const Model& m) { return make_cpu_backend(m, 2); };
}

TEST(KvPool, ForkSharesBlocksAndTheFirstWriteCopies) {
  KvPool pool(8, 4);
  KvPool::Sequence a(pool);
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(a.reserve(6, copies));  // positions 0..5: blocks 0-3 and 4-5
  a.advance(6);
  EXPECT_EQ(pool.n_used(), 2);
  EXPECT_TRUE(copies.empty());
  KvPool::Sequence b = a.fork(6);
  EXPECT_EQ(pool.n_used(), 2);  // shared, not copied
  EXPECT_EQ(pool.ref_count(a.blocks()[1]), 2);
  // b writes position 6, inside the shared second block: b gets its own copy of it
  ASSERT_TRUE(b.reserve(1, copies));
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, a.blocks()[1]);
  EXPECT_EQ(copies[0].dst, b.blocks()[1]);
  EXPECT_NE(a.blocks()[1], b.blocks()[1]);
  EXPECT_EQ(a.blocks()[0], b.blocks()[0]);  // the full first block stays shared
  EXPECT_EQ(pool.ref_count(a.blocks()[1]), 1);
  // a writes position 6 too: its block is no longer shared, no copy
  copies.clear();
  ASSERT_TRUE(a.reserve(1, copies));
  EXPECT_TRUE(copies.empty());
  b.release();
  a.release();
  EXPECT_EQ(pool.n_free(), 8);
}

TEST(KvPool, RunningOutIsAnOrdinaryOutcome) {
  KvPool pool(3, 4);
  KvPool::Sequence a(pool), b(pool);
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(a.reserve(8, copies));
  a.advance(8);
  EXPECT_EQ(a.blocks_needed(5), 2);
  EXPECT_FALSE(a.reserve(5, copies));  // needs 2 more blocks, 1 is free: nothing changes
  EXPECT_EQ(a.blocks().size(), 2u);
  EXPECT_EQ(pool.n_free(), 1);
  ASSERT_TRUE(b.reserve(4, copies));
  EXPECT_EQ(pool.n_free(), 0);
  b.advance(4);
  b.truncate(0);
  EXPECT_EQ(pool.n_free(), 1);
  EXPECT_THROW(a.truncate(9), Error);  // past its length
}

// A CPU engine of four 4-position blocks and steps of up to 8 tokens.
EngineOptions small_cpu_engine() {
  EngineOptions eo;
  eo.backend = BackendKind::Cpu;
  eo.n_threads = 2;
  eo.max_tokens = 8;
  eo.block_size = 4;
  eo.n_blocks = 4;
  return eo;
}

TEST(Engine, AStepChecksItsInput) {
  Engine engine(model(), small_cpu_engine());
  KvPool::Sequence a(engine.kv());
  Step step(engine);
  const std::vector<int32_t> nine(9, 1), two(2, 1);
  EXPECT_EQ(step.add(a, nine, false, Step::Output::Last, false), -1);  // over the step's 8 tokens
  EXPECT_THROW(step.add(a, two, true, Step::Output::Last, false), Error);  // decode items are one token
  ASSERT_EQ(step.add(a, two, false, Step::Output::Last, false), 0);
  EXPECT_THROW(step.add(a, two, false, Step::Output::Last, false), Error);  // twice in one step
  const std::vector<int32_t> bad = {model().hp.n_vocab};
  KvPool::Sequence b(engine.kv());
  ASSERT_EQ(step.add(b, bad, false, Step::Output::Last, false), 1);
  EXPECT_THROW(step.run(), Error);  // a token outside the vocabulary
}

// A step may be queued while another is in flight only when it takes its tokens from that one's
// argmax and neither of them copies logits back or draws; two at most are in flight; a refused
// submit leaves the steps in flight as they were, and collect hands them back in order.
TEST(Engine, StepsInFlightFollowTheRules) {
  Engine engine(model(), small_cpu_engine());  // 8 tokens a step, 4 blocks of 4 positions
  KvPool::Sequence a(engine.kv()), b(engine.kv());
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(a.reserve(8, copies));
  ASSERT_TRUE(b.reserve(4, copies));
  const std::vector<int32_t> prompt = {1, 2, 3}, one = {0}, two = {0, 0}, last_row = {2}, row0 = {0}, rows01 = {0, 1};
  const std::vector<uint8_t> keep = {1}, drop = {0}, drop2 = {0, 0};
  const SeqChunk prompt_a{0, 3, 0, a.blocks(), false};
  const auto decode_a = [&](int pos) { return SeqChunk{0, 1, pos, a.blocks(), true}; };
  const std::vector<SeqChunk> decode_ab = {decode_a(3), {1, 1, 0, b.blocks(), true}};
  const auto refused = [&](const StepBatch& batch, const std::string& words) {
    try {
      engine.submit(batch);
      ADD_FAILURE() << "submitted a step that should be refused: " << words;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  StepOutput out;
  EXPECT_THROW(engine.collect(out), Error);  // nothing submitted

  engine.submit({prompt, std::span(&prompt_a, 1), last_row, keep, {}});  // its logits come back
  SeqChunk at3 = decode_a(3);
  refused({one, std::span(&at3, 1), row0, drop, {}}, "must take its tokens from that step's argmax");
  refused({one, std::span(&at3, 1), row0, drop, {}, true}, "copy no logits back");
  engine.collect(out);
  ASSERT_EQ(out.logits.size(), size_t(model().hp.n_vocab));
  const int32_t after_prompt = out.argmax.at(0);
  refused({two, decode_ab, rows01, drop2, {}, true}, "a step of 2 rows takes its tokens from a previous step of 1");
  const SeqChunk prompt_at3{0, 1, 3, a.blocks(), false};
  refused({one, std::span(&prompt_at3, 1), row0, drop, {}, true}, "has prompt rows");

  engine.submit({one, std::span(&at3, 1), row0, drop, {}, true});  // position 3: after_prompt
  SeqChunk at4 = decode_a(4), at5 = decode_a(5);
  engine.submit({one, std::span(&at4, 1), row0, drop, {}, true});
  refused({one, std::span(&at5, 1), row0, drop, {}, true}, "two steps are in flight");
  StepOutput third, fourth;
  engine.collect(third);
  engine.collect(fourth);
  EXPECT_THROW(engine.collect(out), Error);

  // The same tokens one step at a time, each read back and given as the next
  Engine plain(model(), small_cpu_engine());
  KvPool::Sequence c(plain.kv());
  ASSERT_TRUE(c.reserve(8, copies));
  const SeqChunk prompt_c{0, 3, 0, c.blocks(), false};
  plain.forward({prompt, std::span(&prompt_c, 1), last_row, drop, {}}, out);
  ASSERT_EQ(out.argmax.at(0), after_prompt);
  for (const auto& [pos, fed] : {std::pair{3, &third}, std::pair{4, &fourth}}) {
    const std::vector<int32_t> token = {out.argmax.at(0)};
    const SeqChunk at{0, 1, pos, c.blocks(), true};
    plain.forward({token, std::span(&at, 1), row0, drop, {}}, out);
    EXPECT_EQ(fed->argmax, out.argmax) << "position " << pos;
  }
}

// A step has room for max_outputs output rows (the logits buffer's rows) and generated tokens,
// whatever its tokens; a backend refuses a step with more, and eval_all cuts its micro-batches to
// that many rows, giving the logits every micro-batch size gives.
TEST(Engine, OutputRowsAreBoundedApartFromTokens) {
  EngineOptions eo = small_cpu_engine();
  eo.max_outputs = 3;
  eo.n_blocks = 16;
  Engine engine(model(), eo);
  EXPECT_EQ(engine.max_tokens(), 8);
  EXPECT_EQ(engine.max_outputs(), 3);
  KvPool::Sequence a(engine.kv()), b(engine.kv()), c(engine.kv());
  Step step(engine);
  const std::vector<int32_t> four = {1, 2, 3, 4}, two = {5, 6};
  EXPECT_EQ(step.add(a, four, false, Step::Output::All, true), -1);  // 4 output rows
  ASSERT_EQ(step.add(a, four, false, Step::Output::Last, true), 0);
  ASSERT_EQ(step.add(b, two, false, Step::Output::All, false), 1);  // 3 rows in all
  EXPECT_EQ(step.n_outputs(), 3);
  EXPECT_EQ(step.add(c, two, false, Step::Output::Last, false), -1);  // a fourth row
  KvPool::Sequence e(engine.kv());
  const std::vector<int32_t> one = {7};
  EXPECT_EQ(step.add(e, one, true, Step::Output::None, false), -1);  // a generated token holds a row
  ASSERT_EQ(step.add(c, two, false, Step::Output::None, false), 2);    // prompt tokens without outputs fit
  step.run();
  EXPECT_EQ(step.logits(0).size(), size_t(model().hp.n_vocab));
  EXPECT_EQ(step.argmax(1).size(), 2u);

  const std::vector<int32_t> toks = {1, 2, 3, 4};
  const std::vector<int32_t> rows = {0, 1, 2, 3};
  const std::vector<uint8_t> flags(4, 0);
  KvPool::Sequence d(engine.kv());
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(d.reserve(4, copies));
  const SeqChunk chunk{0, 4, 0, d.blocks(), false};
  StepOutput out;
  try {
    engine.forward({toks, std::span<const SeqChunk>(&chunk, 1), rows, flags, {}}, out);
    FAIL() << "a step of 4 output rows ran on a backend of 3";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("4 output rows (allowed 3)"), std::string::npos) << e.what();
  }

  KvPool::Sequence f(engine.kv()), g(engine.kv()), h(engine.kv()), i(engine.kv());
  std::vector<SeqChunk> decodes;
  std::vector<int32_t> decode_tokens;
  for (KvPool::Sequence* s : {&f, &g, &h, &i}) {
    ASSERT_TRUE(s->reserve(1, copies));
    decodes.push_back({int(decodes.size()), 1, 0, s->blocks(), true});
    decode_tokens.push_back(1);
  }
  try {
    engine.forward({decode_tokens, decodes, {}, {}, {}}, out);
    FAIL() << "a step of 4 generated tokens ran on a backend of 3 output rows";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("4 generated tokens (allowed 3)"), std::string::npos) << e.what();
  }

  EngineOptions bad = small_cpu_engine();
  bad.max_outputs = -1;
  EXPECT_THROW(Engine(model(), bad), Error);
}

// A session's prompt steps: the backend's default (512 tokens on the CPU, where longer steps
// only take memory; 4096 on CUDA), an explicit size, both within the context.
TEST(Session, PromptStepsFollowTheBackendUnlessSet) {
  SessionOptions o;
  o.backend = BackendKind::Cpu;
  o.n_threads = 2;
  o.n_ctx = 1024;
  EXPECT_EQ(Session(model(), o).engine().max_tokens(), 512);
  o.ubatch = 64;
  EXPECT_EQ(Session(model(), o).engine().max_tokens(), 64);
  o.n_ctx = 32;
  o.ubatch = 0;
  EXPECT_EQ(Session(model(), o).engine().max_tokens(), 32);
  o.ubatch = -1;
  EXPECT_THROW(Session(model(), o), Error);
}

TEST(Session, AllLogitsDoNotDependOnTheOutputRowsAStepHolds) {
  const std::vector<int32_t> tokens = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2};
  std::vector<std::vector<float>> logits;
  for (int max_outputs : {32, 5}) {
    SessionOptions o;
    o.backend = BackendKind::Cpu;
    o.n_threads = 2;
    o.n_ctx = 32;
    o.ubatch = 32;
    o.max_outputs = max_outputs;
    Session s(model(), o);
    const std::span<const float> l = s.eval_all(tokens);
    logits.emplace_back(l.begin(), l.end());
    EXPECT_EQ(s.engine().max_outputs(), max_outputs);
  }
  ASSERT_EQ(logits[0].size(), tokens.size() * size_t(model().hp.n_vocab));
  EXPECT_EQ(logits[0], logits[1]);
}

// A step's logits live in the backend until the next forward: reading them after another step
// ran on the engine is an error, not a read of that step's rows.
TEST(Engine, LogitsAreReadableUntilTheNextStep) {
  Engine engine(model(), small_cpu_engine());
  KvPool::Sequence a(engine.kv()), b(engine.kv());
  const std::vector<int32_t> ta = {1, 2}, tb = {3};
  Step first(engine), second(engine);
  ASSERT_EQ(first.add(a, ta, false, Step::Output::Last, true), 0);
  first.run();
  const std::vector<float> kept(first.logits(0).begin(), first.logits(0).end());
  ASSERT_EQ(kept.size(), size_t(model().hp.n_vocab));
  ASSERT_EQ(second.add(b, tb, false, Step::Output::Last, true), 0);
  second.run();
  EXPECT_THROW(first.logits(0), Error);
  EXPECT_EQ(second.logits(0).size(), size_t(model().hp.n_vocab));
  EXPECT_NE(std::vector<float>(second.logits(0).begin(), second.logits(0).end()), kept);  // another prompt
}

// A sequence's greedy tokens and logits are the same alone as among 11 others, with its prompt cut
// into chunks that share steps with other sequences' decode tokens.
TEST(Batching, GreedyStreamsDoNotDependOnTheBatch) {
  const auto prompts = test::random_prompts(12, 1, 40, model().hp.n_vocab, 1);
  const auto alone = test::greedy_alone(model(), cpu_backend(), prompts, 10);
  for (const int step_tokens : {24, 7}) {
    const auto together = test::greedy_together(model(), cpu_backend(), prompts, 10, 12, step_tokens);
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(together[i].tokens, alone[i].tokens) << "prompt " << i << " step tokens " << step_tokens;
      ASSERT_EQ(together[i].first_logits.size(), alone[i].first_logits.size());
      EXPECT_EQ(std::memcmp(together[i].first_logits.data(), alone[i].first_logits.data(),
                            alone[i].first_logits.size() * 4), 0)
          << "prompt " << i;
    }
  }
}

// Session::generate_greedy (each step fed by the one before, the host reading a token while the
// next step runs) gives decode_greedy's tokens and leaves the same context (the step past the last
// token dropped: the next token's logits are the same bits), and stops at a full context with the
// same error.
TEST(Session, GenerateGreedyIsDecodeGreedyAStepAtATime) {
  test::expect_generate_greedy_is_decode_greedy(model(), cpu_backend());
}

// Greedy decoding with every step queued before the one it takes its tokens from has been read
// (Step::submit_after) gives each prompt the tokens it gets alone, one read-back a step.
TEST(Batching, FedStepsGiveEachPromptsGreedyStream) {
  const auto prompts = test::random_prompts(5, 1, 30, model().hp.n_vocab, 9);
  const auto alone = test::greedy_alone(model(), cpu_backend(), prompts, 12);
  const auto fed = test::greedy_fed(model(), cpu_backend(), prompts, 12, 4);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(fed[i], alone[i].tokens) << "prompt " << i;
}

// Sampled text: each request samples with its own seed, and the sequences of a step sample in
// parallel; the tokens are the same one request at a time (max_seqs 1) as twelve at once.
TEST(Batching, SampledStreamsDoNotDependOnTheBatch) {
  const auto prompts = test::random_prompts(12, 1, 40, model().hp.n_vocab, 5);
  SamplerParams sp;
  sp.temperature = 1.0f;
  sp.top_k = 0;
  sp.top_p = 0.9f;
  sp.min_p = 0.0f;
  sp.seed = test::seed();
  const auto one_at_a_time = test::sampled_streams(model(), cpu_backend(), prompts, 12, 1, sp, false).tokens;
  const auto together = test::sampled_streams(model(), cpu_backend(), prompts, 12, 12, sp, false).tokens;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(together[i].size(), 12u);
    EXPECT_EQ(together[i], one_at_a_time[i]) << "prompt " << i;
  }
}

// With nothing cut and no penalty (OpenAI's defaults) the backend draws the token where the logits
// are; it is the token the host sampler draws from the same logits with the same seed, alone or
// twelve at once.
TEST(Batching, BackendDrawsAreTheHostSamplersTokens) {
  const auto prompts = test::random_prompts(12, 1, 40, model().hp.n_vocab, 6);
  const SamplerParams sp = test::whole_vocabulary_sampling(0.7f, test::seed());
  const auto host = test::sampled_streams(model(), cpu_backend(), prompts, 12, 12, sp, true);
  EXPECT_EQ(host.backend_draws, 0);
  for (int max_seqs : {1, 12}) {
    const auto drawn = test::sampled_streams(model(), cpu_backend(), prompts, 12, max_seqs, sp, false);
    EXPECT_EQ(drawn.backend_draws, 12 * 12);  // every token
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(drawn.tokens[i].size(), 12u);
      EXPECT_EQ(drawn.tokens[i], host.tokens[i]) << "prompt " << i << " max_seqs " << max_seqs;
    }
  }
  setenv("MINFER_NO_BACKEND_DRAW", "1", 1);  // the opt-out: the host samples every token
  const auto opted_out = test::sampled_streams(model(), cpu_backend(), prompts, 12, 12, sp, false);
  unsetenv("MINFER_NO_BACKEND_DRAW");
  EXPECT_EQ(opted_out.backend_draws, 0);
  EXPECT_EQ(opted_out.tokens, host.tokens);
}

// A pool too small for all sequences at once: the newest are preempted (their blocks freed) and
// recompute when they run again; every request still completes, with the same tokens.
TEST(Batching, PreemptionWhenBlocksRunOutLosesNothing) {
  const auto prompts = test::random_prompts(6, 20, 30, model().hp.n_vocab, 2);
  const auto alone = test::greedy_alone(model(), cpu_backend(), prompts, 24);
  EngineOptions eo;
  eo.max_tokens = 64;
  eo.block_size = 8;
  eo.n_blocks = 14;  // 112 positions for 6 sequences that grow to 44-54 positions each
  Engine engine(model(), eo, make_cpu_backend(model(), 2));
  Scheduler scheduler(engine, {6, 0, {}});
  std::vector<std::vector<int32_t>> got(prompts.size());
  std::vector<FinishReason> reasons(prompts.size(), FinishReason::Cancelled);
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.prompt = prompts[i];
    r.max_tokens = 24;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    r.on_token = [&got, i](int, int32_t t, std::span<const float>) {
      got[i].push_back(t);
      return true;
    };
    r.on_finish = [&reasons, i](int, FinishReason f) { reasons[i] = f; };
    scheduler.submit(std::move(r));
  }
  while (scheduler.has_work()) scheduler.step();
  EXPECT_GT(scheduler.counts().preemptions, 0);
  EXPECT_EQ(engine.kv().n_free(), engine.kv().n_blocks());
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(reasons[i], FinishReason::Length) << i;
    EXPECT_EQ(got[i], alone[i].tokens) << "prompt " << i;
  }
}

TEST(Batching, CancelledRequestsGiveTheirBlocksBack) {
  EngineOptions eo;
  eo.max_tokens = 32;
  eo.block_size = 8;
  eo.n_blocks = 32;
  Engine engine(model(), eo, make_cpu_backend(model(), 2));
  Scheduler scheduler(engine, {4, 0, {}});
  const auto prompts = test::random_prompts(3, 5, 10, model().hp.n_vocab, 3);
  std::vector<int> generated(3, 0);
  std::vector<FinishReason> reasons(3, FinishReason::Stop);
  std::vector<uint64_t> ids;
  for (size_t i = 0; i < 3; ++i) {
    Request r;
    r.prompt = prompts[i];
    r.max_tokens = 100;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    // request 0 stops itself after 3 tokens; request 1 is cancelled from outside
    r.on_token = [&generated, i](int, int32_t, std::span<const float>) { return !(i == 0 && ++generated[i] >= 3); };
    r.on_finish = [&reasons, i](int, FinishReason f) { reasons[i] = f; };
    ids.push_back(scheduler.submit(std::move(r)));
  }
  for (int s = 0; s < 5; ++s) scheduler.step();
  scheduler.cancel(ids[1]);
  scheduler.cancel(ids[2]);
  scheduler.step();
  EXPECT_FALSE(scheduler.has_work());
  EXPECT_EQ(reasons[0], FinishReason::Cancelled);
  EXPECT_EQ(reasons[1], FinishReason::Cancelled);
  EXPECT_EQ(engine.kv().n_free(), engine.kv().n_blocks());
  EXPECT_THROW(scheduler.submit(Request{}), Error);  // an empty prompt
}

// A fork shares the prompt's blocks; diverging continuations each equal a fresh run of their own.
TEST(Batching, ForkedSequencesDivergeCleanly) {
  EngineOptions eo;
  eo.max_tokens = 64;
  eo.block_size = 16;
  eo.n_blocks = 16;
  Engine engine(model(), eo, make_cpu_backend(model(), 2));
  const auto prompt = test::random_prompts(1, 40, 40, model().hp.n_vocab, 4)[0];
  auto continue_with = [&](KvPool::Sequence& seq, int32_t token) {
    Step step(engine);
    step.add(seq, std::span<const int32_t>(&token, 1), true, Step::Output::Last, true);
    step.run();
    const auto l = step.logits(0);
    return std::vector<float>(l.begin(), l.end());
  };
  KvPool::Sequence a(engine.kv());
  {
    Step step(engine);
    step.add(a, prompt, false, Step::Output::None, false);
    step.run();
  }
  KvPool::Sequence b = a.fork(a.n_tokens());
  Step both(engine);
  const int32_t ta = 5, tb = 9;
  both.add(a, std::span<const int32_t>(&ta, 1), true, Step::Output::Last, true);
  both.add(b, std::span<const int32_t>(&tb, 1), true, Step::Output::Last, true);
  both.run();
  const std::vector<float> la(both.logits(0).begin(), both.logits(0).end()), lb(both.logits(1).begin(), both.logits(1).end());
  for (const auto& [token, logits] : {std::pair{ta, la}, std::pair{tb, lb}}) {
    KvPool::Sequence fresh(engine.kv());
    Step step(engine);
    step.add(fresh, prompt, false, Step::Output::None, false);
    step.run();
    const std::vector<float> want = continue_with(fresh, token);
    EXPECT_EQ(std::memcmp(want.data(), logits.data(), want.size() * 4), 0) << "token " << token;
  }
}

TEST(BatchCli, ParallelOneAndEightWriteTheSameLines) {
  const auto dir = test::temp_dir("batch-cli");
  {
    std::ofstream f(dir / "prompts.txt");
    f << "In the beginning\nAnd God said\n\nLet there be light\nThe earth was without form\n"
         "And the evening and the morning\nblessed are\nx\ny\nz\n";
  }
  auto run = [&](int parallel, const std::string& extra) {
    const std::string out = (dir / ("out" + std::to_string(parallel) + ".jsonl")).string();
    std::string log;
    const int rc = test::run_command(test::minfer_binary() + " batch -m " + tiny_model() + " -f " +
                                         (dir / "prompts.txt").string() + " -n 12 --backend cpu -t 2 --parallel " +
                                         std::to_string(parallel) + extra + " -o " + out,
                                     &log);
    EXPECT_EQ(rc, 0) << log;
    std::ifstream in(out);
    std::vector<nlohmann::json> lines;
    std::string line;
    while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));
    return lines;
  };
  const auto one = run(1, " --temp 0"), eight = run(8, " --temp 0");
  ASSERT_EQ(one.size(), 9u);  // the empty line is not a prompt
  EXPECT_EQ(one, eight);
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_EQ(one[i]["index"], i);
    EXPECT_TRUE(one[i]["text"].is_string());
    EXPECT_LE(one[i]["tokens"].size(), 12u);
    EXPECT_TRUE(one[i]["finish_reason"] == "stop" || one[i]["finish_reason"] == "length");
  }
  EXPECT_EQ(one[2]["prompt"], "Let there be light");
  // sampled text depends on the seed and the prompt's index only
  EXPECT_EQ(run(1, " --temp 1 --seed 5"), run(8, " --temp 1 --seed 5"));
  std::string log;
  EXPECT_NE(test::run_command(test::minfer_binary() + " batch -m " + tiny_model() + " -f " +
                                  (dir / "missing.txt").string(),
                              &log),
            0);
  EXPECT_NE(log.find("cannot read prompts"), std::string::npos) << log;
}

}  // namespace
}  // namespace minfer
