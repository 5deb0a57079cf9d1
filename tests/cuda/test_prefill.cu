// Prefill kernels against float64 CPU oracles: the bf16 activation plane (bitwise against the host
// conversion), the GEMM for every weight type (dequantize_row + float64 dot), and causal flash
// attention with GQA and pos0 > 0 (naive float64 softmax attention).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "backend/cuda/prefill.h"
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

bool have_device() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
#define REQUIRE_DEVICE() \
  if (!have_device()) GTEST_SKIP() << "no CUDA device"

void check(cudaError_t e, const char* what) { ASSERT_EQ(e, cudaSuccess) << what << ": " << cudaGetErrorString(e); }

// A device buffer of T (exact size, so out-of-bounds reads show up under compute-sanitizer).
template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t count = 0;
  explicit DeviceBuffer(size_t n) : count(n) {
    if (cudaMalloc(&ptr, n * sizeof(T)) != cudaSuccess) ptr = nullptr;
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    if (ptr) cudaMemcpy(ptr, host.data(), count * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::vector<T> download() const {
    std::vector<T> host(count);
    cudaMemcpy(host.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost);
    return host;
  }
  void fill_bytes(int byte) { cudaMemset(ptr, byte, count * sizeof(T)); }
};

TEST(PrefillActivation, Bf16PlaneMatchesHostRounding) {
  REQUIRE_DEVICE();
  std::vector<float> x = test::random_normal(4099, 3.0f, 11);
  x[0] = 0.0f, x[1] = -0.0f, x[2] = std::numeric_limits<float>::infinity();
  x[3] = std::numeric_limits<float>::quiet_NaN(), x[4] = 1e-40f, x[5] = 3.3895e38f;
  DeviceBuffer<float> dx(x);
  DeviceBuffer<uint16_t> dy(x.size());
  cuda::launch_prefill_activation_bf16(dx.ptr, dy.ptr, int64_t(x.size()), nullptr);
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

  DeviceBuffer<uint8_t> dw(w);
  DeviceBuffer<float> dx_f32(x);
  DeviceBuffer<uint16_t> dx(x.size());
  DeviceBuffer<float> dbias(bias);
  DeviceBuffer<float> dy(residual);  // in place: y = residual + X W^T when residual is on
  if (!c.residual) dy.fill_bytes(0xFF);  // NaN poison: every output must be written
  cuda::launch_prefill_activation_bf16(dx_f32.ptr, dx.ptr, int64_t(x.size()), nullptr);

  PrefillGemm g;
  g.w_type = c.type, g.w = dw.ptr, g.n = c.n, g.k = c.k;
  g.x = dx.ptr, g.ldx = ldx, g.m = c.m, g.y = dy.ptr, g.ldy = ldy;
  g.bias = c.bias ? dbias.ptr : nullptr;
  g.residual = c.residual ? dy.ptr : nullptr;
  g.m_tile = c.m_tile;
  g.k_splits = c.k_splits;
  if (c.expect_split) EXPECT_GT(cuda::prefill_gemm_plan(g).k_splits, 1) << "m=" << c.m << " n=" << c.n << " k=" << c.k;
  cuda::launch_prefill_gemm(g, nullptr);
  check(cudaGetLastError(), "launch_prefill_gemm");
  check(cudaDeviceSynchronize(), "prefill GEMM");
  const std::vector<float> y = dy.download();

  std::vector<float> w_row(size_t(c.k));
  const size_t stride = row_bytes(c.type, c.k);
  int failures = 0;
  for (int64_t col = 0; col < c.n; ++col) {
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
  REQUIRE_DEVICE();
  uint64_t salt = 100 * uint64_t(GetParam());
  // n = 264: two full 128-row weight tiles and a partial one; k = 512: two K super-blocks (the
  // second q6_K block starts 2 bytes off a word boundary, as do odd q8_0 blocks).
  for (int64_t m : {1, 7, 100, 512}) run_gemm_case({GetParam(), m, 264, 512}, salt += 10);
  run_gemm_case({GetParam(), 200, 136, 768, 128}, salt += 10);  // the 128-row m-tile
}

// Split-K: forced uneven slices (k = 512 is 8 K steps: 3 slices of 3, 3, 2; 8 slices of one step)
// and the automatic choice on a large K (7B ffn_down's 18944), all against the same reference.
TEST_P(PrefillGemmTypes, SplitKMatchesFloat64Reference) {
  REQUIRE_DEVICE();
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
  REQUIRE_DEVICE();
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

TEST(PrefillGemm, AutomaticSplitKOnlyForSmallGrids) {
  REQUIRE_DEVICE();
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (sms < 64) GTEST_SKIP() << "the shapes below are sized for >= 64 SMs, this device has " << sms;
  const ScopedEnv split_on("MINFER_NO_GEMM_SPLITK", "0");  // whatever the caller's environment says
  PrefillGemm g;
  g.w_type = GgmlType::Q4_K, g.n = 3584, g.k = 3584, g.m = 512;  // 7B o-projection, one ubatch
  const PrefillGemmPlan small = cuda::prefill_gemm_plan(g);
  EXPECT_GT(small.k_splits, 1);
  EXPECT_EQ(small.m_tile, 128);
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

// Split-K sums its slices in a fixed order: two runs are bitwise equal. MINFER_NO_GEMM_SPLITK=1
// runs the single-pass kernel (the same bits as forcing k_splits = 1).
TEST(PrefillGemm, SplitKIsDeterministicAndOptOutRunsSinglePass) {
  REQUIRE_DEVICE();
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
  g.w_type = GgmlType::Q4_K, g.w = dw.ptr, g.n = n, g.k = k;
  g.x = dx.ptr, g.ldx = k, g.m = m, g.y = dy.ptr, g.ldy = n, g.bias = dbias.ptr;
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
}

// ---- attention ---------------------------------------------------------------------------------

struct AttentionCase {
  int m, pos0, n_head, n_kv_head, head_dim;
};

void run_attention_case(const AttentionCase& c, uint64_t salt) {
  const int hd = c.head_dim, kv_len = c.pos0 + c.m, n_ctx = kv_len + 16;
  const int64_t ldq = int64_t(c.n_head) * hd + 8, ldo = int64_t(c.n_head) * hd + 16;
  const int64_t ld_kv = int64_t(c.n_kv_head) * hd;
  const std::vector<float> q = test::random_normal(size_t(c.m * ldq), 1.0f, salt);
  const std::vector<float> k_f = test::random_normal(size_t(n_ctx) * ld_kv, 1.0f, salt + 1);
  const std::vector<float> v_f = test::random_normal(size_t(n_ctx) * ld_kv, 1.0f, salt + 2);
  std::vector<uint16_t> k(k_f.size()), v(v_f.size());
  for (size_t i = 0; i < k.size(); ++i) {
    const bool unwritten = int64_t(i) >= int64_t(kv_len) * ld_kv;  // rows past the chunk: NaN
    k[i] = unwritten ? 0x7E00 : f32_to_f16(k_f[i]);
    v[i] = unwritten ? 0x7E00 : f32_to_f16(v_f[i]);
  }
  DeviceBuffer<float> dq(q);
  DeviceBuffer<uint16_t> dk(k), dv(v);
  DeviceBuffer<float> dout(size_t(c.m * ldo));
  DeviceBuffer<uint16_t> dout_bf16(size_t(c.m * ldo));
  dout.fill_bytes(0xFF);
  dout_bf16.fill_bytes(0xFF);

  PrefillAttention a;
  a.q = dq.ptr, a.ldq = ldq, a.k_cache = dk.ptr, a.v_cache = dv.ptr, a.ld_kv = ld_kv;
  a.out = dout.ptr, a.out_bf16 = dout_bf16.ptr, a.ldo = ldo;
  a.m = c.m, a.pos0 = c.pos0, a.n_head = c.n_head, a.n_kv_head = c.n_kv_head, a.head_dim = hd;
  a.scale = 1.0f / std::sqrt(float(hd));
  cuda::launch_prefill_attention(a, nullptr);
  check(cudaGetLastError(), "launch_prefill_attention");
  check(cudaDeviceSynchronize(), "prefill attention");
  const std::vector<float> out = dout.download();
  const std::vector<uint16_t> out_bf16 = dout_bf16.download();

  // Tolerance: q and the probabilities are rounded to f16 (2^-11 relative); outputs are O(1).
  const double tol = 4e-3;
  int failures = 0;
  std::vector<double> score(static_cast<size_t>(kv_len));
  for (int h = 0; h < c.n_head; ++h) {
    const int g = h / (c.n_head / c.n_kv_head);
    for (int i = 0; i < c.m; ++i) {
      const int visible = c.pos0 + i + 1;
      double mx = -INFINITY;
      for (int j = 0; j < visible; ++j) {
        double s = 0;
        for (int d = 0; d < hd; ++d)
          s += double(q[size_t(i * ldq + h * hd + d)]) * f16_to_f32(k[size_t(j * ld_kv + g * hd + d)]);
        score[size_t(j)] = s / std::sqrt(double(hd));
        mx = std::max(mx, score[size_t(j)]);
      }
      double denom = 0;
      for (int j = 0; j < visible; ++j) denom += (score[size_t(j)] = std::exp(score[size_t(j)] - mx));
      for (int d = 0; d < hd; ++d) {
        double expect = 0;
        for (int j = 0; j < visible; ++j) expect += score[size_t(j)] * f16_to_f32(v[size_t(j * ld_kv + g * hd + d)]);
        expect /= denom;
        const size_t at = size_t(i * ldo + h * hd + d);
        if (!(std::fabs(out[at] - expect) <= tol) && failures++ < 5)
          ADD_FAILURE() << "m=" << c.m << " pos0=" << c.pos0 << " hd=" << hd << " head " << h << " token " << i
                        << " d " << d << ": " << out[at] << " expected " << expect;
        if (out_bf16[at] != f32_to_bf16(out[at]) && failures++ < 5)
          ADD_FAILURE() << "bf16 plane differs from the f32 output at token " << i << " head " << h;
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

class PrefillAttentionHeadDim : public testing::TestWithParam<int> {};

TEST_P(PrefillAttentionHeadDim, CausalGqaMatchesFloat64Reference) {
  REQUIRE_DEVICE();
  const int hd = GetParam();
  uint64_t salt = 5000 + uint64_t(hd);
  run_attention_case({1, 0, 4, 2, hd}, salt += 10);     // one token
  run_attention_case({7, 37, 4, 1, hd}, salt += 10);    // pos0 > 0, all heads share one kv head
  run_attention_case({100, 0, 6, 2, hd}, salt += 10);   // partial query tile, group 3
  run_attention_case({130, 300, 4, 2, hd}, salt += 10); // several query and key tiles
  run_attention_case({64, 64, 2, 2, hd}, salt += 10);   // tile-aligned boundaries, no GQA
}

INSTANTIATE_TEST_SUITE_P(HeadDims, PrefillAttentionHeadDim, testing::Values(64, 128));

TEST(PrefillAttention, RejectsUnsupportedShapes) {
  PrefillAttention a;
  a.q = a.out = reinterpret_cast<float*>(uintptr_t(256));
  a.k_cache = a.v_cache = reinterpret_cast<const uint16_t*>(uintptr_t(256));
  a.m = 4, a.n_head = 4, a.n_kv_head = 2, a.head_dim = 96, a.ldq = a.ldo = 512, a.ld_kv = 256;
  EXPECT_THROW(cuda::launch_prefill_attention(a, nullptr), Error);  // head_dim 96
  a.head_dim = 64, a.n_kv_head = 3;
  EXPECT_THROW(cuda::launch_prefill_attention(a, nullptr), Error);  // 4 heads over 3 kv heads
  a.n_kv_head = 2, a.ldq = 200;
  EXPECT_THROW(cuda::launch_prefill_attention(a, nullptr), Error);  // q stride too small
}

}  // namespace
}  // namespace minfer
