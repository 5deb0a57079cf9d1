// Prefill kernels against float64 CPU oracles: the bf16 activation plane (bitwise against the host
// conversion), the GEMM for every weight type (dequantize_row + float64 dot), and causal flash
// attention with GQA and pos0 > 0 (naive float64 softmax attention).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "backend/cuda/kernels.h"
#include "backend/cuda/prefill.h"
#include "gpu_support.h"
#include "model_gemms.h"
#include "prefill_test_data.h"
#include "quant/quant.h"
#include "../support.h"
#include "util/error.h"
#include "util/half.h"

namespace minfer {
namespace {

using cuda::PrefillAttention;
using cuda::PrefillGemm;
using cuda::PrefillGemmPlan;

void check(cudaError_t e, const char* what) { ASSERT_EQ(e, cudaSuccess) << what << ": " << cudaGetErrorString(e); }

using test::DeviceBuffer;
using test::weights_image;

TEST(PrefillActivation, Bf16PlaneMatchesHostRounding) {
  MINFER_REQUIRE_GPU();
  std::vector<float> x = test::random_normal(4099, 3.0f, 11);
  x[0] = 0.0f, x[1] = -0.0f, x[2] = std::numeric_limits<float>::infinity();
  x[3] = std::numeric_limits<float>::quiet_NaN(), x[4] = 1e-40f, x[5] = 3.3895e38f;
  DeviceBuffer<float> dx(x);
  DeviceBuffer<uint16_t> dy(x.size());
  cuda::launch_prefill_activation_bf16(dx.get(), dy.get(), int64_t(x.size()), nullptr);
  check(cudaDeviceSynchronize(), "activation_bf16");
  const std::vector<uint16_t> y = dy.download();
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i])) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(y[i]))) << i;
    } else {
      EXPECT_EQ(y[i], f32_to_bf16(x[i])) << "element " << i << " = " << x[i];
    }
  }
}

struct GemmCase {
  GgmlType type;
  int64_t m, n, k;
  int m_tile = 0;
  bool bias = false, residual = false;
  int64_t x_pad = 0, y_pad = 0;  // extra row stride
  int k_splits = 0;  // 0: automatic
  bool expect_split = false;  // the plan must split K (checks that the case tests split-K)
  int n_tile = 0;  // 0: automatic
  int wgmma = 0;   // 0: automatic (warpgroup MMA on sm_90), -1: mma.sync, 1: warpgroup MMA
  int64_t m_plan = 0;    // the token count the K split is planned for (the engine: 512)
  int64_t n_plan = 0;    // the weight rows it is planned for (the engine: its q/k/v or gate/up group's)
  int64_t col_step = 1;  // check every col_step-th output column (and the last): model-size shapes
};

// Runs one GEMM and checks every output against the float64 dot of dequantize_row(W) and the
// unrounded f32 activations. Each product carries one bf16 rounding of x and of w (<= 2^-9
// relative each), so |err| <= 2^-8 * sum|x w|; the test allows 2^-7 (the rest: f32 accumulation).
void run_gemm_case(const GemmCase& c, uint64_t salt) {
  const int64_t ldx = c.k + c.x_pad, ldy = c.n + c.y_pad;
  const std::vector<uint8_t> w = test::random_weight_rows(c.type, c.n, c.k, test::seed() + salt);
  const std::vector<float> x = test::random_normal(size_t(c.m * ldx), 1.0f, salt + 1);
  const std::vector<float> bias = test::random_normal(size_t(c.n), 1.0f, salt + 2);
  const std::vector<float> residual = test::random_normal(size_t(c.m * ldy), 1.0f, salt + 3);

  DeviceBuffer<uint8_t> dw(weights_image(c.type, c.k, w));
  DeviceBuffer<float> dx_f32(x);
  DeviceBuffer<uint16_t> dx(x.size());
  DeviceBuffer<float> dbias(bias);
  DeviceBuffer<float> dy(residual);  // in place: y = residual + X W^T when residual is on
  if (!c.residual) dy.fill_bytes(0xFF);  // NaN poison: every output must be written
  cuda::launch_prefill_activation_bf16(dx_f32.get(), dx.get(), int64_t(x.size()), nullptr);

  PrefillGemm g;
  g.w_type = c.type, g.w = dw.get(), g.n = c.n, g.k = c.k;
  g.x = dx.get(), g.ldx = ldx, g.m = c.m, g.y = dy.get(), g.ldy = ldy;
  g.bias = c.bias ? dbias.get() : nullptr;
  g.residual = c.residual ? dy.get() : nullptr;
  g.m_tile = c.m_tile;
  g.k_splits = c.k_splits;
  g.n_tile = c.n_tile;
  g.wgmma = c.wgmma;
  g.m_plan = c.m_plan;
  g.n_plan = c.n_plan;
  if (c.expect_split) EXPECT_GT(cuda::prefill_gemm_plan(g).k_splits, 1) << "m=" << c.m << " n=" << c.n << " k=" << c.k;
  DeviceBuffer<float> workspace(std::max<size_t>(cuda::prefill_gemm_workspace_bytes(g) / 4, 1));
  g.workspace = workspace.get(), g.workspace_bytes = workspace.size() * 4;
  cuda::launch_prefill_gemm(g, nullptr);
  check(cudaGetLastError(), "launch_prefill_gemm");
  check(cudaDeviceSynchronize(), "prefill GEMM");
  const std::vector<float> y = dy.download();

  std::vector<float> w_row(size_t(c.k));
  const size_t stride = row_bytes(c.type, c.k);
  int failures = 0;
  // Columns 0, col_step, 2 col_step, ... and the last one.
  const auto next_col = [&](int64_t col) { return col == c.n - 1 ? c.n : std::min(col + c.col_step, c.n - 1); };
  for (int64_t col = 0; col < c.n; col = next_col(col)) {
    dequantize_row(c.type, w.data() + stride * size_t(col), w_row.data(), c.k);
    for (int64_t row = 0; row < c.m; ++row) {
      double dot = 0, magnitude = 0;
      for (int64_t i = 0; i < c.k; ++i) {
        const double p = double(x[size_t(row * ldx + i)]) * double(w_row[size_t(i)]);
        dot += p;
        magnitude += std::fabs(p);
      }
      double expect = dot + (c.bias ? bias[size_t(col)] : 0.0);
      if (c.residual) expect += residual[size_t(row * ldy + col)];
      const double got = y[size_t(row * ldy + col)];
      const double tol = std::ldexp(magnitude, -7) + 1e-6 * (1 + std::fabs(expect));
      if (!(std::fabs(got - expect) <= tol) && failures++ < 5)
        ADD_FAILURE() << type_traits(c.type).name << " m=" << c.m << " n=" << c.n << " k=" << c.k
                      << ": y[" << row << "][" << col << "] = " << got << ", expected " << expect
                      << " (tol " << tol << ")";
    }
  }
  // Stride padding columns are never written (they keep the residual or the NaN poison).
  for (int64_t row = 0; row < c.m && c.y_pad > 0; ++row)
    for (int64_t col = c.n; col < ldy; ++col) {
      const float before = residual[size_t(row * ldy + col)];
      const float after = y[size_t(row * ldy + col)];
      if (c.residual) EXPECT_EQ(after, before);
      else EXPECT_TRUE(std::isnan(after));
    }
  EXPECT_EQ(failures, 0);
}

class PrefillGemmTypes : public testing::TestWithParam<GgmlType> {};

TEST_P(PrefillGemmTypes, MatchesFloat64Reference) {
  MINFER_REQUIRE_GPU();
  uint64_t salt = 100 * uint64_t(GetParam());
  // n = 264: two full 128-row weight tiles and a partial one; k = 512: two K super-blocks (the
  // second q6_K block starts 2 bytes off a word boundary, as do odd q8_0 blocks).
  for (int64_t m : {1, 7, 100, 512}) run_gemm_case({GetParam(), m, 264, 512}, salt += 10);
  run_gemm_case({GetParam(), 200, 136, 768, 128}, salt += 10);  // the 128-row m-tile
  // Narrow n-tiles (2 or 4 threads a weight row), single pass and split, both m-tiles.
  for (const int n_tile : {32, 64}) {
    run_gemm_case({GetParam(), 70, 264, 512, 0, false, false, 0, 0, 1, false, n_tile}, salt += 10);
    run_gemm_case({GetParam(), 130, 264, 512, 128, false, false, 0, 0, 3, true, n_tile}, salt += 10);
  }
  // Both multiply kernels whichever the device picks by default: mma.sync everywhere, warpgroup
  // MMA on sm_90 (every n-tile, both m-tiles, split and not).
  for (const int n_tile : {32, 64, 128}) {
    run_gemm_case({GetParam(), 100, 264, 512, 0, false, false, 0, 0, 1, false, n_tile, -1}, salt += 10);
    if (!cuda::prefill_gemm_device_has_wgmma()) continue;
    run_gemm_case({GetParam(), 100, 264, 512, 64, false, false, 0, 0, 1, false, n_tile, 1}, salt += 10);
    run_gemm_case({GetParam(), 200, 264, 512, 128, true, true, 0, 2, 3, true, n_tile, 1}, salt += 10);
  }
  // 256-token tiles (two warpgroups sharing the weight tile): a partial second m-tile, single pass
  // with bias and residual, and split-K.
  if (cuda::prefill_gemm_device_has_wgmma()) {
    run_gemm_case({GetParam(), 300, 264, 512, 256, true, true, 0, 0, 1, false, 0, 1}, salt += 10);
    run_gemm_case({GetParam(), 40, 264, 768, 256, false, false, 0, 0, 3, true, 0, 1}, salt += 10);
  }
}

// The tiles and the multiply kernel decide which CTA, thread and instruction compute an output,
// never its sums: every n-tile and m-tile, with mma.sync and (sm_90) warpgroup MMA (and its
// 256-token tiles), gives the bits of 128 x 128 mma.sync tiles, with and without split-K (so the
// engine may pick them per step, and MINFER_NO_WGMMA_GEMM=1, MINFER_NO_NARROW_GEMM_TILES=1 and
// MINFER_NO_WIDE_GEMM_TILES=1 restore the other paths bit for bit).
TEST_P(PrefillGemmTypes, TileWidthAndMultiplyKernelKeepTheBits) {
  MINFER_REQUIRE_GPU();
  const GgmlType type = GetParam();
  const int64_t n = 264, k = 768;  // n: 8.25 tiles of 32, a partial tile at every width
  const std::vector<uint8_t> w = test::random_weight_rows(type, n, k, test::seed() + 9300 + uint64_t(type));
  for (const int64_t m : {9, 70}) {
    const std::vector<float> x = test::random_normal(size_t(m * k), 1.0f, 9301 + uint64_t(m));
    std::vector<uint16_t> x_bf16(x.size());
    for (size_t i = 0; i < x.size(); ++i) x_bf16[i] = f32_to_bf16(x[i]);
    const std::vector<float> bias = test::random_normal(size_t(n), 1.0f, 9302);
    DeviceBuffer<uint8_t> dw(weights_image(type, k, w));
    DeviceBuffer<uint16_t> dx(x_bf16);
    DeviceBuffer<float> dbias(bias), dy(size_t(m * n)), workspace(cuda::kPrefillGemmWorkspaceBytes / 4);
    PrefillGemm g;
    g.w_type = type, g.w = dw.get(), g.n = n, g.k = k, g.x = dx.get(), g.ldx = k, g.m = m;
    g.y = dy.get(), g.ldy = n, g.bias = dbias.get();
    g.workspace = workspace.get(), g.workspace_bytes = cuda::kPrefillGemmWorkspaceBytes;
    for (const int k_splits : {1, 5}) {
      const auto run = [&](int m_tile, int n_tile, int wgmma) {
        g.k_splits = k_splits, g.m_tile = m_tile, g.n_tile = n_tile, g.wgmma = wgmma;
        EXPECT_EQ(cuda::prefill_gemm_plan(g).n_tile, n_tile);
        EXPECT_EQ(cuda::prefill_gemm_plan(g).wgmma, wgmma == 1);
        dy.fill_bytes(0xFF);
        cuda::launch_prefill_gemm(g, nullptr);
        check(cudaDeviceSynchronize(), "prefill GEMM");
        return dy.download();
      };
      const std::vector<float> reference = run(128, 128, -1);
      for (const int wgmma : {-1, 1}) {
        if (wgmma == 1 && !cuda::prefill_gemm_device_has_wgmma()) continue;
        for (const int m_tile : {64, 128, 256})
          for (const int n_tile : {128, 64, 32}) {
            if ((wgmma == -1 && m_tile == 128 && n_tile == 128) || (m_tile == 256 && (wgmma == -1 || n_tile != 128)))
              continue;
            const std::vector<float> y = run(m_tile, n_tile, wgmma);
            EXPECT_EQ(std::memcmp(y.data(), reference.data(), y.size() * sizeof(float)), 0)
                << type_traits(type).name << " m=" << m << " k_splits=" << k_splits << " m_tile=" << m_tile
                << " n_tile=" << n_tile << " wgmma=" << wgmma;
          }
      }
    }
  }
}

// Every prompt GEMM of the 7B and 14B forwards at its real shape and type (the table bench_prefill
// times), as the engine plans it (K split for 512 tokens): a short prompt, and 300 tokens (a
// 256-token tile and a partial one where warpgroup MMA runs), every 61st output column checked.
TEST(PrefillGemm, ModelShapesMatchFloat64Reference) {
  MINFER_REQUIRE_GPU();
  uint64_t salt = 9600;
  for (const char* preset : {"qwen2.5-7b", "qwen2.5-14b"})
    for (const test::PromptGemm& pg : test::prompt_gemms(synth::find_preset(preset)))
      for (const int64_t m : {5, 300}) {
        SCOPED_TRACE(std::string(preset) + " " + pg.matrix + " " + type_traits(pg.type).name + " m=" + std::to_string(m));
        GemmCase c{pg.type, m, pg.n, pg.k};
        c.m_plan = 512;
        c.n_plan = pg.group_rows;
        c.col_step = 61;
        run_gemm_case(c, salt += 10);
      }
}

// The SwiGLU epilogue (gate and up rows interleaved in one weight tile, silu(gate) * up written
// with its bf16 plane) gives the bits of the gate GEMM and the up GEMM, each in one pass, followed
// by the swiglu kernel and the standalone conversion — for every m-tile and multiply kernel, and a
// partial last tile of 64 output columns (n = 264).
TEST_P(PrefillGemmTypes, SwigluEpilogueGivesTheSeparateGemmsBits) {
  MINFER_REQUIRE_GPU();
  const GgmlType type = GetParam();
  const int64_t n = 264, k = 768;
  const std::vector<uint8_t> w_gate = test::random_weight_rows(type, n, k, test::seed() + 9400 + uint64_t(type));
  const std::vector<uint8_t> w_up = test::random_weight_rows(type, n, k, test::seed() + 9500 + uint64_t(type));
  DeviceBuffer<uint8_t> dgate(weights_image(type, k, w_gate)), dup(weights_image(type, k, w_up));
  for (const int64_t m : {9, 70, 300}) {
    const std::vector<float> x = test::random_normal(size_t(m * k), 1.0f, 9401 + uint64_t(m));
    std::vector<uint16_t> x_bf16(x.size());
    for (size_t i = 0; i < x.size(); ++i) x_bf16[i] = f32_to_bf16(x[i]);
    DeviceBuffer<uint16_t> dx(x_bf16), ref_bf16(size_t(m * n)), y_bf16(size_t(m * n));
    DeviceBuffer<float> yg(size_t(m * n)), yu(size_t(m * n)), ref(size_t(m * n)), y(size_t(m * n));
    PrefillGemm g;
    g.w_type = type, g.n = n, g.k = k, g.x = dx.get(), g.ldx = k, g.m = m, g.ldy = n, g.k_splits = 1;
    g.w = dgate.get(), g.y = yg.get();
    cuda::launch_prefill_gemm(g, nullptr);
    g.w = dup.get(), g.y = yu.get();
    cuda::launch_prefill_gemm(g, nullptr);
    cuda::launch_swiglu(yg.get(), yu.get(), ref.get(), int(m), int(n), {}, 0, nullptr, ref_bf16.get());
    check(cudaDeviceSynchronize(), "separate GEMMs and swiglu");
    const std::vector<float> want = ref.download();
    const std::vector<uint16_t> want_bf16 = ref_bf16.download();
    g.w = dgate.get(), g.w_up = dup.get(), g.y = y.get(), g.y_bf16 = y_bf16.get();
    for (const int wgmma : {-1, 1}) {
      if (wgmma == 1 && !cuda::prefill_gemm_device_has_wgmma()) continue;
      for (const int m_tile : {64, 128, 256}) {
        if (m_tile == 256 && wgmma == -1) continue;
        g.wgmma = wgmma, g.m_tile = m_tile;
        y.fill_bytes(0xFF);
        y_bf16.fill_bytes(0xFF);
        cuda::launch_prefill_gemm(g, nullptr);
        check(cudaDeviceSynchronize(), "SwiGLU GEMM");
        const std::vector<float> got = y.download();
        const std::vector<uint16_t> got_bf16 = y_bf16.download();
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
            << type_traits(type).name << " m=" << m << " m_tile=" << m_tile << " wgmma=" << wgmma;
        EXPECT_EQ(std::memcmp(got_bf16.data(), want_bf16.data(), got_bf16.size() * 2), 0)
            << type_traits(type).name << " m=" << m << " m_tile=" << m_tile << " wgmma=" << wgmma;
      }
    }
  }
}

// Stacked matrices (q, k, v of one input in one launch, each with its bias into its own output
// rows of its own stride): every output has the bits of its matrix's own launch with the same K
// split — forced (1, 3 slices) or planned for the stack's columns (n_plan) — for every m-tile,
// n-tile and multiply kernel, and a last matrix of a partial n-tile (136 rows).
TEST_P(PrefillGemmTypes, StackedMatricesGiveTheirOwnLaunchesBits) {
  MINFER_REQUIRE_GPU();
  const GgmlType type = GetParam();
  const int64_t k = 512, rows[3] = {256, 128, 136}, n_all = 520;
  std::deque<DeviceBuffer<uint8_t>> w;
  std::deque<DeviceBuffer<float>> bias;
  for (int i = 0; i < 3; ++i) {
    w.emplace_back(weights_image(type, k, test::random_weight_rows(type, rows[i], k, test::seed() + 9600 + 10 * uint64_t(type) + uint64_t(i))));
    bias.emplace_back(test::random_normal(size_t(rows[i]), 0.5f, 9610 + uint64_t(i)));
  }
  for (const int64_t m : {9, 300}) {
    const std::vector<float> x = test::random_normal(size_t(m * k), 1.0f, 9620 + uint64_t(m));
    std::vector<uint16_t> x_bf16(x.size());
    for (size_t i = 0; i < x.size(); ++i) x_bf16[i] = f32_to_bf16(x[i]);
    DeviceBuffer<uint16_t> dx(x_bf16);
    const int64_t ldy[3] = {rows[0] + 8, rows[1], rows[2] + 2};
    std::deque<DeviceBuffer<float>> y, ref;
    for (int i = 0; i < 3; ++i) y.emplace_back(size_t(m * ldy[i])), ref.emplace_back(size_t(m * ldy[i]));
    DeviceBuffer<float> workspace(size_t(8 * m * n_all));
    PrefillGemm one;
    one.w_type = type, one.k = k, one.x = dx.get(), one.ldx = k, one.m = m;
    one.workspace = workspace.get(), one.workspace_bytes = workspace.size() * sizeof(float);
    for (const int k_splits : {1, 3, 0}) {
      one.k_splits = k_splits, one.n_plan = k_splits == 0 ? n_all : 0;
      std::vector<std::vector<float>> want;
      for (int i = 0; i < 3; ++i) {
        PrefillGemm g = one;
        g.w = w[size_t(i)].get(), g.n = rows[i], g.y = ref[size_t(i)].get(), g.ldy = ldy[i], g.bias = bias[size_t(i)].get();
        ref[size_t(i)].fill_bytes(0xFF);
        cuda::launch_prefill_gemm(g, nullptr);
        check(cudaDeviceSynchronize(), "separate GEMM");
        want.push_back(ref[size_t(i)].download());
      }
      PrefillGemm g = one;
      g.w = w[0].get(), g.n = rows[0], g.y = y[0].get(), g.ldy = ldy[0], g.bias = bias[0].get();
      for (int i = 1; i < 3; ++i)
        g.stacked[size_t(i - 1)] = {w[size_t(i)].get(), rows[i], y[size_t(i)].get(), ldy[i], bias[size_t(i)].get()};
      g.n_stacked = 2;
      for (const int wgmma : {-1, 1}) {
        if (wgmma == 1 && !cuda::prefill_gemm_device_has_wgmma()) continue;
        for (const int m_tile : {64, 128, 256})
          for (const int n_tile : {0, 64}) {
            if (m_tile == 256 && (wgmma == -1 || n_tile == 64)) continue;
            g.wgmma = wgmma, g.m_tile = m_tile, g.n_tile = n_tile;
            for (auto& out : y) out.fill_bytes(0xFF);
            cuda::launch_prefill_gemm(g, nullptr);
            check(cudaDeviceSynchronize(), "stacked GEMM");
            for (int i = 0; i < 3; ++i) {
              const std::vector<float> got = y[size_t(i)].download();
              EXPECT_EQ(std::memcmp(got.data(), want[size_t(i)].data(), got.size() * sizeof(float)), 0)
                  << type_traits(type).name << " m=" << m << " matrix " << i << " k_splits=" << k_splits
                  << " m_tile=" << m_tile << " n_tile=" << n_tile << " wgmma=" << wgmma;
            }
          }
      }
    }
  }
}

// The warp-specialized 256-token kernel (two producer warpgroups, two consumers) gives the bits of
// the kernel whose warpgroups both dequantize and multiply: single pass with bias and residual,
// 3 K slices (7, 7 and 6 steps: the producers' step pairs end on an odd step too), the SwiGLU
// epilogue; a partial last m-tile and n-tile (m = 300, n = 264). Persistent: one CTA a tile here
// (fewer tiles than SMs), and two CTAs walking all 6 or 18 tiles, so the ring's stages and phases
// carry from one tile to the next and the producers fill a tile while the consumers store one.
// The activation tiles by the tensor memory accelerator and by cp.async, both against the reference.
TEST_P(PrefillGemmTypes, WarpSpecializedGivesTheSameBits) {
  MINFER_REQUIRE_GPU();
  if (!cuda::prefill_gemm_device_has_wgmma()) GTEST_SKIP() << "256-token tiles need warpgroup MMA";
  const GgmlType type = GetParam();
  const int64_t m = 300, n = 264, k = 1280;
  DeviceBuffer<uint8_t> w(weights_image(type, k, test::random_weight_rows(type, n, k, test::seed() + 9800 + uint64_t(type))));
  DeviceBuffer<uint8_t> w_up(weights_image(type, k, test::random_weight_rows(type, n, k, test::seed() + 9801 + uint64_t(type))));
  DeviceBuffer<float> bias(test::random_normal(size_t(n), 0.5f, 9802)), residual(test::random_normal(size_t(m * n), 1.0f, 9803));
  const std::vector<float> x = test::random_normal(size_t(m * k), 1.0f, 9804);
  std::vector<uint16_t> x_bf16(x.size());
  for (size_t i = 0; i < x.size(); ++i) x_bf16[i] = f32_to_bf16(x[i]);
  DeviceBuffer<uint16_t> dx(x_bf16), plane_ref(size_t(m * n)), plane(size_t(m * n));
  DeviceBuffer<float> y_ref(size_t(m * n)), y(size_t(m * n)), workspace(size_t(3 * m * n));
  for (const char* what : {"single pass", "split-K", "SwiGLU"}) {
    PrefillGemm g;
    g.w_type = type, g.w = w.get(), g.n = n, g.k = k, g.x = dx.get(), g.ldx = k, g.m = m, g.ldy = n;
    g.m_tile = 256, g.wgmma = 1, g.workspace = workspace.get(), g.workspace_bytes = workspace.size() * sizeof(float);
    if (std::string(what) == "SwiGLU") {
      g.w_up = w_up.get(), g.k_splits = 1;
    } else {
      g.bias = bias.get(), g.residual = residual.get(), g.k_splits = std::string(what) == "split-K" ? 3 : 1;
    }
    DeviceBuffer<uint8_t> image(cuda::prefill_gemm_weight_image_bytes(g));
    const auto run = [&](int ws, int ctas, int tma, int weight_image, DeviceBuffer<float>& out,
                         DeviceBuffer<uint16_t>& out_plane) {
      g.warp_specialized = ws, g.ctas = ctas, g.tma = tma, g.y = out.get();
      g.weight_image = weight_image, g.weight_image_buffer = image.get(), g.weight_image_buffer_bytes = image.size();
      if (g.w_up) g.y_bf16 = out_plane.get();
      out.fill_bytes(0xFF);
      out_plane.fill_bytes(0xFF);
      image.fill_bytes(0xFF);
      const cuda::PrefillGemmPlan plan = cuda::prefill_gemm_plan(g);
      ASSERT_EQ(plan.warp_specialized, ws == 1) << what;
      ASSERT_EQ(plan.tma, ws == 1 && tma == 1) << what;
      ASSERT_EQ(plan.weight_image, ws == 1 && weight_image == 1) << what;
      cuda::launch_prefill_gemm(g, nullptr);
      check(cudaDeviceSynchronize(), what);
    };
    run(-1, 0, 0, -1, y_ref, plane_ref);
    const std::vector<float> a = y_ref.download();
    const std::vector<uint16_t> pa = plane_ref.download();
    for (const int ctas : {0, 2})
      for (const int tma : {1, -1})
        for (const int weight_image : {-1, 1}) {
          run(1, ctas, tma, weight_image, y, plane);
          const std::vector<float> b = y.download();
          const std::vector<uint16_t> pb = plane.download();
          const std::string where = std::string(type_traits(type).name) + " " + what + " ctas " +
                                    std::to_string(ctas) + (tma == 1 ? " tma" : " cp.async") +
                                    (weight_image == 1 ? " weight image" : "");
          EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << where;
          EXPECT_EQ(std::memcmp(pa.data(), pb.data(), pa.size() * 2), 0) << where;
        }
  }
}

// Split-K: forced uneven slices (k = 512 is 8 K steps: 3 slices of 3, 3, 2; 8 slices of one step)
// and the automatic choice on a large K (7B ffn_down's 18944), all against the same reference.
TEST_P(PrefillGemmTypes, SplitKMatchesFloat64Reference) {
  MINFER_REQUIRE_GPU();
  uint64_t salt = 100 * uint64_t(GetParam()) + 5;
  for (int64_t m : {1, 7, 100, 512})
    run_gemm_case({GetParam(), m, 264, 512, 0, false, false, 0, 0, 3, true}, salt += 10);
  run_gemm_case({GetParam(), 100, 136, 512, 64, false, false, 0, 0, 8, true}, salt += 10);
  run_gemm_case({GetParam(), 100, 136, 18944, 0, false, false, 0, 0, 0, true}, salt += 10);
}

INSTANTIATE_TEST_SUITE_P(AllWeightTypes, PrefillGemmTypes,
                         testing::Values(GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0,
                                         GgmlType::F16, GgmlType::BF16, GgmlType::F32),
                         [](const testing::TestParamInfo<GgmlType>& info) {
                           return std::string(type_traits(info.param).name);
                         });

TEST(PrefillGemm, BiasResidualAndStrides) {
  MINFER_REQUIRE_GPU();
  run_gemm_case({GgmlType::Q4_K, 37, 130, 256, 64, true, true, 24, 6}, 7001);
  run_gemm_case({GgmlType::Q6_K, 130, 256, 256, 128, true, false, 8, 2}, 7002);
  run_gemm_case({GgmlType::Q8_0, 65, 66, 320, 0, false, true, 0, 0}, 7003);
  // The split-K reduce applies bias and the in-place residual, and keeps the padding columns.
  run_gemm_case({GgmlType::Q4_K, 37, 130, 1024, 0, true, true, 24, 6, 4, true}, 7004);
  run_gemm_case({GgmlType::Q8_0, 65, 66, 320, 128, true, false, 0, 2, 5, true}, 7005);
}

// Sets an environment variable for one scope, then restores what the caller had.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) previous_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (previous_) setenv(name_, previous_->c_str(), 1);
    else unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> previous_;
};

// The weight image is the automatic choice from its token count on, where the buffer holds it and
// MINFER_NO_GEMM_WEIGHT_IMAGE is not set; a forced image without a buffer is an error.
TEST(PrefillGemm, WeightImageFollowsTokensAndBuffer) {
  MINFER_REQUIRE_GPU();
  if (!cuda::prefill_gemm_device_has_wgmma()) GTEST_SKIP() << "the weight image serves warp-specialized tiles";
  const ScopedEnv image_on("MINFER_NO_GEMM_WEIGHT_IMAGE", "0");  // whatever the caller's environment says
  PrefillGemm g;
  g.w_type = GgmlType::Q4_K, g.w = reinterpret_cast<const void*>(uintptr_t(256)), g.n = 18944, g.k = 3584;
  g.x = reinterpret_cast<const uint16_t*>(uintptr_t(256)), g.ldx = g.k, g.ldy = g.n;
  g.y = reinterpret_cast<float*>(uintptr_t(256)), g.m_plan = 512, g.sm_count = 132;
  const size_t bytes = cuda::prefill_gemm_weight_image_bytes(g);
  EXPECT_EQ(bytes, size_t(18944 / 128) * size_t(3584 / 64) * 16384);
  g.weight_image_buffer = reinterpret_cast<uint8_t*>(uintptr_t(256)), g.weight_image_buffer_bytes = bytes;
  g.m = cuda::kPrefillGemmWeightImageMinTokens;
  EXPECT_TRUE(cuda::prefill_gemm_plan(g).weight_image);
  g.m = cuda::kPrefillGemmWeightImageMinTokens - 1;
  EXPECT_FALSE(cuda::prefill_gemm_plan(g).weight_image);
  g.m = 4096;
  {
    ScopedEnv off("MINFER_NO_GEMM_WEIGHT_IMAGE", "1");
    EXPECT_FALSE(cuda::prefill_gemm_plan(g).weight_image);
  }
  g.weight_image_buffer_bytes = bytes - 1;
  EXPECT_FALSE(cuda::prefill_gemm_plan(g).weight_image);
  g.weight_image = 1, g.weight_image_buffer = nullptr;
  EXPECT_THROW(cuda::launch_prefill_gemm(g, nullptr), Error);
}

TEST(PrefillGemm, AutomaticSplitKOnlyForSmallGrids) {
  MINFER_REQUIRE_GPU();
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (sms < 64) GTEST_SKIP() << "the shapes below are sized for >= 64 SMs, this device has " << sms;
  const ScopedEnv split_on("MINFER_NO_GEMM_SPLITK", "0");  // whatever the caller's environment says
  PrefillGemm g;
  g.w_type = GgmlType::Q4_K, g.n = 3584, g.k = 3584, g.m = 512;  // 7B o-projection, one ubatch
  const PrefillGemmPlan small = cuda::prefill_gemm_plan(g);
  EXPECT_GT(small.k_splits, 1);
  EXPECT_EQ(small.m_tile, small.wgmma ? 256 : 128);  // 256: see WideTilesFollowTheGrid
  EXPECT_LE(size_t(small.k_splits) * 512 * 3584 * 4, cuda::kPrefillGemmWorkspaceBytes);
  g.m = 4096;  // 32 x 28 tiles of 128: enough CTAs without splitting
  EXPECT_EQ(cuda::prefill_gemm_plan(g).k_splits, 1);
  g.m = 512, g.n = 37888;  // 7B gate+up: 4 x 296 tiles
  EXPECT_EQ(cuda::prefill_gemm_plan(g).k_splits, 1);
  g.n = 3584;
  {
    const ScopedEnv off("MINFER_NO_GEMM_SPLITK", "1");
    const PrefillGemmPlan plan = cuda::prefill_gemm_plan(g);
    EXPECT_EQ(plan.k_splits, 1);
    EXPECT_EQ(plan.m_tile, 64);  // the single-pass choice for this grid
  }
  EXPECT_EQ(cuda::prefill_gemm_plan(g).k_splits, small.k_splits);  // restored after the scope
}

// The K split is planned for m_plan tokens; the n-tile follows the tokens present (the rule fitted
// to bench_prefill's sweep, prefill_gemm.cu), and MINFER_NO_NARROW_GEMM_TILES=1 keeps 128 rows.
PrefillGemmPlan plan_at(PrefillGemm& g, int64_t n, int64_t m) {
  g.n = n, g.m = m;
  return cuda::prefill_gemm_plan(g);
}

TEST(PrefillGemm, NarrowTilesFollowTheGrid) {
  PrefillGemm g;
  g.w_type = GgmlType::Q4_K, g.k = 3584, g.m_plan = 512, g.sm_count = 132;
  const auto n_tile = [&](int64_t n, int64_t m) { return plan_at(g, n, m).n_tile; };
  EXPECT_EQ(n_tile(3584, 512), 128);  // q at the planned count: 224 CTAs of 128 rows
  EXPECT_EQ(n_tile(3584, 70), 32);    // 56 CTAs of 128 rows; 224 of 32 fit a wave of two a SM
  EXPECT_EQ(n_tile(3584, 256), 64);   // 112 of 128 rows; 448 of 32 would not
  EXPECT_EQ(n_tile(18944, 70), 128);  // gate: 148 CTAs of 128 rows
  g.k = 18944;
  EXPECT_EQ(n_tile(3584, 70), 128);  // down: 196 CTAs of 128 rows (7 K slices)
  g.w_type = GgmlType::Q6_K;
  EXPECT_EQ(n_tile(3584, 70), 64);   // q6_K below two CTAs of 128 rows a SM
  EXPECT_EQ(n_tile(3584, 512), 128);
  {
    const ScopedEnv off("MINFER_NO_NARROW_GEMM_TILES", "1");
    EXPECT_EQ(n_tile(3584, 70), 128);
  }
  {
    const ScopedEnv off("MINFER_NO_WGMMA_GEMM", "1");
    EXPECT_FALSE(cuda::prefill_gemm_plan(g).wgmma);
  }
  g.wgmma = -1;
  EXPECT_FALSE(cuda::prefill_gemm_plan(g).wgmma);
  g.wgmma = 0;
  g.n_tile = 32;  // a forced width wins
  EXPECT_EQ(n_tile(3584, 70), 32);
  g.m = 512;  // the K split is the planned count's whatever the width
  const int planned_splits = cuda::prefill_gemm_plan(g).k_splits;
  g.m = 70, g.n_tile = 0;
  EXPECT_EQ(cuda::prefill_gemm_plan(g).k_splits, planned_splits);
}

// 256-token tiles where the tokens present (not the planned count) fill both warpgroups and the
// CTAs cover at least 3/4 of the SMs 128-token tiles would, with warpgroup MMA only;
// MINFER_NO_WIDE_GEMM_TILES=1 keeps 128.
TEST(PrefillGemm, WideTilesFollowTheGrid) {
  PrefillGemm g;
  g.w_type = GgmlType::Q4_K, g.k = 3584, g.sm_count = 132, g.wgmma = 1;
  const auto m_tile = [&](int64_t n, int64_t m) { return plan_at(g, n, m).m_tile; };
  EXPECT_EQ(m_tile(18944, 512), 256);  // gate: 2 x 148 CTAs of 256 tokens
  EXPECT_EQ(m_tile(3584, 4096), 256);  // q: 16 x 28
  EXPECT_EQ(m_tile(3584, 512), 256);   // q, 2 K slices: 112 CTAs of 256 against 224 of 128
  EXPECT_EQ(m_tile(512, 512), 128);    // k, 7 K slices: 56 CTAs of 256 against 112 of 128
  EXPECT_EQ(m_tile(512, 4096), 256);   // k: 16 x 4 x 2 slices
  EXPECT_EQ(m_tile(18944, 128), 128);  // a second warpgroup would have no tokens
  g.m_plan = 512;
  EXPECT_EQ(m_tile(18944, 70), 128);
  g.m_plan = 0;
  {
    const ScopedEnv off("MINFER_NO_WIDE_GEMM_TILES", "1");
    EXPECT_EQ(m_tile(18944, 512), 128);
  }
  g.wgmma = -1;
  EXPECT_EQ(m_tile(18944, 512), 128);
  g.wgmma = 1, g.n_tile = 64;  // 256-token tiles have 128-row n-tiles only
  EXPECT_EQ(m_tile(18944, 512), 128);
}

// Split-K sums its slices in a fixed order: two runs are bitwise equal. MINFER_NO_GEMM_SPLITK=1
// runs the single-pass kernel (the same bits as forcing k_splits = 1).
TEST(PrefillGemm, SplitKIsDeterministicAndOptOutRunsSinglePass) {
  MINFER_REQUIRE_GPU();
  const int64_t m = 512, n = 1024, k = 3584;
  const std::vector<uint8_t> w = test::random_weight_rows(GgmlType::Q4_K, n, k, test::seed() + 9100);
  const std::vector<float> x = test::random_normal(size_t(m * k), 1.0f, 9101);
  const std::vector<float> bias = test::random_normal(size_t(n), 1.0f, 9102);
  std::vector<uint16_t> x_bf16(x.size());
  for (size_t i = 0; i < x.size(); ++i) x_bf16[i] = f32_to_bf16(x[i]);
  DeviceBuffer<uint8_t> dw(w);
  DeviceBuffer<uint16_t> dx(x_bf16);
  DeviceBuffer<float> dbias(bias);
  DeviceBuffer<float> dy(size_t(m * n));
  PrefillGemm g;
  g.w_type = GgmlType::Q4_K, g.w = dw.get(), g.n = n, g.k = k;
  g.x = dx.get(), g.ldx = k, g.m = m, g.y = dy.get(), g.ldy = n, g.bias = dbias.get();
  DeviceBuffer<float> workspace(cuda::kPrefillGemmWorkspaceBytes / 4);
  g.workspace = workspace.get(), g.workspace_bytes = cuda::kPrefillGemmWorkspaceBytes;
  auto run = [&](int k_splits) {
    g.k_splits = k_splits;
    dy.fill_bytes(0xFF);
    cuda::launch_prefill_gemm(g, nullptr);
    check(cudaDeviceSynchronize(), "prefill GEMM");
    return dy.download();
  };
  ASSERT_GT(cuda::prefill_gemm_plan(g).k_splits, 1);
  const std::vector<float> split_a = run(0), split_b = run(0);
  EXPECT_EQ(std::memcmp(split_a.data(), split_b.data(), split_a.size() * sizeof(float)), 0);
  std::vector<float> opt_out;
  {
    const ScopedEnv off("MINFER_NO_GEMM_SPLITK", "1");
    EXPECT_EQ(cuda::prefill_gemm_plan(g).k_splits, 1);
    opt_out = run(0);
  }
  const std::vector<float> single = run(1);
  EXPECT_EQ(std::memcmp(opt_out.data(), single.data(), single.size() * sizeof(float)), 0);
  // Both paths write every output (the NaN poison is gone); their accuracy is the reference tests'.
  for (size_t i = 0; i < single.size(); ++i)
    ASSERT_TRUE(std::isfinite(split_a[i]) && std::isfinite(single[i])) << "element " << i;
}

TEST(PrefillGemm, RejectsUnsupportedShapes) {
  PrefillGemm g;
  g.w_type = GgmlType::Q4_K, g.n = 128, g.k = 320, g.m = 4, g.ldx = 320, g.ldy = 128;
  g.w = g.x = reinterpret_cast<const uint16_t*>(uintptr_t(256));
  g.y = reinterpret_cast<float*>(uintptr_t(256));
  EXPECT_THROW(cuda::launch_prefill_gemm(g, nullptr), Error);  // k not a multiple of 256
  g.k = g.ldx = 256, g.n = 127;
  EXPECT_THROW(cuda::launch_prefill_gemm(g, nullptr), Error);  // odd n
  g.n = 128, g.w_type = GgmlType::Q2_K;
  EXPECT_THROW(cuda::launch_prefill_gemm(g, nullptr), Error);  // no kernel for the type
  g.w_type = GgmlType::Q8_0, g.ldx = 260;
  EXPECT_THROW(cuda::launch_prefill_gemm(g, nullptr), Error);  // ldx not a multiple of 8
  g.ldx = 256, g.k_splits = -1;
  EXPECT_THROW(cuda::launch_prefill_gemm(g, nullptr), Error);  // negative k_splits
  g.k_splits = 2, g.workspace = reinterpret_cast<float*>(uintptr_t(256)), g.workspace_bytes = 4092;
  EXPECT_THROW(cuda::launch_prefill_gemm(g, nullptr), Error);  // 2 slices x 4 x 128 floats = 4096 bytes > 4092
  g.k_splits = 0, g.w_up = g.w, g.bias = reinterpret_cast<const float*>(uintptr_t(256));
  EXPECT_THROW(cuda::launch_prefill_gemm(g, nullptr), Error);  // the SwiGLU epilogue takes no bias
  g.bias = nullptr, g.k_splits = 2;
  EXPECT_THROW(cuda::launch_prefill_gemm(g, nullptr), Error);  // nor a K split
  g.k_splits = 0, g.w_up = nullptr, g.y_bf16 = reinterpret_cast<uint16_t*>(uintptr_t(256));
  EXPECT_THROW(cuda::launch_prefill_gemm(g, nullptr), Error);  // y_bf16 without w_up
  g.y_bf16 = nullptr, g.n_stacked = 3;
  EXPECT_THROW(cuda::launch_prefill_gemm(g, nullptr), Error);  // at most two stacked matrices
  g.n_stacked = 1, g.stacked[0] = {g.w, 64, g.y, 64, nullptr};
  g.n = g.ldy = 130;
  EXPECT_THROW(cuda::launch_prefill_gemm(g, nullptr), Error);  // a stacked matrix after 130 rows
  g.n = g.ldy = 128, g.stacked[0].n = 63;
  EXPECT_THROW(cuda::launch_prefill_gemm(g, nullptr), Error);  // odd stacked n
  g.stacked[0].n = 64, g.stacked[0].y = nullptr;
  EXPECT_THROW(cuda::launch_prefill_gemm(g, nullptr), Error);  // no output for it
  g.stacked[0].y = g.y, g.residual = g.y;
  EXPECT_THROW(cuda::launch_prefill_gemm(g, nullptr), Error);  // stacked matrices take no residual
}

// With the K split planned for a fixed token count (m_plan), a row's bits do not depend on how
// many rows share the launch: the engine's batch invariance for prompt tokens.
TEST(PrefillGemm, PlannedSplitMakesRowsIndependentOfTheBatch) {
  MINFER_REQUIRE_GPU();
  const int64_t m = 512, n = 1024, k = 3584, few = 13;
  const std::vector<uint8_t> w = test::random_weight_rows(GgmlType::Q4_K, n, k, test::seed() + 9200);
  const std::vector<float> x = test::random_normal(size_t(m * k), 1.0f, 9201);
  std::vector<uint16_t> x_bf16(x.size());
  for (size_t i = 0; i < x.size(); ++i) x_bf16[i] = f32_to_bf16(x[i]);
  DeviceBuffer<uint8_t> dw(w);
  DeviceBuffer<uint16_t> dx(x_bf16);
  DeviceBuffer<float> dy(size_t(m * n)), workspace(cuda::kPrefillGemmWorkspaceBytes / 4);
  PrefillGemm g;
  g.w_type = GgmlType::Q4_K, g.w = dw.get(), g.n = n, g.k = k, g.ldx = k, g.ldy = n, g.m_plan = m;
  g.workspace = workspace.get(), g.workspace_bytes = cuda::kPrefillGemmWorkspaceBytes;
  auto run = [&](int64_t rows, int64_t first) {
    g.x = dx.get() + first * k, g.m = rows, g.y = dy.get();
    dy.fill_bytes(0xFF);
    cuda::launch_prefill_gemm(g, nullptr);
    check(cudaDeviceSynchronize(), "prefill GEMM");
    std::vector<float> y = dy.download();
    y.resize(size_t(rows * n));
    return y;
  };
  g.m = m;
  ASSERT_GT(cuda::prefill_gemm_plan(g).k_splits, 1) << "the case must split K";
  const std::vector<float> all = run(m, 0), part = run(few, 200);
  EXPECT_EQ(std::memcmp(part.data(), all.data() + 200 * n, part.size() * sizeof(float)), 0);
}

// ---- attention over the paged cache --------------------------------------------------------------

// Sequences of prompt chunks in one launch: chunk c is m query rows at positions pos0.. of its own
// sequence, whose blocks (block_size positions each) sit at random places in a shared pool.
struct ChunkSpec {
  int m, pos0;
};

struct PagedCache {
  int block_size, n_blocks;
  int64_t ld_kv;
  std::vector<uint16_t> k, v;                // the pool; unwritten rows are NaN
  std::vector<std::vector<int32_t>> tables;  // per sequence
  int64_t slot(size_t seq, int p) const { return int64_t(tables[seq][size_t(p / block_size)]) * block_size + p % block_size; }
};

// Every sequence's positions [0, pos0 + m) hold random K/V; everything else NaN.
PagedCache make_cache(const std::vector<ChunkSpec>& chunks, int block_size, int64_t ld_kv, uint64_t salt) {
  PagedCache c{block_size, 0, ld_kv, {}, {}, {}};
  for (const ChunkSpec& s : chunks) c.n_blocks += (s.pos0 + s.m + block_size - 1) / block_size + 1;
  std::vector<int32_t> free_blocks(size_t(c.n_blocks));
  for (int b = 0; b < c.n_blocks; ++b) free_blocks[size_t(b)] = b;
  std::shuffle(free_blocks.begin(), free_blocks.end(), std::mt19937_64(test::seed() + salt));
  c.k.assign(size_t(c.n_blocks) * block_size * ld_kv, 0x7E00);
  c.v = c.k;
  size_t next = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const int len = chunks[i].pos0 + chunks[i].m;
    c.tables.emplace_back();
    for (int b = 0; b < (len + block_size - 1) / block_size; ++b) c.tables.back().push_back(free_blocks[next++]);
    const std::vector<float> kf = test::random_normal(size_t(len) * ld_kv, 1.0f, salt + 10 * i + 1);
    const std::vector<float> vf = test::random_normal(size_t(len) * ld_kv, 1.0f, salt + 10 * i + 2);
    for (int p = 0; p < len; ++p)
      for (int64_t e = 0; e < ld_kv; ++e) {
        c.k[size_t(c.slot(i, p) * ld_kv + e)] = f32_to_f16(kf[size_t(p * ld_kv + e)]);
        c.v[size_t(c.slot(i, p) * ld_kv + e)] = f32_to_f16(vf[size_t(p * ld_kv + e)]);
      }
  }
  return c;
}

// An attention kernel (PrefillAttention::wgmma, ::warp_specialized, ::head_group_items).
struct AttentionKernel {
  int wgmma, warp_specialized, items;
};
std::ostream& operator<<(std::ostream& os, const AttentionKernel& k) {
  if (k.wgmma < 0) return os << "mma.sync";
  if (k.warp_specialized < 0) return os << "wgmma";
  return os << "warp-specialized wgmma, " << k.items << " heads a CTA";
}
constexpr AttentionKernel kMmaSync{-1, -1, 2}, kWgmmaOneHead{1, -1, 2}, kWgmmaHeadPairs{1, 1, 2},
    kWgmmaHeadTriples{1, 1, 3};

// Runs the chunks (rows one after another) in one launch; returns out [rows][ldo].
std::vector<float> run_paged_attention(const PagedCache& cache, const std::vector<ChunkSpec>& chunks,
                                       const std::vector<float>& q, int64_t ldq, int64_t ldo, int n_head,
                                       int n_kv_head, int hd, AttentionKernel kernel,
                                       std::vector<uint16_t>* out_bf16 = nullptr) {
  std::vector<cuda::PrefillChunk> pc;
  std::vector<int32_t> tables;
  int rows = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    pc.push_back({rows, chunks[i].m, chunks[i].pos0, int32_t(tables.size())});
    tables.insert(tables.end(), cache.tables[i].begin(), cache.tables[i].end());
    rows += chunks[i].m;
  }
  const std::vector<cuda::PrefillTile> tiles = cuda::prefill_attention_tiles(pc);
  const std::vector<cuda::PrefillHeadGroup> groups =
      cuda::prefill_attention_head_groups(pc, tiles, n_head / n_kv_head, kernel.items);
  std::vector<int32_t> chunk_ints(pc.size() * 4), tile_ints(tiles.size() * 2),
      group_ints(groups.size() * sizeof(cuda::PrefillHeadGroup) / 4);
  std::memcpy(chunk_ints.data(), pc.data(), chunk_ints.size() * 4);
  std::memcpy(tile_ints.data(), tiles.data(), tile_ints.size() * 4);
  std::memcpy(group_ints.data(), groups.data(), group_ints.size() * 4);
  DeviceBuffer<float> dq(q);
  DeviceBuffer<uint16_t> dk(cache.k), dv(cache.v);
  DeviceBuffer<int32_t> dchunks(chunk_ints), dtiles(tile_ints), dgroups(group_ints), dtables(tables);
  DeviceBuffer<float> dout(size_t(rows * ldo));
  DeviceBuffer<uint16_t> dout_bf16(size_t(rows * ldo));
  dout.fill_bytes(0xFF);
  dout_bf16.fill_bytes(0xFF);
  PrefillAttention a;
  a.q = dq.get(), a.ldq = ldq, a.k_cache = dk.get(), a.v_cache = dv.get(), a.ld_kv = cache.ld_kv;
  a.out = dout.get(), a.out_bf16 = dout_bf16.get(), a.ldo = ldo;
  a.chunks = reinterpret_cast<const cuda::PrefillChunk*>(dchunks.get());
  a.tiles = reinterpret_cast<const cuda::PrefillTile*>(dtiles.get());
  a.n_tiles = int(tiles.size());
  a.tables = dtables.get(), a.block_size = cache.block_size;
  a.n_head = n_head, a.n_kv_head = n_kv_head, a.head_dim = hd;
  a.scale = 1.0f / std::sqrt(float(hd));
  a.head_groups = reinterpret_cast<const cuda::PrefillHeadGroup*>(dgroups.get());
  a.n_head_groups = int(groups.size()), a.head_group_items = kernel.items, a.head_groups_of = n_head / n_kv_head;
  a.wgmma = kernel.wgmma, a.warp_specialized = kernel.warp_specialized;
  cuda::launch_prefill_attention(a, nullptr);
  check(cudaDeviceSynchronize(), "prefill attention");
  if (out_bf16) *out_bf16 = dout_bf16.download();
  return dout.download();
}

// The attention kernels this device runs: mma.sync, and on sm_90 warpgroup MMA one head a CTA and
// two or three heads a CTA (warp-specialized).
std::vector<AttentionKernel> attention_kernels() {
  if (cuda::prefill_gemm_device_has_wgmma()) return {kMmaSync, kWgmmaOneHead, kWgmmaHeadPairs, kWgmmaHeadTriples};
  return {kMmaSync};
}

void run_attention_case(const std::vector<ChunkSpec>& chunks, int n_head, int n_kv_head, int hd, int block_size,
                        uint64_t salt, AttentionKernel kernel) {
  const int64_t ldq = int64_t(n_head) * hd + 8, ldo = int64_t(n_head) * hd + 16, ld_kv = int64_t(n_kv_head) * hd;
  int rows = 0;
  for (const ChunkSpec& c : chunks) rows += c.m;
  const PagedCache cache = make_cache(chunks, block_size, ld_kv, salt);
  const std::vector<float> q = test::random_normal(size_t(rows * ldq), 1.0f, salt + 7);
  std::vector<uint16_t> out_bf16;
  const std::vector<float> out = run_paged_attention(cache, chunks, q, ldq, ldo, n_head, n_kv_head, hd, kernel, &out_bf16);

  // Tolerance: q and the probabilities are rounded to f16 (2^-11 relative); outputs are O(1).
  const double tol = 4e-3;
  int failures = 0, row0 = 0;
  for (size_t c = 0; c < chunks.size(); ++c) {
    std::vector<double> score(size_t(chunks[c].pos0 + chunks[c].m));
    for (int h = 0; h < n_head; ++h) {
      const int g = h / (n_head / n_kv_head);
      for (int i = 0; i < chunks[c].m; ++i) {
        const int visible = chunks[c].pos0 + i + 1;
        const size_t qrow = size_t(row0 + i);
        double mx = -INFINITY;
        for (int j = 0; j < visible; ++j) {
          double s = 0;
          for (int d = 0; d < hd; ++d)
            s += double(q[qrow * ldq + size_t(h * hd + d)]) * f16_to_f32(cache.k[size_t(cache.slot(c, j) * ld_kv + g * hd + d)]);
          score[size_t(j)] = s / std::sqrt(double(hd));
          mx = std::max(mx, score[size_t(j)]);
        }
        double denom = 0;
        for (int j = 0; j < visible; ++j) denom += (score[size_t(j)] = std::exp(score[size_t(j)] - mx));
        for (int d = 0; d < hd; ++d) {
          double expect = 0;
          for (int j = 0; j < visible; ++j)
            expect += score[size_t(j)] * f16_to_f32(cache.v[size_t(cache.slot(c, j) * ld_kv + g * hd + d)]);
          expect /= denom;
          const size_t at = qrow * ldo + size_t(h * hd + d);
          if (!(std::fabs(out[at] - expect) <= tol) && failures++ < 5)
            ADD_FAILURE() << kernel << " chunk " << c << " m=" << chunks[c].m << " pos0=" << chunks[c].pos0 << " hd=" << hd
                          << " head " << h << " query " << i << " d " << d << ": " << out[at] << " expected " << expect;
          if (out_bf16[at] != f32_to_bf16(out[at]) && failures++ < 5)
            ADD_FAILURE() << "bf16 plane differs from the f32 output at query " << i << " head " << h;
        }
      }
    }
    row0 += chunks[c].m;
  }
  EXPECT_EQ(failures, 0);
}

class PrefillAttentionHeadDim : public testing::TestWithParam<int> {};

TEST_P(PrefillAttentionHeadDim, CausalGqaOverPagedCacheMatchesFloat64Reference) {
  MINFER_REQUIRE_GPU();
  const int hd = GetParam();
  for (const AttentionKernel kernel : attention_kernels()) {
    uint64_t salt = 5000 + uint64_t(hd);
    run_attention_case({{1, 0}}, 4, 2, hd, 16, salt += 100, kernel);      // one token
    run_attention_case({{7, 37}}, 4, 1, hd, 16, salt += 100, kernel);     // pos0 > 0, one kv head for all
    run_attention_case({{100, 0}}, 6, 2, hd, 64, salt += 100, kernel);    // partial query tile, group 3
    run_attention_case({{130, 300}}, 4, 2, hd, 32, salt += 100, kernel);  // several query and key tiles
    run_attention_case({{64, 64}}, 2, 2, hd, 128, salt += 100, kernel);   // tile-aligned, no GQA
    // group 7 over 3 tiles: pairs that span two query tiles of different causal ranges
    run_attention_case({{150, 40}}, 14, 2, hd, 16, salt += 100, kernel);
    // several sequences' chunks in one launch, each with its own block table; group 3 leaves an
    // odd item (a consumer without a head) in each chunk
    run_attention_case({{7, 37}, {100, 0}, {130, 300}, {1, 5}}, 6, 2, hd, 16, salt += 100, kernel);
  }
}

INSTANTIATE_TEST_SUITE_P(HeadDims, PrefillAttentionHeadDim, testing::Values(64, 128));

// A query's output does not depend on how its prompt was cut into chunks: keys are visited in
// tiles from position 0 whatever the chunk, so the bits are equal.
TEST(PrefillAttention, ChunkingDoesNotChangeTheBits) {
  MINFER_REQUIRE_GPU();
  const int hd = 128, n_head = 4, n_kv = 2, len = 150;
  const int64_t ld = int64_t(n_head) * hd, ld_kv = int64_t(n_kv) * hd;
  const PagedCache cache = make_cache({{len, 0}}, 16, ld_kv, 6100);
  const std::vector<float> q = test::random_normal(size_t(len * ld), 1.0f, 6101);
  for (const AttentionKernel kernel : attention_kernels()) {
    const std::vector<float> whole = run_paged_attention(cache, {{len, 0}}, q, ld, ld, n_head, n_kv, hd, kernel);
    int pos = 0;
    for (int m : {64, 50, 1, 35}) {
      const std::vector<float> part_q(q.begin() + pos * ld, q.begin() + (pos + m) * ld);
      const std::vector<float> part = run_paged_attention(cache, {{m, pos}}, part_q, ld, ld, n_head, n_kv, hd, kernel);
      ASSERT_EQ(std::memcmp(part.data(), whole.data() + pos * ld, size_t(m * ld) * 4), 0)
          << kernel << ", chunk at " << pos;
      pos += m;
    }
  }
}

// Each output sums its k16 slices in the same order with either multiply (as the GEMM's two
// kernels do), so warpgroup MMA reproduces the mma.sync kernel's bits: MINFER_NO_WGMMA_ATTENTION=1
// changes no result. The warp-specialized kernel runs the same per-tile body on a shared K/V
// stream: MINFER_NO_WS_ATTENTION=1 changes none either (group 5: head groups across query tiles
// and short groups at the end of a chunk).
TEST(PrefillAttention, AllKernelsGiveTheSameBits) {
  MINFER_REQUIRE_GPU();
  if (!cuda::prefill_gemm_device_has_wgmma()) GTEST_SKIP() << "warpgroup MMA needs an sm_90 device";
  for (const int hd : {64, 128}) {
    const int n_head = 10, n_kv = 2;
    const int64_t ld = int64_t(n_head) * hd, ld_kv = int64_t(n_kv) * hd;
    const std::vector<ChunkSpec> chunks = {{130, 300}, {7, 37}, {64, 0}, {200, 1000}};
    const PagedCache cache = make_cache(chunks, 16, ld_kv, 6200 + uint64_t(hd));
    const std::vector<float> q = test::random_normal(size_t(401 * ld), 1.0f, 6201);
    std::vector<uint16_t> plane_sync;
    const std::vector<float> out_sync = run_paged_attention(cache, chunks, q, ld, ld, n_head, n_kv, hd, kMmaSync, &plane_sync);
    for (const AttentionKernel kernel : {kWgmmaOneHead, kWgmmaHeadPairs, kWgmmaHeadTriples}) {
      std::vector<uint16_t> plane;
      const std::vector<float> out = run_paged_attention(cache, chunks, q, ld, ld, n_head, n_kv, hd, kernel, &plane);
      EXPECT_EQ(std::memcmp(out_sync.data(), out.data(), out_sync.size() * 4), 0) << kernel << ", head_dim " << hd;
      EXPECT_EQ(plane_sync, plane) << kernel << ", head_dim " << hd;
    }
  }
}

// Head groups stay inside a chunk, cover every (tile, head) item once, put the longest range
// first; only a chunk's last group may be short.
TEST(PrefillAttention, HeadGroupsCoverEveryItemOnceWithinAChunk) {
  const std::vector<cuda::PrefillChunk> chunks = {{0, 130, 300, 0}, {130, 7, 37, 0}, {137, 64, 0, 0}};
  const std::vector<cuda::PrefillTile> tiles = cuda::prefill_attention_tiles(chunks);
  const auto end = [&](int t) {
    const cuda::PrefillChunk& c = chunks[size_t(tiles[size_t(t)].chunk)];
    return c.pos0 + std::min(tiles[size_t(t)].q0 + 64, c.m);
  };
  for (const int group : {1, 2, 5, 7})
    for (const int items : {2, 3}) {
      const std::vector<cuda::PrefillHeadGroup> groups = cuda::prefill_attention_head_groups(chunks, tiles, group, items);
      std::vector<int> seen(tiles.size() * size_t(group), 0), short_groups(chunks.size(), 0);
      for (const cuda::PrefillHeadGroup& g : groups) {
        int n = 0;
        for (int i = 0; i < items && g.head[i] >= 0; ++i, ++n) {
          ++seen[size_t(g.tile[i] * group + g.head[i])];
          EXPECT_EQ(tiles[size_t(g.tile[i])].chunk, tiles[size_t(g.tile[0])].chunk) << group << " x " << items;
          EXPECT_GE(end(g.tile[0]), end(g.tile[i])) << group << " x " << items;
        }
        for (int i = n; i < cuda::kMaxHeadGroupItems; ++i) EXPECT_LT(g.head[i], 0) << group << " x " << items;
        if (n < items) ++short_groups[size_t(tiles[size_t(g.tile[0])].chunk)];
      }
      EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), int64_t(seen.size())) << group << " x " << items;
      for (int n : short_groups) EXPECT_LE(n, 1) << group << " x " << items;
      for (size_t i = 1; i < groups.size(); ++i) EXPECT_GE(end(groups[i - 1].tile[0]), end(groups[i].tile[0]));
    }
}

// Two heads a CTA unless three take fewer waves of one CTA an SM, weighed by the heads a CTA.
TEST(PrefillAttention, HeadGroupItemsFollowTheWaves) {
  const std::vector<cuda::PrefillChunk> chunk = {{0, 512, 16384, 0}};
  const std::vector<cuda::PrefillTile> tiles = cuda::prefill_attention_tiles(chunk);  // 8 tiles
  // 7B (4 KV heads of 7): 112 CTAs of two are one wave on 132 SMs (cost 2), 76 of three cost 3.
  EXPECT_EQ(cuda::prefill_attention_head_group_items(chunk, tiles, 4, 7, 132), 2);
  // 14B (8 KV heads of 5): 160 CTAs of two are two waves (cost 4), 112 of three one (cost 3).
  EXPECT_EQ(cuda::prefill_attention_head_group_items(chunk, tiles, 8, 5, 132), 3);
}

TEST(PrefillAttention, RejectsUnsupportedShapes) {
  PrefillAttention a;
  a.q = a.out = reinterpret_cast<float*>(uintptr_t(256));
  a.k_cache = a.v_cache = reinterpret_cast<const uint16_t*>(uintptr_t(256));
  a.chunks = reinterpret_cast<const cuda::PrefillChunk*>(uintptr_t(256));
  a.tiles = reinterpret_cast<const cuda::PrefillTile*>(uintptr_t(256));
  a.tables = reinterpret_cast<const int32_t*>(uintptr_t(256));
  a.n_tiles = 1, a.block_size = 16;
  a.n_head = 4, a.n_kv_head = 2, a.head_dim = 96, a.ldq = a.ldo = 512, a.ld_kv = 256;
  EXPECT_THROW(cuda::launch_prefill_attention(a, nullptr), Error);  // head_dim 96
  a.head_dim = 64, a.n_kv_head = 3;
  EXPECT_THROW(cuda::launch_prefill_attention(a, nullptr), Error);  // 4 heads over 3 kv heads
  a.n_kv_head = 2, a.ldq = 200;
  EXPECT_THROW(cuda::launch_prefill_attention(a, nullptr), Error);  // q stride too small
  a.ldq = 512, a.block_size = 24;
  EXPECT_THROW(cuda::launch_prefill_attention(a, nullptr), Error);  // block size not a power of two
  a.block_size = 16, a.wgmma = 2;
  EXPECT_THROW(cuda::launch_prefill_attention(a, nullptr), Error);  // no such kernel choice
  a.wgmma = -1, a.warp_specialized = 1;
  EXPECT_THROW(cuda::launch_prefill_attention(a, nullptr), Error);  // warp specialization without wgmma
  if (cuda::prefill_gemm_device_has_wgmma()) {
    a.wgmma = 1, a.warp_specialized = 1;
    EXPECT_THROW(cuda::launch_prefill_attention(a, nullptr), Error);  // no head groups
  }
}

}  // namespace
}  // namespace minfer
