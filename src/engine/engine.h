// The engine: one backend (weights, KV storage, buffers) and the KV pool that assigns its blocks
// to sequences. A Step gathers tokens of many sequences, reserves their KV blocks, runs one
// forward and advances the sequences. Session (one conversation) and Scheduler (many requests)
// are built on it.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/kv_pool.h"

namespace minfer {

enum class BackendKind { Cpu, Cuda, Auto };
BackendKind parse_backend_kind(const std::string& s);  // "cpu" | "cuda" | "auto"
bool runs_on_cuda(BackendKind kind);  // Cuda, or Auto with a device present
// The backend `kind` names (Auto: CUDA when a device is present); n_threads for the CPU backend.
std::unique_ptr<Backend> make_backend(const Model& model, BackendKind kind, int n_threads);

// KV positions per block when nobody chooses (docs/10-batching.md says how it was chosen).
constexpr int kDefaultKvBlockSize = 64;

struct EngineOptions {
  BackendKind backend = BackendKind::Auto;
  int n_threads = 0;         // CPU backend; 0 = all cores
  int max_tokens = 512;      // tokens per forward step
  int max_outputs = 0;       // output rows (logits) and generated tokens per step; 0: max_tokens
  int block_size = kDefaultKvBlockSize;
  int n_blocks = 0;          // KV blocks in the pool
  // What the user changes when the KV cache and buffers do not fit in memory, e.g. "lower -c".
  std::string memory_hint = "lower the context size";
};

// Greedy generation feeds each step from the one before (Step::submit_after) unless
// MINFER_NO_FED_STEPS=1: then each token comes back to the host before the next step is built.
bool fed_steps_enabled();

class Engine {
 public:
  // Checks that the KV blocks and buffers fit in the backend's memory first and throws
  // minfer::Error with the numbers (needed, available) and opts.memory_hint when they do not.
  Engine(const Model& model, const EngineOptions& opts);
  // With a backend made by the caller (tests choose the CUDA backend's fusions); opts.backend and
  // opts.n_threads are not used.
  Engine(const Model& model, const EngineOptions& opts, std::unique_ptr<Backend> backend);
  const Model& model() const { return model_; }
  Backend& backend() { return *backend_; }
  KvPool& kv() { return kv_; }
  const std::string& backend_name() const { return backend_name_; }
  int max_tokens() const { return backend_->max_tokens(); }
  int max_outputs() const { return backend_->max_outputs(); }
  // The backend's forward, counted: a step's logits live in the backend until the next one.
  void forward(const StepBatch& batch, StepOutput& out);
  // The backend's forward in two halves (Backend::submit, Backend::collect); submit counts.
  void submit(const StepBatch& batch);
  void collect(StepOutput& out) { backend_->collect(out); }
  uint64_t forwards() const { return forwards_; }

  // Bytes a pool of n_blocks blocks plus buffers for steps of max_tokens tokens and max_outputs
  // output rows would take on this backend.
  static int64_t memory_needed(const Backend& b, int n_blocks, int block_size, int max_tokens, int max_outputs);

 private:
  static int checked_blocks(const Backend& b, const EngineOptions& o);
  const Model& model_;
  std::unique_ptr<Backend> backend_;
  KvPool kv_;
  std::string backend_name_;
  uint64_t forwards_ = 0;
};

// One forward step under construction. Add work, then run it; afterwards each item's outputs are
// readable until the next clear().
class Step {
 public:
  enum class Output { None, Last, All };  // which of an item's rows produce an output
  explicit Step(Engine& engine) : engine_(engine) {}

  // Adds n = tokens.size() tokens at the sequence's next positions. decode: one generated token
  // (the decode kernels); otherwise prompt tokens. logits: copy the output rows' logits back (else
  // only their argmax). Returns the item's index, or -1 when the step has no room for n more
  // tokens or their output rows (a decode item takes one even without an output), or the pool no
  // room for their KV (then nothing changes).
  int add(KvPool::Sequence& seq, std::span<const int32_t> tokens, bool decode, Output out, bool logits);
  int n_tokens() const { return n_tokens_; }
  int n_outputs() const { return n_outputs_; }  // output rows, and generated tokens without one
  int n_items() const { return int(items_.size()); }
  bool empty() const { return items_.empty(); }
  bool carries_prompt() const;  // an item of prompt tokens (not only decode tokens)
  // Asks the backend to draw the token of item's one output row (Output::Last) from
  // softmax(logits / temperature) with this uniform number (Backend: StepBatch::draws), so the
  // logits need not come back; the token is what draw_softmax gives for them.
  void draw(int item, float temperature, double uniform);
  // Runs the forward and advances every sequence.
  void run();
  // run() in two halves, so that the next step can be queued before this one's results are read.
  // submit() advances the sequences; the results are readable after collect().
  void submit();
  // Submits with each item's token the argmax of `previous`'s item of the same index (the tokens
  // given to add() are placeholders): previous is the step submitted last on the engine, with the
  // same sequences in the same order, each item with one output row (decode items, or prompt items
  // with Output::Last), no logits and no draw; this step's items are decode items. On the CUDA backend
  // the tokens stay on the device and this step runs right behind previous (greedy decoding
  // without a host round trip between tokens).
  void submit_after(const Step& previous);
  void collect();
  void clear();

  // After run(): argmax of the item's output rows, and their logits (n_vocab each) if requested;
  // the logits only until the next step runs on the engine (an error after that).
  std::span<const int32_t> argmax(int item) const;
  std::span<const float> logits(int item) const;
  // After run(): the token drawn for the item (draw()).
  int32_t drawn(int item) const;

 private:
  void submit(bool tokens_from_previous);
  struct Item {
    KvPool::Sequence* seq;
    int first_token;  // in tokens_
    int n_tokens;
    bool decode;
    Output out;
    bool logits;
    int first_output = 0, n_outputs = 0;  // in out_.argmax
    int first_logits = 0;                 // in out_.logits, rows
    int draw = -1;                        // in draws_ / out_.drawn, -1: none
  };
  Engine& engine_;
  std::vector<Item> items_;
  std::vector<int32_t> tokens_;
  int n_tokens_ = 0, n_outputs_ = 0;
  StepOutput out_;
  uint64_t ran_as_ = 0;  // engine_.forwards() after this step's submit
  // assembled by run()
  std::vector<int32_t> batch_tokens_, output_rows_;
  std::vector<uint8_t> copy_logits_;
  std::vector<SeqChunk> chunks_;
  std::vector<Draw> draws_;  // output filled in by run()
};

// Greedy decode as steps fed by one another (Step::submit_after): each step is queued before the
// one it follows is collected, so the host reads a step's tokens while the device runs the next.
// `first` and `second` alternate. fill(step) clears a step and adds its decode items (from the
// second step on their tokens are placeholders); queue_next() says whether one more step may be
// queued; took(step) reads a collected step and says whether to go on, and may go on only while a
// step is queued. A step queued past the last one taken is collected unread: its tokens stay in
// its sequences for the caller to truncate. Whatever a callback throws is rethrown after every
// step in flight has been collected.
void run_fed_steps(Engine& engine, Step& first, Step& second, const std::function<void(Step&)>& fill,
                   const std::function<bool()>& queue_next, const std::function<bool(const Step&)>& took);

}  // namespace minfer
