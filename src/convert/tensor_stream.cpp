#include "convert/tensor_stream.h"

#include <algorithm>
#include <future>
#include <memory>

#include "quant/quant.h"
#include "util/error.h"
#include "util/threadpool.h"

namespace minfer::convert {

namespace {

// Rows converted per inner step: bounds the float scratch buffer of each worker.
constexpr int64_t kRowsPerStep = 16;

std::vector<uint8_t> convert_tensor(ThreadPool& pool, const OutTensor& t) {
  const int64_t row_len = t.shape[0];
  const int64_t n_rows = int64_t(tensor_nbytes(t.type, t.shape) / row_bytes(t.type, row_len));
  const size_t rb = row_bytes(t.type, row_len);
  std::vector<uint8_t> out(rb * size_t(n_rows));
  pool.parallel_for(n_rows, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(size_t(std::min(kRowsPerStep, end - begin) * row_len));
    for (int64_t r = begin; r < end; r += kRowsPerStep) {
      const int64_t n = std::min(kRowsPerStep, end - r);
      t.rows(r, n, scratch.data());
      for (int64_t k = 0; k < n; ++k)
        quantize_row(t.type, scratch.data() + k * row_len, out.data() + size_t(r + k) * rb, row_len);
    }
  });
  return out;
}

}  // namespace

uint64_t write_gguf(const std::string& path, const Metadata& md, const std::vector<OutTensor>& tensors,
                    const StreamOptions& opts) {
  gguf::Writer writer(path);
  for (const auto& [key, value] : md) writer.set(key, value);
  uint64_t total = 0;
  for (const auto& t : tensors) {
    writer.add_tensor(t.name, t.type, t.shape);
    total += tensor_nbytes(t.type, t.shape);
  }
  const uint64_t file_size = writer.total_bytes();
  writer.begin_data();
  ThreadPool pool(opts.n_threads);
  // Convert tensor i while tensor i-1 is being written.
  std::future<void> pending;
  uint64_t done = 0;
  for (const auto& t : tensors) {
    auto data = std::make_shared<std::vector<uint8_t>>(convert_tensor(pool, t));
    if (pending.valid()) pending.get();
    pending = std::async(std::launch::async, [&writer, &t, data] {
      writer.write_tensor_data(t.name, data->data(), data->size());
    });
    done += data->size();
    if (opts.progress) opts.progress(double(done) / double(std::max<uint64_t>(total, 1)));
  }
  if (pending.valid()) pending.get();
  writer.finish();
  return file_size;
}

}  // namespace minfer::convert
