// Decode matmul timings on the GPU (CUDA events, manual time): the weight matrices of a layer of
// the Qwen2.5 7B/14B presets at the types llama.cpp's Q4_K_M mix gives them (the table the prefill
// tests and bench iterate, tests/cuda/model_gemms.h), for the token counts of the decode buckets,
// on each decode matmul kernel. Names: decode/<model>/<matrix>/<type>/T<tokens>/<kernel>, kernel
// = matvec (launch_matvec: warp-per-row dp4a) or mma (launch_matmul_mma: int8 tensor cores);
// ffn_gate_up is gate and up in one launch (two segments), as the engine runs them. Counters:
// GB/s = weight bytes streamed / time, per_forward = launches of that row in one forward.
//   bench_decode --benchmark_filter='^decode/7B/.*/T64/' --benchmark_repetitions=3 \
//     --benchmark_report_aggregates_only=true
// Without a CUDA build (or device) it registers nothing.
#include <benchmark/benchmark.h>

#if MINFER_HAVE_CUDA
#include <cuda_runtime.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../tests/cuda/model_gemms.h"
#include "../tests/cuda/prefill_test_data.h"
#include "cuda_bench.h"
#include "backend/cuda/kernels.h"
#include "convert/synth.h"

namespace minfer {
namespace {

using bench::check;
using bench::DeviceMemory;
using bench::device_weights;

// The q8 plane of `tokens` rows of random activations, `width` wide, quantized on the device by
// the standalone kernel (what the engine's producers write).
struct ActivationPlane {
  std::unique_ptr<DeviceMemory> floats, bytes;
  cuda::Q8Plane plane;
  ActivationPlane(int tokens, int width) {
    std::mt19937_64 rng(77 + uint64_t(width));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(size_t(tokens) * size_t(width));
    for (float& v : x) v = normal(rng);
    floats = std::make_unique<DeviceMemory>(x.size() * sizeof(float));
    check(cudaMemcpy(floats->ptr, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice), "upload activations");
    bytes = std::make_unique<DeviceMemory>(size_t(cuda::q8_plane_bytes(tokens, width)));
    plane = cuda::q8_plane(static_cast<uint8_t*>(bytes->ptr), tokens, width);
    cuda::launch_quantize_q8(static_cast<const float*>(floats->ptr), width, plane, tokens, width, {});
    check(cudaDeviceSynchronize(), "quantize");
  }
};

enum class Kernel { Matvec, Mma };

// Times one launch of `rows` (one segment per entry) of `type` x `cols` over `tokens` tokens.
void bench_decode(benchmark::State& state, GgmlType type, const std::vector<int64_t>& rows, int64_t cols, int tokens,
                  Kernel kernel) {
  const ActivationPlane act(tokens, int(cols));
  std::vector<std::unique_ptr<DeviceMemory>> outs;
  std::vector<cuda::MatSeg> segs(rows.size());
  double weight_bytes = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    outs.push_back(std::make_unique<DeviceMemory>(size_t(tokens) * size_t(rows[i]) * sizeof(float)));
    segs[i].w = {type, int(rows[i]), int(cols), device_weights(type, rows[i], cols, int(i))};
    segs[i].out = static_cast<float*>(outs.back()->ptr);
    segs[i].ld_out = int(rows[i]);
    weight_bytes += double(row_bytes(type, cols)) * double(rows[i]);
  }
  const auto launch = [&] {
    if (kernel == Kernel::Mma)
      cuda::launch_matmul_mma(segs.data(), int(segs.size()), act.plane, tokens, {}, {});
    else
      cuda::launch_matvec(segs.data(), int(segs.size()), act.plane, nullptr, int(cols), tokens, {}, {});
  };
  bench::time_with_events(state, launch);
  state.counters["GB/s"] = benchmark::Counter(weight_bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

int register_all() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) return 0;
  const std::pair<const char*, const char*> models[] = {{"7B", "qwen2.5-7b"}, {"14B", "qwen2.5-14b"}};
  const std::pair<const char*, Kernel> kernels[] = {{"matvec", Kernel::Matvec}, {"mma", Kernel::Mma}};
  for (const auto& [label, preset_name] : models) {
    std::vector<test::PromptGemm> matrices = test::prompt_gemms(synth::find_preset(preset_name));
    // gate and up in one launch, where they share a type (they do in the Q4_K_M mix)
    std::vector<test::PromptGemm> gate_up;
    for (const test::PromptGemm& gate : matrices)
      for (const test::PromptGemm& up : matrices)
        if (gate.matrix == "ffn_gate" && up.matrix == "ffn_up" && up.type == gate.type)
          gate_up.push_back({"ffn_gate_up", gate.type, gate.n + up.n, gate.k, gate.per_forward, gate.n + up.n});
    matrices.insert(matrices.end(), gate_up.begin(), gate_up.end());
    for (const test::PromptGemm& g : matrices)
      for (int tokens : {1, 8, 32, 64})
        for (const auto& [kernel_name, kernel] : kernels) {
          const std::string name = std::string("decode/") + label + "/" + g.matrix + "/" + type_traits(g.type).name +
                                   "/T" + std::to_string(tokens) + "/" + kernel_name;
          const std::vector<int64_t> rows =
              g.matrix == "ffn_gate_up" ? std::vector<int64_t>{g.n / 2, g.n / 2} : std::vector<int64_t>{g.n};
          const test::PromptGemm matrix = g;
          const Kernel k = kernel;
          benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) {
            bench_decode(s, matrix.type, rows, matrix.k, tokens, k);
            s.counters["per_forward"] = matrix.per_forward;
          })->UseManualTime()->Iterations(50)->Unit(benchmark::kMicrosecond);
        }
  }
  return 0;
}
const int registered = register_all();

}  // namespace
}  // namespace minfer
#endif
