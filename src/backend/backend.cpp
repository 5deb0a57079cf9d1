#include "backend/backend.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "util/error.h"

namespace minfer {

void validate_step(const StepBatch& b, int max_tokens, int max_outputs, int n_blocks, int block_size,
                   int n_vocab) {
  const int n = int(b.tokens.size());
  if (max_tokens == 0) fail("backend: forward before reserve");
  if (n == 0 || n > max_tokens) fail("backend: a step of ", n, " tokens (allowed 1 .. ", max_tokens, ")");
  int row = 0;
  bool prompt_seen = false;
  for (const SeqChunk& c : b.chunks) {
    if (c.row != row || c.n_tokens <= 0 || c.row + c.n_tokens > n)
      fail("backend: chunk rows ", c.row, " + ", c.n_tokens, " do not continue row ", row, " of ", n);
    if (c.decode && (c.n_tokens != 1 || prompt_seen))
      fail("backend: a decode chunk must be one token and come before the prompt chunks");
    prompt_seen |= !c.decode;
    if (c.pos < 0) fail("backend: negative position ", c.pos);
    const int64_t end = int64_t(c.pos) + c.n_tokens;
    if (end > int64_t(c.blocks.size()) * block_size)
      fail("backend: positions ", c.pos, " .. ", end - 1, " do not fit the sequence's ", c.blocks.size(),
           " KV blocks of ", block_size, " positions");
    for (int32_t blk : c.blocks)
      if (blk < 0 || blk >= n_blocks) fail("backend: KV block ", blk, " outside the pool of ", n_blocks);
    row += c.n_tokens;
  }
  if (row != n) fail("backend: the chunks cover ", row, " of ", n, " tokens");
  for (int32_t t : b.tokens)
    if (t < 0 || t >= n_vocab) fail("token id ", t, " is outside the vocabulary (", n_vocab, " tokens)");
  if (b.output_rows.size() > size_t(max_outputs))
    fail("backend: a step of ", b.output_rows.size(), " output rows (allowed ", max_outputs, ")");
  const auto decode_rows = std::count_if(b.chunks.begin(), b.chunks.end(), [](const SeqChunk& c) { return c.decode; });
  if (decode_rows > max_outputs)
    fail("backend: a step of ", decode_rows, " generated tokens (allowed ", max_outputs, ")");
  if (b.copy_logits.size() != b.output_rows.size())
    fail("backend: ", b.output_rows.size(), " output rows but ", b.copy_logits.size(), " logits flags");
  for (size_t i = 0; i < b.output_rows.size(); ++i)
    if (b.output_rows[i] < 0 || b.output_rows[i] >= n || (i > 0 && b.output_rows[i] <= b.output_rows[i - 1]))
      fail("backend: output rows must be ascending rows of the step");
  for (const Draw& d : b.draws) {
    if (d.output < 0 || size_t(d.output) >= b.output_rows.size())
      fail("backend: a draw from output ", d.output, " of ", b.output_rows.size());
    if (!(d.temperature > 0.0f) || !(d.uniform >= 0.0 && d.uniform < 1.0))
      fail("backend: a draw at temperature ", d.temperature, " with uniform ", d.uniform,
           " (needs temperature > 0 and uniform in [0, 1))");
  }
}

void validate_submit(const StepBatch& b, const SubmittedStep& previous, int in_flight) {
  if (in_flight > 1) fail("backend: two steps are in flight; collect one before submitting another");
  if (in_flight == 1) {
    if (!b.tokens_from_previous)
      fail("backend: a step submitted while another is in flight must take its tokens from that step's argmax");
    if (previous.copies_back || submitted(b).copies_back)
      fail("backend: steps in flight together copy no logits back and draw no tokens");
  }
  if (!b.tokens_from_previous) return;
  if (previous.output_rows != int(b.tokens.size()))
    fail("backend: a step of ", b.tokens.size(), " rows takes its tokens from a previous step of ",
         std::max(previous.output_rows, 0), " output rows");
  for (const SeqChunk& c : b.chunks)
    if (!c.decode) fail("backend: a step taking its tokens from the previous one has prompt rows");
}

SubmittedStep submitted(const StepBatch& b) {
  const bool logits = std::any_of(b.copy_logits.begin(), b.copy_logits.end(), [](uint8_t c) { return c != 0; });
  return {int(b.output_rows.size()), logits || !b.draws.empty()};
}

#ifndef MINFER_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend(const Model&) {
  fail("the CUDA backend is not available: minfer was built without CUDA (use --backend cpu)");
}
bool cuda_available() { return false; }
#endif

static const char* dump_dir() {
  static const char* dir = [] {
    const char* d = std::getenv("MINFER_DUMP");
    return (d && *d) ? d : nullptr;
  }();
  return dir;
}

bool dump_enabled() { return dump_dir() != nullptr; }

void dump_node(int step, int node_index, const std::string& name, int64_t rows, int64_t cols,
               const float* data) {
  const char* dir = dump_dir();
  if (!dir) return;
  char step_name[32], file_name[32];
  std::snprintf(step_name, sizeof step_name, "step%04d", step);
  std::snprintf(file_name, sizeof file_name, "%04d_", node_index);
  const std::filesystem::path step_dir = std::filesystem::path(dir) / step_name;
  std::error_code ec;
  std::filesystem::create_directories(step_dir, ec);
  if (ec) fail("MINFER_DUMP: cannot create directory ", step_dir.string(), ": ", ec.message());
  const std::filesystem::path path = step_dir / (file_name + name + ".bin");
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) fail("MINFER_DUMP: cannot write ", path.string());
  const int64_t header[2] = {rows, cols};
  const size_t n = size_t(rows * cols);
  const bool ok = std::fwrite(header, sizeof header, 1, f) == 1 &&
                  std::fwrite(data, sizeof(float), n, f) == n;
  if (std::fclose(f) != 0 || !ok) fail("MINFER_DUMP: short write to ", path.string());
}

}  // namespace minfer
