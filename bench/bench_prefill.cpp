// Prefill kernel timings on the GPU (CUDA events, manual time): the weight GEMMs the CUDA backend
// runs for prompt rows — one per weight matrix of a layer (q, k, v, o, gate, up, down), each at the
// type llama.cpp's Q4_K_M mix gives it in the Qwen2.5 7B/14B presets (synth::plan_tensors, so a
// layer whose v or down is q6_K is its own row) — and causal flash attention at several depths.
// Report TFLOP/s = the counter; `per_forward` says how many such GEMMs one forward runs, `splits`
// and `m_tile` which GEMM plan ran. Names: gemm/<model>/<matrix>/<type>/M<m> is the automatic
// plan, .../nosplit the single-pass kernel (what MINFER_NO_GEMM_SPLITK=1 runs), .../splitS forces
// S K slices (the sweep that checks the automatic choice), .../tileT forces the m tile;
// .../mmasync forces the mma.sync kernel where warpgroup MMA is the default (sm_90);
// .../mtileT forces the m-tile under the automatic K split (256: warpgroup MMA only), and
// .../mtile256/splitS both; gemm/7B/ffn_gate_up_swiglu/<type>/M<m> is gate, up and the swiglu in
// one GEMM (TFLOP/s counts both products); gemm/7B/attn_qkv_stacked, attn_qk_stacked and
// attn_v/q6_K/M<m>/planqkv are q, k and v as the engine launches them;
// gemm/7B/<matrix>/<type>/M<m>/plan512[/ntileT] are prompts with the engine's K split (planned
// for 512 tokens and the matrix's q/k/v or gate/up group: what the engine runs at 4096 tokens too,
// where the automatic plan of .../M4096 would not split) and the automatic or a forced n-tile.
//   bench_prefill --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
// Split-K A/B of the small-N matrices only:
//   bench_prefill --benchmark_filter='^gemm/(7B|14B)/(attn_.|attn_output|ffn_down)/' \
//     --benchmark_repetitions=5 --benchmark_report_aggregates_only=true --benchmark_display_aggregates_only=true
// Without a CUDA build (or device) it registers nothing.
#include <benchmark/benchmark.h>

#if MINFER_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "../tests/cuda/model_gemms.h"
#include "../tests/cuda/prefill_test_data.h"
#include "cuda_bench.h"
#include "backend/cuda/prefill.h"
#include "convert/synth.h"

namespace minfer {
namespace {

using test::PromptGemm;
using test::prompt_gemms;

using bench::check;
using bench::DeviceMemory;
using bench::device_weights;

// Random f16/bf16 bit patterns of normal(0,1) values (host-generated, uploaded), generated once
// per (count, type, seed): each repetition re-runs a benchmark's setup.
void* device_random_16bit(size_t count, bool bf16, uint64_t seed) {
  static std::map<std::tuple<size_t, bool, uint64_t>, std::unique_ptr<DeviceMemory>> cache;
  auto& slot = cache[{count, bf16, seed}];
  if (!slot) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<uint16_t> host(count);
    for (auto& h : host) h = bf16 ? f32_to_bf16(normal(rng)) : f32_to_f16(normal(rng));
    slot = std::make_unique<DeviceMemory>(count * 2);
    check(cudaMemcpy(slot->ptr, host.data(), count * 2, cudaMemcpyHostToDevice), "upload");
  }
  return slot->ptr;
}

template <typename Launch>
void time_with_events(benchmark::State& state, double flops, Launch launch) {
  bench::time_with_events(state, launch);
  state.counters["TFLOP/s"] = benchmark::Counter(flops * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
}

// Times launch_prefill_gemm(g) with the split-K workspace it needs; the counters say which plan ran.
void time_gemm(benchmark::State& state, cuda::PrefillGemm g, double flops) {
  const size_t workspace_bytes = cuda::prefill_gemm_workspace_bytes(g);
  DeviceMemory workspace(std::max<size_t>(workspace_bytes, 256));
  g.workspace = static_cast<float*>(workspace.ptr), g.workspace_bytes = workspace_bytes;
  const size_t image_bytes = cuda::prefill_gemm_weight_image_bytes(g);  // the engine's buffer holds every launch's
  DeviceMemory image(image_bytes);
  g.weight_image_buffer = static_cast<uint8_t*>(image.ptr), g.weight_image_buffer_bytes = image_bytes;
  time_with_events(state, flops, [&] { cuda::launch_prefill_gemm(g, nullptr); });
  const cuda::PrefillGemmPlan plan = cuda::prefill_gemm_plan(g);
  state.counters["splits"] = plan.k_splits;
  state.counters["m_tile"] = plan.m_tile;
  state.counters["n_tile"] = plan.n_tile;
  state.counters["wgmma"] = plan.wgmma;
  state.counters["weight_image"] = plan.weight_image;
}

void bench_gemm(benchmark::State& state, GgmlType type, int64_t n, int64_t k, int64_t m, int m_tile,
                int k_splits = 0, int64_t m_plan = 0, int n_tile = 0, int wgmma = 0, bool swiglu = false,
                int64_t n_plan = 0, int weight_image = 0) {
  DeviceMemory y(size_t(m * n) * 4), y_bf16(size_t(m * n) * 2);
  cuda::PrefillGemm g;
  g.w_type = type, g.w = device_weights(type, n, k), g.n = n, g.k = k;
  if (swiglu) g.w_up = device_weights(type, n, k, 1), g.y_bf16 = static_cast<uint16_t*>(y_bf16.ptr);
  g.x = static_cast<const uint16_t*>(device_random_16bit(size_t(m * k), true, 99)), g.ldx = k, g.m = m;
  g.y = static_cast<float*>(y.ptr), g.ldy = n, g.m_tile = m_tile, g.k_splits = k_splits;
  g.m_plan = m_plan, g.n_plan = n_plan, g.n_tile = n_tile, g.wgmma = wgmma, g.weight_image = weight_image;
  time_gemm(state, g, (swiglu ? 4.0 : 2.0) * double(m) * double(n) * double(k));
}

// Matrices of one type stacked in one launch (q, k and v: PrefillGemm::stacked), planned as the
// engine plans them: for 512 tokens and the q/k/v group's rows (n_plan).
void bench_stacked(benchmark::State& state, GgmlType type, const std::vector<int64_t>& rows, int64_t n_plan,
                   int64_t k, int64_t m) {
  std::vector<std::unique_ptr<DeviceMemory>> y;
  cuda::PrefillGemm g;
  g.w_type = type, g.k = k, g.m = m, g.m_plan = 512, g.n_plan = n_plan;
  g.x = static_cast<const uint16_t*>(device_random_16bit(size_t(m * k), true, 99)), g.ldx = k;
  int64_t n_all = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    y.push_back(std::make_unique<DeviceMemory>(size_t(m * rows[i]) * 4));
    float* out = static_cast<float*>(y.back()->ptr);
    if (i == 0)
      g.w = device_weights(type, rows[i], k), g.n = rows[i], g.y = out, g.ldy = rows[i];
    else
      g.stacked[i - 1] = {device_weights(type, rows[i], k, int(i)), rows[i], out, rows[i], nullptr};
    n_all += rows[i];
  }
  g.n_stacked = int(rows.size()) - 1;
  time_gemm(state, g, 2.0 * double(m) * double(n_all) * double(k));
}

// wgmma, warp_specialized: PrefillAttention's kernel choice (0: the default); items: the
// warp-specialized kernel's heads a CTA (0: prefill_attention_head_group_items').
void bench_attention(benchmark::State& state, int n_head, int n_kv_head, int m, int pos0, int wgmma = 0,
                     int warp_specialized = 0, int items = 0) {
  constexpr int hd = 128;
  const int64_t kv_width = int64_t(n_kv_head) * hd, q_width = int64_t(n_head) * hd;
  DeviceMemory q(size_t(m * q_width) * 4), out(size_t(m * q_width) * 4);
  {
    std::mt19937_64 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> host(size_t(m * q_width));
    for (float& v : host) v = normal(rng);
    check(cudaMemcpy(q.ptr, host.data(), host.size() * 4, cudaMemcpyHostToDevice), "upload q");
  }
  // One sequence whose cache blocks (64 positions) lie in order.
  constexpr int kBlock = 64;
  const std::vector<cuda::PrefillChunk> chunks = {{0, m, pos0, 0}};
  const std::vector<cuda::PrefillTile> tiles = cuda::prefill_attention_tiles(chunks);
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "SM count");
  if (items == 0) items = cuda::prefill_attention_head_group_items(chunks, tiles, n_kv_head, n_head / n_kv_head, sms);
  const std::vector<cuda::PrefillHeadGroup> groups =
      cuda::prefill_attention_head_groups(chunks, tiles, n_head / n_kv_head, items);
  std::vector<int32_t> table((pos0 + m + kBlock - 1) / kBlock);
  for (size_t b = 0; b < table.size(); ++b) table[b] = int32_t(b);
  DeviceMemory d_chunks(chunks.size() * sizeof(cuda::PrefillChunk)), d_tiles(tiles.size() * sizeof(cuda::PrefillTile)),
      d_table(table.size() * 4), d_groups(groups.size() * sizeof(cuda::PrefillHeadGroup));
  check(cudaMemcpy(d_chunks.ptr, chunks.data(), d_chunks.bytes, cudaMemcpyHostToDevice), "upload chunks");
  check(cudaMemcpy(d_tiles.ptr, tiles.data(), d_tiles.bytes, cudaMemcpyHostToDevice), "upload tiles");
  check(cudaMemcpy(d_table.ptr, table.data(), d_table.bytes, cudaMemcpyHostToDevice), "upload table");
  check(cudaMemcpy(d_groups.ptr, groups.data(), d_groups.bytes, cudaMemcpyHostToDevice), "upload head groups");
  cuda::PrefillAttention a;
  a.q = static_cast<const float*>(q.ptr), a.ldq = q_width;
  a.k_cache = static_cast<const uint16_t*>(device_random_16bit(table.size() * kBlock * kv_width, false, 5));
  a.v_cache = static_cast<const uint16_t*>(device_random_16bit(table.size() * kBlock * kv_width, false, 6));
  a.ld_kv = kv_width, a.out = static_cast<float*>(out.ptr), a.ldo = q_width;
  a.chunks = static_cast<const cuda::PrefillChunk*>(d_chunks.ptr);
  a.tiles = static_cast<const cuda::PrefillTile*>(d_tiles.ptr);
  a.n_tiles = int(tiles.size());
  a.tables = static_cast<const int32_t*>(d_table.ptr), a.block_size = kBlock;
  a.n_head = n_head, a.n_kv_head = n_kv_head, a.head_dim = hd;
  a.scale = 1.0f / std::sqrt(float(hd));
  a.head_groups = static_cast<const cuda::PrefillHeadGroup*>(d_groups.ptr);
  a.n_head_groups = int(groups.size()), a.head_group_items = items, a.head_groups_of = n_head / n_kv_head;
  a.wgmma = wgmma, a.warp_specialized = warp_specialized;
  double keys = 0;  // causal: token i sees pos0 + i + 1 positions
  for (int i = 0; i < m; ++i) keys += pos0 + i + 1;
  time_with_events(state, 4.0 * hd * n_head * keys, [&] { cuda::launch_prefill_attention(a, nullptr); });
}

int register_all() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) return 0;
  auto add = [](const std::string& name, auto fn) {
    benchmark::RegisterBenchmark(name.c_str(), fn)->UseManualTime()->Iterations(20)->Unit(benchmark::kMicrosecond);
  };
  const std::pair<const char*, const char*> models[] = {{"7B", "qwen2.5-7b"}, {"14B", "qwen2.5-14b"}};
  for (const auto& [label, preset_name] : models) {
    const synth::Preset& preset = synth::find_preset(preset_name);
    for (const PromptGemm& g : prompt_gemms(preset))
      for (int64_t m : {512, 4096}) {
        const std::string name = std::string("gemm/") + label + "/" + g.matrix + "/" + type_traits(g.type).name +
                                 "/M" + std::to_string(m);
        const auto run = [=](int m_tile, int k_splits) {
          return [=](benchmark::State& s) {
            bench_gemm(s, g.type, g.n, g.k, m, m_tile, k_splits);
            s.counters["per_forward"] = g.per_forward;
          };
        };
        add(name, run(0, 0));
        add(name + "/mmasync", [=](benchmark::State& s) {  // the mma.sync kernel (no warpgroup MMA)
          bench_gemm(s, g.type, g.n, g.k, m, 0, 0, 0, 0, -1);
          s.counters["per_forward"] = g.per_forward;
        });
        add(name + "/nosplit", run(0, 1));
        if (m == 512 && g.n <= 8192)  // the split sweep: small-N matrices at one ubatch
          for (int splits : {2, 3, 4, 6, 8}) add(name + "/split" + std::to_string(splits), run(0, splits));
        if (m == 512 && std::string(label) == "7B" && (g.matrix == "attn_q" || g.matrix == "ffn_gate"))
          for (int tile : {64, 128}) add(name + "/tile" + std::to_string(tile), run(tile, 1));
        if (std::string(label) == "7B") {  // m-tiles of 128 and 256 tokens under the automatic K split
          add(name + "/mtile128", run(128, 0));
          add(name + "/mtile256", run(256, 0));
          if (m == 512 && g.n <= 8192)
            for (int splits : {1, 2, 3, 4, 6, 8})
              add(name + "/mtile256/split" + std::to_string(splits), run(256, splits));
        }
      }
    for (int pos0 : {0, 4096, 16384}) {
      const std::string name = std::string("attention/") + label + "/M512/d" + std::to_string(pos0);
      const int n_head = preset.n_head, n_kv = preset.n_head_kv;
      add(name, [=](benchmark::State& s) { bench_attention(s, n_head, n_kv, 512, pos0); });
      add(name + "/onehead", [=](benchmark::State& s) { bench_attention(s, n_head, n_kv, 512, pos0, 0, -1); });
      add(name + "/mmasync", [=](benchmark::State& s) { bench_attention(s, n_head, n_kv, 512, pos0, -1, -1); });
      for (int items : {2, 3})
        add(name + "/heads" + std::to_string(items),
            [=](benchmark::State& s) { bench_attention(s, n_head, n_kv, 512, pos0, 0, 1, items); });
    }
  }
  // The other weight types the GEMM serves, at the 7B's gate and down shapes (those the mix
  // already has are above).
  const std::vector<PromptGemm> mix7b = prompt_gemms(synth::find_preset("qwen2.5-7b"));
  const auto gate =
      std::find_if(mix7b.begin(), mix7b.end(), [](const PromptGemm& g) { return g.matrix == "ffn_gate"; });
  for (GgmlType t : {GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::F16})
    for (const std::string matrix : {"ffn_gate", "ffn_down"}) {
      const auto same = std::find_if(mix7b.begin(), mix7b.end(), [&](const PromptGemm& g) { return g.matrix == matrix; });
      if (std::any_of(mix7b.begin(), mix7b.end(), [&](const PromptGemm& g) { return g.matrix == matrix && g.type == t; }))
        continue;
      add("gemm/7B/" + matrix + "/" + type_traits(t).name + "/M512",
          [t, n = same->n, k = same->k](benchmark::State& s) { bench_gemm(s, t, n, k, 512, 0); });
    }
  // Gate, up and the swiglu in one GEMM (MINFER_NO_GEMM_SWIGLU=1 runs ffn_gate, ffn_up and the
  // swiglu kernel instead): gemm/7B/ffn_gate_up_swiglu/<type>/M<m>.
  for (int64_t m : {70, 512, 4096}) {
    add("gemm/7B/ffn_gate_up_swiglu/" + std::string(type_traits(gate->type).name) + "/M" + std::to_string(m),
        [t = gate->type, n = gate->n, k = gate->k, m](benchmark::State& s) {
          bench_gemm(s, t, n, k, m, 0, 0, 512, 0, 0, true);
        });
  }
  // q, k and v as the engine runs them: the runs of one type stacked in one launch, each planned
  // for the three's rows (MINFER_NO_FUSED_QKV=1 runs them one by one, planned alike):
  // gemm/7B/attn_qkv_stacked/q4_K/M<m> where v is q4_K; where v is q6_K, .../attn_qk_stacked/q4_K
  // and gemm/7B/attn_v/q6_K/M<m>/planqkv.
  {
    const auto q = std::find_if(mix7b.begin(), mix7b.end(), [](const PromptGemm& g) { return g.matrix == "attn_q"; });
    const auto kk = std::find_if(mix7b.begin(), mix7b.end(), [](const PromptGemm& g) { return g.matrix == "attn_k"; });
    const int64_t q_rows = q->n, kv_rows = kk->n, group = q_rows + 2 * kv_rows, k = q->k;
    for (int64_t m : {70, 512, 4096}) {
      const std::string tail = "/M" + std::to_string(m);
      add("gemm/7B/attn_qkv_stacked/q4_K" + tail, [=](benchmark::State& s) {
        bench_stacked(s, GgmlType::Q4_K, {q_rows, kv_rows, kv_rows}, group, k, m);
      });
      add("gemm/7B/attn_qk_stacked/q4_K" + tail, [=](benchmark::State& s) {
        bench_stacked(s, GgmlType::Q4_K, {q_rows, kv_rows}, group, k, m);
      });
      add("gemm/7B/attn_v/q6_K" + tail + "/planqkv", [=](benchmark::State& s) {
        bench_stacked(s, GgmlType::Q6_K, {kv_rows}, group, k, m);
      });
    }
  }
  // Prompts as the engine runs them (the K split planned for 512 tokens and the group's rows): the automatic n-tile
  // and each forced width, per 7B matrix (the sweep plan_n_tile was fitted to).
  for (const PromptGemm& g : mix7b)
    for (int64_t m : {16, 70, 128, 256, 512, 4096})
      for (int n_tile : {0, 128, 64, 32}) {
        if (m > 512 && n_tile != 0) continue;  // long prompts: the engine's plan only
        const std::string name = "gemm/7B/" + g.matrix + "/" + type_traits(g.type).name + "/M" + std::to_string(m) +
                                 "/plan512" + (n_tile ? "/ntile" + std::to_string(n_tile) : "");
        add(name, [=](benchmark::State& s) {
          bench_gemm(s, g.type, g.n, g.k, m, 0, 0, 512, n_tile, 0, false, g.group_rows);
          s.counters["per_forward"] = g.per_forward;
        });
      }
  // The weight image forced on and off (PrefillGemm::weight_image) at the engine's plan, its pass
  // included: gemm/7B/<matrix>/<type>/M<m>/plan512/image and .../noimage,
  // gemm/7B/ffn_gate_up_swiglu/<type>/M<m>/image and .../noimage.
  for (int64_t m : {384, 512, 768, 1063, 2048, 4096})
    for (const int image : {1, -1}) {
      const std::string tokens = "/M" + std::to_string(m), which = image == 1 ? "/image" : "/noimage";
      for (const PromptGemm& g : mix7b)
        add("gemm/7B/" + g.matrix + "/" + type_traits(g.type).name + tokens + "/plan512" + which,
            [=](benchmark::State& s) {
              bench_gemm(s, g.type, g.n, g.k, m, 0, 0, 512, 0, 0, false, g.group_rows, image);
              s.counters["per_forward"] = g.per_forward;
            });
      add("gemm/7B/ffn_gate_up_swiglu/" + std::string(type_traits(gate->type).name) + tokens + which,
          [t = gate->type, n = gate->n, k = gate->k, m, image](benchmark::State& s) {
            bench_gemm(s, t, n, k, m, 0, 0, 512, 0, 0, true, 0, image);
          });
    }
  add("attention/7B/M4096/d0", [](benchmark::State& s) { bench_attention(s, 28, 4, 4096, 0); });
  return 0;
}
const int registered = register_all();

}  // namespace
}  // namespace minfer
#endif
