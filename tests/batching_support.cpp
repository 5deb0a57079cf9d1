#include "batching_support.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>

#include "engine/scheduler.h"
#include "engine/session.h"
#include "sampling/sampler.h"
#include "support.h"
#include "util/error.h"

namespace minfer::test {

std::vector<std::vector<int32_t>> random_prompts(int n, int min_len, int max_len, int n_vocab, uint64_t salt) {
  std::mt19937_64 rng(seed() + salt);
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(n));
  for (auto& p : prompts) {
    p.resize(size_t(min_len + int(rng() % uint64_t(max_len - min_len + 1))));
    for (auto& t : p) t = int32_t(rng() % uint64_t(n_vocab));
  }
  return prompts;
}

std::vector<GreedyStream> greedy_alone(const Model& model, const BackendFactory& backend,
                                       const std::vector<std::vector<int32_t>>& prompts, int n_gen) {
  std::vector<GreedyStream> out;
  for (const auto& prompt : prompts) {
    SessionOptions o;
    o.n_ctx = int(prompt.size()) + n_gen + 1;
    Session s(model, o, backend(model));
    GreedyStream g;
    const std::span<const float> logits = s.eval(prompt);
    g.first_logits.assign(logits.begin(), logits.end());
    int32_t next = argmax(logits);
    for (int i = 0; i < n_gen; ++i) {
      g.tokens.push_back(next);
      if (i + 1 < n_gen) next = s.decode_greedy(next);
    }
    out.push_back(std::move(g));
  }
  return out;
}

std::vector<std::vector<int32_t>> greedy_fed(const Model& model, const BackendFactory& backend,
                                             const std::vector<std::vector<int32_t>>& prompts, int n_gen,
                                             int block_size) {
  EngineOptions eo;
  eo.max_tokens = 0;
  for (const auto& p : prompts) eo.max_tokens += int(p.size());
  eo.block_size = block_size;
  for (const auto& p : prompts) eo.n_blocks += (int(p.size()) + n_gen + block_size - 1) / block_size;
  Engine engine(model, eo, backend(model));
  std::vector<KvPool::Sequence> seqs;
  for (size_t i = 0; i < prompts.size(); ++i) seqs.emplace_back(engine.kv());
  Step first(engine), second(engine);
  for (size_t i = 0; i < prompts.size(); ++i)
    if (first.add(seqs[i], prompts[i], false, Step::Output::Last, false) < 0) fail("greedy_fed: no room");
  first.submit();
  std::vector<std::vector<int32_t>> out(prompts.size());
  Step *running = &first, *queued = &second;
  const int32_t placeholder = 0;
  for (int g = 0; g < n_gen; ++g) {
    if (g + 1 < n_gen) {
      queued->clear();
      for (KvPool::Sequence& seq : seqs)
        if (queued->add(seq, std::span<const int32_t>(&placeholder, 1), true, Step::Output::Last, false) < 0)
          fail("greedy_fed: no room");
      queued->submit_after(*running);
    }
    running->collect();
    for (size_t i = 0; i < seqs.size(); ++i) out[i].push_back(running->argmax(int(i))[0]);
    std::swap(running, queued);
  }
  return out;
}

namespace {
// One session's greedy run: the prompt, then `n` greedy tokens (Session::generate_greedy when
// `generate`, else decode_greedy a token at a time), then the logits of the last token decoded
// after them, so that the context the run leaves is compared too. With n_ctx = 0 the context holds
// exactly the prompt and n tokens, else n_ctx; `error` is the message a run stopped by the context's
// end threw.
struct SessionGreedy {
  std::vector<int32_t> tokens;
  int n_past = 0;
  std::vector<float> logits_after;
  std::string error;
};
SessionGreedy session_greedy(const Model& model, const BackendFactory& backend, const std::vector<int32_t>& prompt,
                             int n, bool generate, int n_ctx = 0) {
  SessionOptions o;
  o.n_ctx = n_ctx > 0 ? n_ctx : int(prompt.size()) + n + 1;
  o.kv_block_size = 16;
  Session s(model, o, backend(model));
  SessionGreedy g;
  int32_t token = s.eval_greedy(prompt);
  try {
    if (generate) {
      s.generate_greedy(token, [&](int32_t t) {
        g.tokens.push_back(t);
        return int(g.tokens.size()) < n;
      });
    } else {
      for (;;) {
        g.tokens.push_back(token);
        if (int(g.tokens.size()) == n) break;
        token = s.decode_greedy(token);
      }
    }
  } catch (const Error& e) {
    g.error = e.what();
  }
  g.n_past = s.n_past();
  if (g.error.empty()) {
    const std::span<const float> l = s.decode(g.tokens.back());
    g.logits_after.assign(l.begin(), l.end());
  }
  return g;
}

}  // namespace

void expect_generate_greedy_is_decode_greedy(const Model& model, const BackendFactory& backend) {
  const auto prompt = random_prompts(1, 5, 20, model.hp.n_vocab, 3)[0];
  for (const int n : {1, 2, 9}) {
    const auto fed = session_greedy(model, backend, prompt, n, true);
    const auto one_by_one = session_greedy(model, backend, prompt, n, false);
    EXPECT_EQ(fed.tokens, one_by_one.tokens) << n << " tokens";
    EXPECT_EQ(fed.n_past, one_by_one.n_past) << n << " tokens";
    ASSERT_EQ(fed.logits_after.size(), size_t(model.hp.n_vocab));
    EXPECT_EQ(std::memcmp(fed.logits_after.data(), one_by_one.logits_after.data(), fed.logits_after.size() * 4), 0)
        << n << " tokens";
  }
  const int n_ctx = int(prompt.size()) + 6;
  const auto fed = session_greedy(model, backend, prompt, 1000, true, n_ctx);
  const auto one_by_one = session_greedy(model, backend, prompt, 1000, false, n_ctx);
  EXPECT_EQ(fed.tokens, one_by_one.tokens);
  EXPECT_EQ(fed.tokens.size(), 7u);  // the prompt's token and six decoded
  EXPECT_EQ(fed.n_past, n_ctx);
  EXPECT_NE(fed.error.find("exceeds the context size"), std::string::npos) << fed.error;
  EXPECT_EQ(fed.error, one_by_one.error);
}

std::vector<GreedyStream> greedy_together(const Model& model, const BackendFactory& backend,
                                          const std::vector<std::vector<int32_t>>& prompts, int n_gen,
                                          int max_seqs, int step_tokens) {
  size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  EngineOptions eo;
  eo.max_tokens = step_tokens;
  eo.block_size = 16;
  eo.n_blocks = max_seqs * int((longest + size_t(n_gen) + 16) / 16 + 1);
  Engine engine(model, eo, backend(model));
  SchedulerOptions so;
  so.max_seqs = max_seqs;
  Scheduler scheduler(engine, so);
  std::vector<GreedyStream> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.prompt = prompts[i];
    r.max_tokens = n_gen;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    r.want_logits = true;
    GreedyStream& g = out[i];
    r.on_token = [&g](int, int32_t token, std::span<const float> logits) {
      if (g.tokens.empty()) g.first_logits.assign(logits.begin(), logits.end());
      g.tokens.push_back(token);
      return true;
    };
    scheduler.submit(std::move(r));
  }
  while (scheduler.has_work()) scheduler.step();
  return out;
}

SamplerParams whole_vocabulary_sampling(float temperature, uint64_t seed) {
  SamplerParams p;
  p.temperature = temperature;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = seed;
  return p;
}

namespace {
// The backend, counting the draws the steps ask of it.
class DrawCounter : public Backend {
 public:
  DrawCounter(std::unique_ptr<Backend> inner, int64_t& draws) : inner_(std::move(inner)), draws_(draws) {}
  std::string name() const override { return inner_->name(); }
  int64_t kv_block_bytes(int block_size) const override { return inner_->kv_block_bytes(block_size); }
  int64_t workspace_bytes(int max_tokens, int max_outputs) const override {
    return inner_->workspace_bytes(max_tokens, max_outputs);
  }
  int64_t memory_available() const override { return inner_->memory_available(); }
  void reserve(int n_blocks, int block_size, int max_tokens, int max_outputs) override {
    inner_->reserve(n_blocks, block_size, max_tokens, max_outputs);
  }
  int max_tokens() const override { return inner_->max_tokens(); }
  int max_outputs() const override { return inner_->max_outputs(); }
  void copy_blocks(std::span<const BlockCopy> copies) override { inner_->copy_blocks(copies); }
  void submit(const StepBatch& batch) override {
    draws_ += int64_t(batch.draws.size());
    inner_->submit(batch);
  }
  void collect(StepOutput& out) override { inner_->collect(out); }

 private:
  std::unique_ptr<Backend> inner_;
  int64_t& draws_;
};
}  // namespace

SampledStreams sampled_streams(const Model& model, const BackendFactory& backend,
                               const std::vector<std::vector<int32_t>>& prompts, int n_gen, int max_seqs,
                               const SamplerParams& sampling, bool want_logits) {
  SampledStreams result;
  EngineOptions eo;
  eo.max_tokens = 64;
  eo.block_size = 16;
  int longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, int(p.size()));
  eo.n_blocks = int(prompts.size()) * ((longest + n_gen + 15) / 16 + 1);
  Engine engine(model, eo, std::make_unique<DrawCounter>(backend(model), result.backend_draws));
  Scheduler scheduler(engine, {max_seqs, 0, {}});
  std::vector<std::vector<int32_t>>& out = result.tokens;
  out.resize(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.prompt = prompts[i];
    r.max_tokens = n_gen;
    r.ignore_eos = true;
    r.sampling = sampling;
    r.sampling.seed = sampling.seed + i;
    r.want_logits = want_logits;
    r.on_token = [&out, i](int, int32_t token, std::span<const float>) {
      out[i].push_back(token);
      return true;
    };
    scheduler.submit(std::move(r));
  }
  while (scheduler.has_work()) scheduler.step();
  return result;
}

}  // namespace minfer::test
