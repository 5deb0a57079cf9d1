// The interface every backend implements (CPU reference, CUDA): one forward step over tokens of
// many sequences whose KV cache lives in fixed-size blocks. The backend owns the KV storage and
// its activation buffers; which sequence owns which block is the engine's business (kv_pool.h).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace minfer {

// One sequence's tokens in a step: rows [row, row + n_tokens) of the step are its positions
// [pos, pos + n_tokens). Position p of the sequence lives in block blocks[p / block_size] at
// offset p % block_size; the blocks must cover [0, pos + n_tokens).
struct SeqChunk {
  int row = 0;
  int n_tokens = 0;
  int pos = 0;
  std::span<const int32_t> blocks;
  // A generated token (n_tokens == 1): runs on the decode kernels. Prompt tokens (any count, even
  // one) run on the prompt kernels. Which kernels a token meets depends only on this flag, never
  // on what else is in the step, so a sequence's results do not depend on the batch around it.
  bool decode = false;
};

struct Draw {
  int32_t output = 0;  // index into StepBatch::output_rows
  float temperature = 1.0f;
  double uniform = 0.0;
};

struct StepBatch {
  std::span<const int32_t> tokens;
  // Decode chunks first, then prompt chunks; rows in order, together covering every token.
  std::span<const SeqChunk> chunks;
  // Ascending rows whose output is wanted (argmax always; the logits row when copy_logits is set
  // for that output).
  std::span<const int32_t> output_rows;
  std::span<const uint8_t> copy_logits;  // one flag per output row
  // Draws done where the logits are (only the token comes back): one token from
  // softmax(logits / temperature) over the whole vocabulary of output row `output`, with the
  // caller's uniform number in [0, 1), by the arithmetic of sampling/draw_math.h, so the token is
  // the one draw_softmax gives for the same logits on the host.
  std::span<const Draw> draws;
  // Row i's token is the argmax of output row i of the step submitted just before this one, which
  // had one output row for each row of this step; every chunk is a decode chunk and `tokens` holds
  // placeholders (any ids in the vocabulary). On the CUDA backend the token never leaves the
  // device, so this step can be queued before that one has finished (Backend::submit).
  bool tokens_from_previous = false;
};

struct StepOutput {
  std::vector<int32_t> drawn;   // one per StepBatch::draws entry
  std::vector<int32_t> argmax;  // one per output row (first index on ties)
  // n_vocab floats per output row whose copy_logits flag is set, in memory the backend owns (the
  // CUDA backend's is page-locked, so the copy runs at the link's rate): valid until its next forward.
  std::span<const float> logits;
};

struct BlockCopy {
  int32_t src = 0, dst = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Bytes of KV storage one block of block_size positions takes (every layer, K and V).
  virtual int64_t kv_block_bytes(int block_size) const = 0;
  // Bytes of activation buffers for steps of up to max_tokens tokens, max_outputs of them output
  // rows (the logits rows, n_vocab floats each, are the largest buffer of a long step).
  virtual int64_t workspace_bytes(int max_tokens, int max_outputs) const = 0;
  // Memory this backend can still allocate (host RAM or free device memory).
  virtual int64_t memory_available() const = 0;
  // Allocates n_blocks KV blocks of block_size positions and buffers for steps of up to
  // max_tokens tokens, max_outputs output rows and max_outputs generated (decode) tokens
  // (1 <= max_outputs <= max_tokens). Once only.
  virtual void reserve(int n_blocks, int block_size, int max_tokens, int max_outputs) = 0;
  virtual int max_tokens() const = 0;
  virtual int max_outputs() const = 0;
  // Copies whole blocks (every layer, K and V): the engine's copy-on-write of shared blocks.
  virtual void copy_blocks(std::span<const BlockCopy> copies) = 0;
  // A step in two halves: submit queues it, collect waits for the oldest step submitted and not yet
  // collected and fills `out`. One step may be in flight when the next is submitted, if the next
  // takes its tokens from it (StepBatch::tokens_from_previous) and neither copies logits back nor
  // draws (validate_submit); then the device runs the two back to back.
  virtual void submit(const StepBatch& batch) = 0;
  virtual void collect(StepOutput& out) = 0;
  void forward(const StepBatch& batch, StepOutput& out) {
    submit(batch);
    collect(out);
  }
};

// The backend keeps a reference to the model, which must outlive it.
std::unique_ptr<Backend> make_cpu_backend(const Model& model, int n_threads);
// Throws minfer::Error when minfer was built without CUDA or no device is present.
std::unique_ptr<Backend> make_cuda_backend(const Model& model);
bool cuda_available();

// Checks a step against the backend's limits (rows, chunk order, positions, block tables) and
// throws minfer::Error naming the first problem. Both backends call it first.
void validate_step(const StepBatch& batch, int max_tokens, int max_outputs, int n_blocks, int block_size,
                   int n_vocab);

// What a backend keeps of the step submitted last, for validate_submit.
struct SubmittedStep {
  int output_rows = -1;      // -1: none submitted yet
  bool copies_back = false;  // logits or draws
};
// Checks a step against the one submitted before it (StepBatch::tokens_from_previous), with
// `in_flight` steps submitted and not yet collected (the rule for a step submitted while another
// is in flight), and throws minfer::Error naming the problem.
void validate_submit(const StepBatch& batch, const SubmittedStep& previous, int in_flight);
// What validate_submit keeps of `batch`.
SubmittedStep submitted(const StepBatch& batch);

// MINFER_DUMP=DIR: each backend calls this after every node (step = forward call index).
// Writes DIR/stepNNNN/NN_name.bin (header: rows, cols; then f32 data). Returns false when off.
bool dump_enabled();
void dump_node(int step, int node_index, const std::string& name, int64_t rows, int64_t cols,
               const float* data);

}  // namespace minfer
