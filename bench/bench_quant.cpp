// Throughput of the quant kernels on rows of 4096 elements: dequantize, quantize, and the dot
// products (runtime-dispatched and portable). items/s counts row elements.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "quant/quant.h"

namespace minfer {
namespace {

constexpr int64_t kRow = 4096;

std::vector<float> gaussian_row(float stddev, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(kRow);
  for (auto& x : v) x = dist(rng);
  return v;
}

GgmlType type_arg(const benchmark::State& state) { return static_cast<GgmlType>(state.range(0)); }

std::vector<uint8_t> quantized_row(GgmlType t) {
  const auto x = gaussian_row(0.02f, 1);
  std::vector<uint8_t> q(row_bytes(t, kRow));
  quantize_row(t, x.data(), q.data(), kRow);
  return q;
}

void finish(benchmark::State& state) {
  state.SetItemsProcessed(state.iterations() * kRow);
  state.SetLabel(type_traits(type_arg(state)).name);
}

void BM_Dequantize(benchmark::State& state) {
  const auto q = quantized_row(type_arg(state));
  std::vector<float> y(kRow);
  for (auto _ : state) {
    dequantize_row(type_arg(state), q.data(), y.data(), kRow);
    benchmark::DoNotOptimize(y.data());
  }
  finish(state);
}

void BM_Quantize(benchmark::State& state) {
  const auto x = gaussian_row(1.0f, 2);
  std::vector<uint8_t> q(row_bytes(type_arg(state), kRow));
  for (auto _ : state) {
    quantize_row(type_arg(state), x.data(), q.data(), kRow);
    benchmark::DoNotOptimize(q.data());
  }
  finish(state);
}

template <bool kPortable>
void BM_DotPad40(benchmark::State& state) {
  const auto w = quantized_row(type_arg(state));
  const auto xf = gaussian_row(1.0f, 3);
  std::vector<BlockQ8Pad40> x(kRow / QK);
  quantize_row_pad40(xf.data(), x.data(), kRow);
  for (auto _ : state) {
    benchmark::DoNotOptimize(kPortable ? vec_dot_pad40_portable(type_arg(state), w.data(), x.data(), kRow)
                                       : vec_dot_pad40(type_arg(state), w.data(), x.data(), kRow));
  }
  finish(state);
}

template <bool kPortable>
void BM_DotFloat(benchmark::State& state) {
  const auto w = quantized_row(type_arg(state));
  const auto x = gaussian_row(1.0f, 4);
  for (auto _ : state) {
    benchmark::DoNotOptimize(kPortable ? vec_dot_f32_portable(type_arg(state), w.data(), x.data(), kRow)
                                       : vec_dot_f32(type_arg(state), w.data(), x.data(), kRow));
  }
  finish(state);
}

void BM_QuantizePad40(benchmark::State& state) {
  const auto x = gaussian_row(1.0f, 5);
  std::vector<BlockQ8Pad40> q(kRow / QK);
  for (auto _ : state) {
    quantize_row_pad40(x.data(), q.data(), kRow);
    benchmark::DoNotOptimize(q.data());
  }
  state.SetItemsProcessed(state.iterations() * kRow);
}

void pad40_types(benchmark::internal::Benchmark* b) {
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                     GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K})
    b->Arg(int64_t(t));
}
void float_types(benchmark::internal::Benchmark* b) {
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16}) b->Arg(int64_t(t));
}
void all_types(benchmark::internal::Benchmark* b) {
  float_types(b);
  pad40_types(b);
  b->Arg(int64_t(GgmlType::Q8_K));
}

BENCHMARK(BM_Dequantize)->Apply(all_types);
BENCHMARK(BM_Quantize)->Apply(all_types);
BENCHMARK(BM_QuantizePad40);
BENCHMARK(BM_DotPad40<false>)->Apply(pad40_types);
BENCHMARK(BM_DotPad40<true>)->Apply(pad40_types);
BENCHMARK(BM_DotFloat<false>)->Apply(float_types);
BENCHMARK(BM_DotFloat<true>)->Apply(float_types);

}  // namespace
}  // namespace minfer
