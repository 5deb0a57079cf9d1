#include "engine/engine.h"

#include <algorithm>

#include "util/env.h"
#include "util/error.h"

namespace minfer {

BackendKind parse_backend_kind(const std::string& s) {
  if (s == "cpu") return BackendKind::Cpu;
  if (s == "cuda") return BackendKind::Cuda;
  if (s == "auto") return BackendKind::Auto;
  fail("unknown backend '", s, "' (expected cpu, cuda or auto)");
}

bool runs_on_cuda(BackendKind kind) { return kind == BackendKind::Cuda || (kind == BackendKind::Auto && cuda_available()); }

std::unique_ptr<Backend> make_backend(const Model& model, BackendKind kind, int n_threads) {
  return runs_on_cuda(kind) ? make_cuda_backend(model) : make_cpu_backend(model, n_threads);
}

namespace {

std::string mib(int64_t bytes) { return std::to_string((bytes + (1 << 20) - 1) >> 20) + " MiB"; }

// Output rows a step may have (EngineOptions::max_outputs resolved).
int max_outputs_of(const EngineOptions& o) { return o.max_outputs > 0 ? std::min(o.max_outputs, o.max_tokens) : o.max_tokens; }

// Output rows of an item of n tokens.
int outputs_of(Step::Output out, int n) { return out == Step::Output::None ? 0 : out == Step::Output::All ? n : 1; }

}  // namespace

int64_t Engine::memory_needed(const Backend& b, int n_blocks, int block_size, int max_tokens, int max_outputs) {
  return int64_t(n_blocks) * b.kv_block_bytes(block_size) + b.workspace_bytes(max_tokens, max_outputs);
}

Engine::Engine(const Model& model, const EngineOptions& o) : Engine(model, o, make_backend(model, o.backend, o.n_threads)) {}

// The pool's block count, once the KV cache and buffers are known to fit (before anything the
// size scales is allocated, the pool's own tables included).
int Engine::checked_blocks(const Backend& b, const EngineOptions& o) {
  if (o.max_tokens <= 0) fail("tokens per step ", o.max_tokens, " must be positive");
  if (o.max_outputs < 0) fail("output rows per step ", o.max_outputs, " must not be negative");
  const int64_t need = memory_needed(b, o.n_blocks, o.block_size, o.max_tokens, max_outputs_of(o));
  const int64_t have = b.memory_available();
  if (need > have)
    fail("the KV cache (", o.n_blocks, " blocks of ", o.block_size, " positions, ",
         mib(int64_t(o.n_blocks) * b.kv_block_bytes(o.block_size)), ") and buffers need ", mib(need),
         " but only ", mib(have), " of ", b.name() == "cpu" ? "memory" : "GPU memory", " are available; ",
         o.memory_hint);
  return o.n_blocks;
}

Engine::Engine(const Model& model, const EngineOptions& o, std::unique_ptr<Backend> backend)
    : model_(model), backend_(std::move(backend)), kv_(checked_blocks(*backend_, o), o.block_size) {
  backend_->reserve(o.n_blocks, o.block_size, o.max_tokens, max_outputs_of(o));
  backend_name_ = backend_->name();
}

int Step::add(KvPool::Sequence& seq, std::span<const int32_t> tokens, bool decode, Output out, bool logits) {
  const int n = int(tokens.size());
  if (n == 0) fail("a step item needs at least one token");
  if (decode && n != 1) fail("a decode item is exactly one token, not ", n);
  for (const Item& it : items_)
    if (it.seq == &seq) fail("a sequence can appear only once in a step");
  const int n_out = decode ? 1 : outputs_of(out, n);  // a generated token holds its row either way
  if (n_tokens_ + n > engine_.max_tokens() || n_outputs_ + n_out > engine_.max_outputs()) return -1;
  std::vector<BlockCopy> copies;
  if (!seq.reserve(n, copies)) return -1;
  // A shared block the sequence will write was just replaced by a private one: fill it now, so
  // the sequence is whole whether or not this step runs.
  if (!copies.empty()) engine_.backend().copy_blocks(copies);
  Item it{&seq, int(tokens_.size()), n, decode, out, logits};
  tokens_.insert(tokens_.end(), tokens.begin(), tokens.end());
  n_tokens_ += n;
  n_outputs_ += n_out;
  items_.push_back(it);
  return int(items_.size()) - 1;
}

bool fed_steps_enabled() {
  static const bool on = !env_flag("MINFER_NO_FED_STEPS");
  return on;
}

void Engine::forward(const StepBatch& batch, StepOutput& out) {
  submit(batch);
  collect(out);
}

void Engine::submit(const StepBatch& batch) {
  backend_->submit(batch);
  ++forwards_;
}

void Step::run() {
  submit();
  collect();
}

void Step::submit() { submit(false); }

void Step::submit_after(const Step& previous) {
  if (previous.items_.empty() || previous.ran_as_ != engine_.forwards())
    fail("internal error: a step fed by one that was not the last submitted");
  if (previous.items_.size() != items_.size())
    fail("internal error: a step of ", items_.size(), " items fed by one of ", previous.items_.size());
  for (size_t i = 0; i < items_.size(); ++i) {
    const Item &a = items_[i], &p = previous.items_[i];  // p's output row is the backend's output i
    if (a.seq != p.seq || !a.decode || p.first_output != int(i) || p.n_outputs != 1 || p.logits || p.draw >= 0)
      fail("internal error: step item ", i, " is not the greedy continuation of the previous step's item");
  }
  submit(true);
}

void run_fed_steps(Engine& engine, Step& first, Step& second, const std::function<void(Step&)>& fill,
                   const std::function<bool()>& queue_next, const std::function<bool(const Step&)>& took) {
  Step *running = &first, *queued = &second;
  int in_flight = 0;
  const auto collect_the_rest = [&] {
    for (StepOutput ignored; in_flight > 0; --in_flight) engine.collect(ignored);
  };
  try {
    fill(*running);
    running->submit();
    ++in_flight;
    for (;;) {
      if (queue_next()) {
        fill(*queued);
        queued->submit_after(*running);
        ++in_flight;
      }
      running->collect();
      --in_flight;
      if (!took(*running)) break;
      if (in_flight == 0) fail("internal error: a fed step asked for past the last one queued");
      std::swap(running, queued);
    }
  } catch (...) {
    collect_the_rest();
    throw;
  }
  collect_the_rest();
}

void Step::collect() { engine_.collect(out_); }

void Step::submit(bool tokens_from_previous) {
  if (items_.empty()) fail("a step with no tokens");
  batch_tokens_.clear();
  output_rows_.clear();
  copy_logits_.clear();
  chunks_.clear();
  // Rows: decode items first (the backend's order), then prompt items, each in the order added.
  int row = 0, n_logit_rows = 0;
  for (const bool decode_pass : {true, false}) {
    for (Item& it : items_) {
      if (it.decode != decode_pass) continue;
      const std::span<const int32_t> toks(tokens_.data() + it.first_token, size_t(it.n_tokens));
      batch_tokens_.insert(batch_tokens_.end(), toks.begin(), toks.end());
      chunks_.push_back({row, it.n_tokens, it.seq->n_tokens(), it.seq->blocks(), it.decode});
      const int first_out_row = it.out == Output::All ? row : row + it.n_tokens - 1;
      it.first_output = int(output_rows_.size());
      it.first_logits = n_logit_rows;
      it.n_outputs = outputs_of(it.out, it.n_tokens);
      if (it.draw >= 0) draws_[size_t(it.draw)].output = it.first_output;
      for (int r = 0; r < it.n_outputs; ++r) {
        output_rows_.push_back(first_out_row + r);
        copy_logits_.push_back(it.logits ? 1 : 0);
      }
      if (it.logits) n_logit_rows += it.n_outputs;
      row += it.n_tokens;
    }
  }
  engine_.submit({batch_tokens_, chunks_, output_rows_, copy_logits_, draws_, tokens_from_previous});
  ran_as_ = engine_.forwards();
  for (Item& it : items_) it.seq->advance(it.n_tokens);
}

bool Step::carries_prompt() const {
  return std::any_of(items_.begin(), items_.end(), [](const Item& it) { return !it.decode; });
}

void Step::draw(int item, float temperature, double uniform) {
  Item& it = items_.at(size_t(item));
  if (it.out != Output::Last) fail("internal error: a draw for step item ", item, ", which has no single output row");
  if (it.draw >= 0) fail("internal error: two draws for step item ", item);
  it.draw = int(draws_.size());
  draws_.push_back({0, temperature, uniform});
}

int32_t Step::drawn(int item) const {
  const Item& it = items_.at(size_t(item));
  if (it.draw < 0) fail("internal error: step item ", item, " has no draw");
  return out_.drawn.at(size_t(it.draw));
}

void Step::clear() {
  // Blocks reserved by items that never ran stay with their sequences; the next reserve uses them.
  items_.clear();
  draws_.clear();
  tokens_.clear();
  n_tokens_ = n_outputs_ = 0;
}

std::span<const int32_t> Step::argmax(int item) const {
  const Item& it = items_.at(size_t(item));
  return std::span<const int32_t>(out_.argmax).subspan(size_t(it.first_output), size_t(it.n_outputs));
}

std::span<const float> Step::logits(int item) const {
  const Item& it = items_.at(size_t(item));
  if (!it.logits) fail("step item ", item, " did not ask for logits");
  if (ran_as_ != engine_.forwards())
    fail("internal error: step item ", item, "'s logits were read after another step ran on the engine");
  const size_t v = size_t(engine_.model().hp.n_vocab);
  return out_.logits.subspan(size_t(it.first_logits) * v, size_t(it.n_outputs) * v);
}

}  // namespace minfer
