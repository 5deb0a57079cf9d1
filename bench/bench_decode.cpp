// Decode matmul timings on the GPU (CUDA events, manual time): the weight matrices of a layer of
// the Qwen2.5 7B/14B presets at the types llama.cpp's Q4_K_M mix gives them (the table the prefill
// tests and bench iterate, tests/cuda/model_gemms.h), for the token counts of the decode buckets,
// on each decode matmul kernel. Names: decode/<model>/<matrix>/<type>/T<tokens>/<kernel>, kernel
// = matvec (launch_matvec: warp-per-row dp4a), mma (launch_matmul_mma: int8 tensor cores, given the
// device's SM count as the backend gives it, so each launch takes the engine's kernel: the weight
// rings, CTAs taking several row tiles) or, for q4_K / q6_K at 33..64 tokens on sm_90, wgmma
// (launch_matmul_mma given the operand image: f16 warpgroup MMA, its operand build included);
// ffn_gate_up is gate and up in one launch (two segments), as the engine runs them. Counters:
// GB/s = weight bytes streamed / time, per_forward = launches of that row in one forward.
// decode/<model>/attention/T<tokens>/d<len>/c<chunks>/<body>: the split-K decode attention of every
// layer of a step (one launch per layer, each layer its own paged K/V, the combine writing the
// o-projection's q8 plane as the engine runs it), each token a sequence of len positions, a KV
// head's q heads over <chunks> blocks, body = mma (f16 tensor cores) or simt (CUDA cores,
// AttnParams::tensor_cores = false); GB/s = K/V bytes / time.
//   bench_decode --benchmark_filter='^decode/7B/.*/T64/' --benchmark_repetitions=3 \
//     --benchmark_report_aggregates_only=true
// Without a CUDA build (or device) it registers nothing.
#include <benchmark/benchmark.h>

#if MINFER_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../tests/cuda/model_gemms.h"
#include "../tests/cuda/prefill_test_data.h"
#include "cuda_bench.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/prefill.h"
#include "convert/synth.h"
#include "util/half.h"

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

enum class Kernel { Matvec, Mma, Wgmma };  // Wgmma: launch_matmul_mma given the warpgroup-MMA operand image

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
  std::unique_ptr<DeviceMemory> operand;
  cuda::MatVecExtra extra;
  check(cudaDeviceGetAttribute(&extra.sm_count, cudaDevAttrMultiProcessorCount, 0), "sm count");
  if (kernel == Kernel::Wgmma) {
    operand = std::make_unique<DeviceMemory>(size_t(cuda::wgmma_operand_bytes(int(cols))));
    extra.wgmma_operand = static_cast<uint8_t*>(operand->ptr);
    extra.wgmma_operand_bytes = cuda::wgmma_operand_bytes(int(cols));
    if (!cuda::matmul_wgmma_takes(segs.data(), int(segs.size()), tokens, extra)) {
      state.SkipWithError("the warpgroup-MMA kernel does not take this launch");
      return;
    }
  }
  const auto launch = [&] {
    if (kernel != Kernel::Matvec)
      cuda::launch_matmul_mma(segs.data(), int(segs.size()), act.plane, tokens, extra, {});
    else
      cuda::launch_matvec(segs.data(), int(segs.size()), act.plane, nullptr, int(cols), tokens, {}, {});
  };
  bench::time_with_events(state, launch);
  state.counters["GB/s"] = benchmark::Counter(weight_bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// A step's decode attention: `layers` launches over `tokens` sequences of `len` positions each,
// every layer its own K/V pool of shuffled 64-position blocks (the engine's block size).
void bench_decode_attention(benchmark::State& state, const synth::Preset& preset, int tokens, int len, int layers,
                            int head_chunks, bool tensor_cores) {
  const int hd = preset.head_dim, n_kv = preset.n_head_kv, n_head = preset.n_head, block_size = 64;
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "sm count");
  const int blocks_per_seq = (len + block_size - 1) / block_size, n_blocks = blocks_per_seq * tokens;
  std::vector<int32_t> order(static_cast<size_t>(n_blocks)), offsets, positions(static_cast<size_t>(tokens), len - 1);
  for (int b = 0; b < n_blocks; ++b) order[size_t(b)] = b;
  std::shuffle(order.begin(), order.end(), std::mt19937_64(5));
  for (int t = 0; t < tokens; ++t) offsets.push_back(t * blocks_per_seq);
  const size_t pool = size_t(n_blocks) * block_size * n_kv * hd;
  std::vector<uint16_t> kv_host(pool);
  std::mt19937_64 rng(6);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (uint16_t& h : kv_host) h = f32_to_f16(normal(rng));
  std::vector<std::unique_ptr<DeviceMemory>> kv;
  for (int i = 0; i < 2 * layers; ++i) {
    kv.push_back(std::make_unique<DeviceMemory>(pool * 2));
    check(cudaMemcpy(kv.back()->ptr, kv_host.data(), pool * 2, cudaMemcpyHostToDevice), "upload K/V");
  }
  const auto upload = [](const std::vector<int32_t>& v) {
    auto d = std::make_unique<DeviceMemory>(v.size() * 4);
    check(cudaMemcpy(d->ptr, v.data(), v.size() * 4, cudaMemcpyHostToDevice), "upload table");
    return d;
  };
  const auto d_tables = upload(order), d_offsets = upload(offsets), d_positions = upload(positions);
  const ActivationPlane q(tokens, n_head * hd);
  const int n_splits = cuda::decode_attention_splits(sms, n_kv);
  DeviceMemory out(size_t(tokens) * n_head * hd * 4);
  DeviceMemory part(size_t(cuda::attention_workspace_floats(tokens, n_head, hd, n_splits)) * 4);
  DeviceMemory q8(size_t(cuda::q8_plane_bytes(tokens, n_head * hd)));
  std::vector<cuda::AttnParams> params(static_cast<size_t>(layers));
  for (int l = 0; l < layers; ++l) {
    cuda::AttnParams& p = params[size_t(l)];
    p.q = static_cast<const float*>(q.floats->ptr);
    p.out = static_cast<float*>(out.ptr);
    p.kv = {static_cast<uint16_t*>(kv[size_t(2 * l)]->ptr), static_cast<uint16_t*>(kv[size_t(2 * l + 1)]->ptr), n_kv, hd};
    p.n_head = n_head;
    p.n_tokens = tokens;
    p.positions = static_cast<const int32_t*>(d_positions->ptr);
    p.tables = static_cast<const int32_t*>(d_tables->ptr);
    p.table_offsets = static_cast<const int32_t*>(d_offsets->ptr);
    p.block_size = block_size;
    p.n_splits = n_splits;
    p.part = static_cast<float*>(part.ptr);
    p.sm_count = sms;
    p.head_chunks = head_chunks;
    p.tensor_cores = tensor_cores;
    if ((n_head * hd) % 256 == 0) p.q8 = cuda::q8_plane(static_cast<uint8_t*>(q8.ptr), tokens, n_head * hd), p.q8_rows = tokens;
  }
  bench::time_with_events(state, [&] {
    for (const cuda::AttnParams& p : params) cuda::launch_attention(p, {});
  });
  state.counters["GB/s"] = benchmark::Counter(double(layers) * 2.0 * tokens * len * n_kv * hd * 2 * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}

int register_all() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) return 0;
  const std::pair<const char*, const char*> models[] = {{"7B", "qwen2.5-7b"}, {"14B", "qwen2.5-14b"}};
  const std::pair<const char*, Kernel> kernels[] = {
      {"matvec", Kernel::Matvec}, {"mma", Kernel::Mma}, {"wgmma", Kernel::Wgmma}};
  const bool has_wgmma = cuda::prefill_gemm_device_has_wgmma();
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
          const bool wgmma_type = g.type == GgmlType::Q4_K || g.type == GgmlType::Q6_K;
          if (kernel == Kernel::Wgmma && !(has_wgmma && wgmma_type && tokens >= cuda::kWgmmaMinTokens)) continue;
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
    const synth::Preset& preset = synth::find_preset(preset_name);
    for (int tokens : {1, 8, 32, 64})
      for (int len : {64, 134, 1024, 16384})
        for (int head_chunks : {1, 2, 4})
          for (bool tensor_cores : {true, false}) {
            if (int64_t(tokens) * len > 64 * 1024) continue;  // the pools of every layer stay a few GB
            const std::string name = std::string("decode/") + label + "/attention/T" + std::to_string(tokens) + "/d" +
                                     std::to_string(len) + "/c" + std::to_string(head_chunks) +
                                     (tensor_cores ? "/mma" : "/simt");
            benchmark::RegisterBenchmark(name.c_str(), [=, &preset](benchmark::State& s) {
              bench_decode_attention(s, preset, tokens, len, preset.n_layer, head_chunks, tensor_cores);
            })->UseManualTime()->Iterations(20)->Unit(benchmark::kMicrosecond);
          }
  }
  return 0;
}
const int registered = register_all();

}  // namespace
}  // namespace minfer
#endif
