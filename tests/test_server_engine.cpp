// What the server adds to the engine: the KV pool's prefix cache and requests for n choices that
// fork the prompt's sequence (scheduler), on the CPU backend with the embedded default model.
#include <gtest/gtest.h>

#include <map>

#include "batching_support.h"
#include "engine/scheduler.h"
#include "support.h"
#include "util/error.h"

namespace minfer {
namespace {

const Model& default_model() {
  static const Model m = Model::load((test::source_dir() / "models" / "default.gguf").string());
  return m;
}

TEST(PrefixCache, FullBlocksAreReusedUntilEvicted) {
  KvPool pool(6, 4);
  std::vector<BlockCopy> copies;
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  KvPool::Sequence a(pool);
  ASSERT_TRUE(a.reserve(10, copies));
  a.advance(10);
  a.cache_full_blocks(tokens);  // blocks [1..4] and [5..8]; the third is not full
  const std::vector<int32_t> a_blocks(a.blocks().begin(), a.blocks().end());
  a.release();
  EXPECT_EQ(pool.n_cached(), 2);
  EXPECT_EQ(pool.n_free(), 6);  // cached blocks nobody holds count as free
  EXPECT_EQ(pool.n_used(), 0);

  KvPool::Sequence b(pool);
  EXPECT_EQ(b.attach_cached_prefix(tokens, 9), 8);
  EXPECT_EQ(b.blocks()[0], a_blocks[0]);
  EXPECT_EQ(b.blocks()[1], a_blocks[1]);
  EXPECT_EQ(pool.n_cached(), 0);
  EXPECT_EQ(pool.n_used(), 2);
  KvPool::Sequence c(pool);
  EXPECT_EQ(c.attach_cached_prefix(tokens, 7), 4);  // at most 7 positions: one whole block
  EXPECT_EQ(pool.ref_count(a_blocks[0]), 2);
  KvPool::Sequence d(pool);
  EXPECT_EQ(d.attach_cached_prefix(std::vector<int32_t>{1, 2, 3, 5, 5, 6, 7, 8}, 8), 0);  // differs in block 1
  KvPool::Sequence e(pool);
  EXPECT_EQ(e.attach_cached_prefix(std::vector<int32_t>{9, 1, 2, 3, 4, 5, 6, 7, 8}, 9), 0);  // same blocks, shifted
  EXPECT_THROW(b.attach_cached_prefix(tokens, 9), Error);  // only on an empty sequence

  // Writing into a cached block that one sequence holds alone takes it out of the cache.
  c.release();
  b.truncate(6);
  ASSERT_TRUE(b.reserve(1, copies));
  EXPECT_TRUE(copies.empty());
  b.release();
  KvPool::Sequence f(pool);
  EXPECT_EQ(f.attach_cached_prefix(tokens, 9), 4);
  f.release();

  // When the pool needs blocks, cached ones are reused (least recently released first).
  KvPool::Sequence g(pool);
  ASSERT_TRUE(g.reserve(24, copies));
  EXPECT_EQ(pool.n_cached(), 0);
  g.release();
  KvPool::Sequence h(pool);
  EXPECT_EQ(h.attach_cached_prefix(tokens, 9), 0);
}

struct Output {
  std::map<int, std::vector<int32_t>> tokens;  // per choice
  std::map<int, FinishReason> finish;
};

struct Bench {
  Engine engine;
  Scheduler scheduler;
  Bench(bool prefix_cache, int max_seqs = 4)
      : engine(default_model(), options(), make_cpu_backend(default_model(), 2)),
        scheduler(engine, SchedulerOptions{max_seqs, 0, {}, prefix_cache}) {}
  static EngineOptions options() {
    EngineOptions eo;
    eo.max_tokens = 64;
    eo.block_size = 16;
    eo.n_blocks = 64;
    return eo;
  }
  void submit(const std::vector<int32_t>& prompt, int n, float temperature, uint64_t seed, int max_tokens, Output& out) {
    Request r;
    r.prompt = prompt;
    r.n = n;
    r.max_tokens = max_tokens;
    r.sampling.temperature = temperature;
    r.sampling.seed = seed;
    r.ignore_eos = true;
    r.on_token = [&out](int choice, int32_t t, std::span<const float>) {
      out.tokens[choice].push_back(t);
      return true;
    };
    r.on_finish = [&out](int choice, FinishReason f) { out.finish[choice] = f; };
    scheduler.submit(std::move(r));
  }
  void run() {
    while (scheduler.has_work()) scheduler.step();
  }
};

TEST(PrefixCache, ARepeatedPromptReusesItsBlocksAndGeneratesTheSame) {
  const auto prompt = test::random_prompts(1, 150, 150, default_model().hp.n_vocab, 21)[0];
  Output fresh, first, again;
  {
    Bench off(false);
    off.submit(prompt, 1, 0.0f, 0, 8, fresh);
    off.run();
    EXPECT_EQ(off.scheduler.counts().prefix_hit_tokens, 0);
  }
  Bench on(true);
  on.submit(prompt, 1, 0.0f, 0, 8, first);
  on.run();
  EXPECT_EQ(on.scheduler.counts().prefix_hit_tokens, 0);
  EXPECT_EQ(on.scheduler.counts().kv_cached, 9);  // 150 prompt positions: 9 whole blocks of 16
  on.submit(prompt, 1, 0.0f, 0, 8, again);
  on.run();
  EXPECT_EQ(on.scheduler.counts().prefix_hit_tokens, 144);
  EXPECT_EQ(first.tokens[0], fresh.tokens[0]);
  EXPECT_EQ(again.tokens[0], fresh.tokens[0]);
  EXPECT_EQ(on.scheduler.counts().kv_used, 0);
}

// Choice c of a request for n samples as a request of its own with seed + c would: the prompt
// is computed once and its sequence forked.
TEST(Choices, NChoicesShareThePromptAndMatchSeparateRequests) {
  const auto prompt = test::random_prompts(1, 40, 40, default_model().hp.n_vocab, 22)[0];
  Output together;
  std::vector<Output> apart(3);
  Bench a(false);
  a.submit(prompt, 3, 0.9f, 11, 6, together);
  a.run();
  EXPECT_EQ(a.scheduler.counts().prompt_tokens, 40);  // once, not per choice
  EXPECT_EQ(a.scheduler.counts().generated_tokens, 18);
  // One step computes the prompt (and the first tokens), five decode the rest; forwards are part of steps.
  const SchedulerCounts counts = a.scheduler.counts();
  EXPECT_EQ(counts.prompt_steps.steps, 1);
  EXPECT_EQ(counts.decode_steps.steps, 5);
  EXPECT_EQ(counts.steps(), 6);
  for (const StepTimes& t : {counts.prompt_steps, counts.decode_steps}) {
    EXPECT_GT(t.forward_seconds, 0.0);
    EXPECT_LE(t.forward_seconds, t.seconds);
  }
  EXPECT_EQ(a.engine.kv().n_used(), 0);
  Bench b(false);
  for (int c = 0; c < 3; ++c) b.submit(prompt, 1, 0.9f, 11 + uint64_t(c), 6, apart[size_t(c)]);
  b.run();
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(together.tokens[c], apart[size_t(c)].tokens[0]) << "choice " << c;
    EXPECT_EQ(together.finish[c], FinishReason::Length);
  }
  EXPECT_NE(together.tokens[0], together.tokens[1]);  // different seeds
}

TEST(Choices, CancellingBeforeTheForkEndsEveryChoice) {
  const auto prompt = test::random_prompts(1, 30, 30, default_model().hp.n_vocab, 23)[0];
  Bench s(false, 2);
  Output blocker, waiting;
  s.submit(prompt, 2, 0.0f, 0, 50, blocker);  // takes both sequences
  s.submit(prompt, 2, 0.0f, 0, 50, waiting);
  s.scheduler.step();
  s.scheduler.cancel(2);
  s.scheduler.step();
  EXPECT_EQ(waiting.finish.size(), 2u);
  EXPECT_EQ(waiting.finish[1], FinishReason::Cancelled);
  EXPECT_TRUE(waiting.tokens.empty());
  s.scheduler.cancel(1);
  s.scheduler.step();
  EXPECT_EQ(blocker.finish.size(), 2u);
  EXPECT_FALSE(s.scheduler.has_work());
  EXPECT_EQ(s.engine.kv().n_used(), 0);
  Request too_wide;
  too_wide.prompt = prompt;
  too_wide.n = 3;  // more than max_seqs
  EXPECT_THROW(s.scheduler.submit(std::move(too_wide)), Error);
}

}  // namespace
}  // namespace minfer
