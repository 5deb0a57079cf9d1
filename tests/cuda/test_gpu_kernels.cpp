// Every CUDA kernel against the CPU reference (src/quant, double-precision references) on fresh
// random inputs; the fused epilogues against their unfused paths byte for byte.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>

#include "backend/cuda/kernels.h"
#include "backend/cuda/prefill.h"
#include "convert/synth.h"
#include "prefill_test_data.h"
#include "quant/canonical_dot.h"
#include "quant/quant.h"
#include "sampling/draw.h"
#include "gpu_support.h"
#include "../support.h"
#include "util/error.h"
#include "util/half.h"

namespace minfer::test {
namespace {

using cuda::DevMat;

std::vector<uint8_t> quantize_matrix(GgmlType t, const std::vector<float>& w, int rows, int cols) {
  std::vector<uint8_t> out(row_bytes(t, cols) * size_t(rows));
  for (int r = 0; r < rows; ++r)
    quantize_row(t, w.data() + size_t(r) * cols, out.data() + row_bytes(t, cols) * size_t(r), cols);
  return out;
}

// Row t of pad40 rows of `cols` columns (the CPU's form of the q8 activations).
BlockQ8Pad40* pad40_row(std::vector<uint8_t>& rows, int t, int cols) {
  return reinterpret_cast<BlockQ8Pad40*>(rows.data()) + size_t(t) * size_t(cols / 32);
}
std::vector<uint8_t> quantize_pad40_cpu(const std::vector<float>& x, int rows, int cols) {
  std::vector<uint8_t> out(size_t(rows) * size_t(cols / 32) * sizeof(BlockQ8Pad40));
  for (int r = 0; r < rows; ++r)
    quantize_row_pad40_grouped(x.data() + size_t(r) * cols, pad40_row(out, r, cols), cols);
  return out;
}

// A q8 plane of `tokens` rows on the device, filled from pad40 rows quantized on the CPU (one scale
// per group) or read back as pad40 rows: the host's reading of the plane's layout (cuda::Q8Plane).
class DevicePlane {
 public:
  DevicePlane(int tokens, int cols)
      : tokens_(tokens), cols_(cols), bytes_(size_t(cuda::q8_plane_bytes(tokens, cols))), buf_(bytes_),
        plane(cuda::q8_plane(buf_.get(), tokens, cols)) {}
  DevicePlane(std::vector<uint8_t> pad40_rows, int tokens, int cols) : DevicePlane(tokens, cols) {
    std::vector<uint8_t> host(bytes_);
    const cuda::Q8Plane h = cuda::q8_plane(host.data(), tokens, cols);
    for (int t = 0; t < tokens; ++t)
      for (int b = 0; b < cols / 32; ++b) {
        const BlockQ8Pad40& blk = pad40_row(pad40_rows, t, cols)[b];
        std::memcpy(h.block_quants(t, b), blk.qs, 32);
        h.set_sum(t, b, blk.sum);
        if (b % 8 == 0) *h.scale(t, b / 8) = blk.d;
      }
    buf_.upload(host);
  }
  std::vector<uint8_t> to_pad40() const {
    std::vector<uint8_t> host = buf_.download(), rows(size_t(tokens_) * size_t(cols_ / 32) * sizeof(BlockQ8Pad40));
    const cuda::Q8Plane h = cuda::q8_plane(host.data(), tokens_, cols_);
    for (int t = 0; t < tokens_; ++t)
      for (int b = 0; b < cols_ / 32; ++b) {
        BlockQ8Pad40& blk = pad40_row(rows, t, cols_)[b];
        blk.d = *h.scale(t, b / 8);
        std::memcpy(blk.qs, h.block_quants(t, b), 32);
        blk.sum = *h.sum(t, b);
      }
    return rows;
  }

 private:
  int tokens_, cols_;
  size_t bytes_;
  DeviceBuffer<uint8_t> buf_;

 public:
  const cuda::Q8Plane plane;
};

TEST(GpuKernels, QuantizeQ8IsBitwiseTheCpuRule) {
  MINFER_REQUIRE_GPU();
  const int rows = 5, cols = 4096;
  std::vector<float> x = random_normal(static_cast<size_t>(rows) * cols, 3.0f, 1);
  for (int i = 0; i < 32; ++i) x[size_t(64 + i)] = 0.0f;           // an all-zero block
  for (int i = 0; i < 32; ++i) x[size_t(128 + i)] = 0.5f * float(i - 16);  // exact .5 ties
  x[300] = 1e30f;
  DeviceBuffer<float> dx(x);
  DevicePlane dq(rows, cols);
  cuda::launch_quantize_q8(dx.get(), cols, dq.plane, rows, cols, nullptr);
  const auto gpu = dq.to_pad40();
  const auto cpu = quantize_pad40_cpu(x, rows, cols);
  ASSERT_EQ(gpu.size(), cpu.size());
  for (size_t b = 0; b < gpu.size() / 40; ++b) {  // the pad bytes are not part of the plane
    const uint8_t* g = gpu.data() + 40 * b;
    const uint8_t* c = cpu.data() + 40 * b;
    ASSERT_EQ(std::memcmp(g, c, 2), 0) << "d of block " << b;
    ASSERT_EQ(std::memcmp(g + 4, c + 4, 36), 0) << "quants/sum of block " << b;
  }
}

double rms_ref(const float* x, const float* w, int n, int i, float eps) {
  double ss = 0;
  for (int k = 0; k < n; ++k) ss += double(x[k]) * x[k];
  return double(x[i]) / std::sqrt(ss / n + eps) * w[i];
}

bool same_pad40(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size() / 40; ++i)
    if (std::memcmp(a.data() + 40 * i, b.data() + 40 * i, 2) ||
        std::memcmp(a.data() + 40 * i + 4, b.data() + 40 * i + 4, 36))
      return false;
  return true;
}

// The producer epilogues (q8 plane for the decode matmul, bf16 plane for the prompt GEMM) write
// the bits of the standalone quantize and conversion of the f32 output, which is itself unchanged.
// Three rows read from a padded stride; widths of a partial warp (896), the 7B and 14B rows, and
// one past the default shared memory of the row kernel's staging (11264).
TEST(GpuKernels, RmsNormFusedQuantizeEqualsStandalone) {
  MINFER_REQUIRE_GPU();
  const int rows = 3;
  for (int width : {896, 3584, 5120, 11264}) {
    const int ld_x = width + 4;
    const size_t n = size_t(rows) * size_t(width);
    const auto x = random_normal(size_t(rows) * size_t(ld_x), 2.0f, 2 + uint64_t(width));
    const auto w = random_normal(static_cast<size_t>(width), 1.0f, 3 + uint64_t(width));
    DeviceBuffer<float> dx(x), dw(w), y_fused(n), y_plain(n);
    DeviceBuffer<uint16_t> b_fused(n), b_plain(n);
    DevicePlane q_fused(rows, width), q_plain(rows, width);
    cuda::launch_rms_norm(dx.get(), ld_x, dw.get(), y_fused.get(), width, rows, width, 0, 1e-6f, q_fused.plane, rows,
                          nullptr, b_fused.get());
    cuda::launch_rms_norm(dx.get(), ld_x, dw.get(), y_plain.get(), width, rows, width, 0, 1e-6f, {}, 0, nullptr);
    cuda::launch_quantize_q8(y_plain.get(), width, q_plain.plane, rows, width, nullptr);
    cuda::launch_prefill_activation_bf16(y_plain.get(), b_plain.get(), int64_t(n), nullptr);
    const auto yf = y_fused.download(), yp = y_plain.download();
    ASSERT_EQ(std::memcmp(yf.data(), yp.data(), yf.size() * 4), 0) << width;
    const auto bf = b_fused.download(), bp = b_plain.download();
    ASSERT_EQ(std::memcmp(bf.data(), bp.data(), bf.size() * 2), 0) << width;
    ASSERT_TRUE(same_pad40(q_fused.to_pad40(), q_plain.to_pad40())) << width;
    ASSERT_TRUE(same_pad40(q_fused.to_pad40(), quantize_pad40_cpu(yf, rows, width))) << width;
    for (int r = 0; r < rows; ++r)
      for (int i = 0; i < width; ++i) {
        const float y = yf[size_t(r) * size_t(width) + size_t(i)];
        ASSERT_NEAR(y, rms_ref(x.data() + size_t(r) * size_t(ld_x), w.data(), width, i, 1e-6f), 1e-5 * (1 + std::fabs(y)))
            << "width " << width << " row " << r << " column " << i;
      }
  }
}

TEST(GpuKernels, RmsNormPerHeadGroups) {
  MINFER_REQUIRE_GPU();
  const int rows = 3, width = 512, group = 128;
  const auto x = random_normal(static_cast<size_t>(rows * width), 1.0f, 4);
  const auto w = random_normal(static_cast<size_t>(group), 1.0f, 5);
  DeviceBuffer<float> dx(x), dw(w), dy(static_cast<size_t>(rows * width));
  cuda::launch_rms_norm(dx.get(), width, dw.get(), dy.get(), width, rows, width, group, 1e-5f, {}, 0, nullptr);
  const auto y = dy.download();
  for (int r = 0; r < rows; ++r)
    for (int h = 0; h < width / group; ++h)
      for (int i = 0; i < group; ++i) {
        const float* xs = x.data() + size_t(r * width + h * group);
        ASSERT_NEAR(y[size_t(r * width + h * group + i)], rms_ref(xs, w.data(), group, i, 1e-5f), 1e-5);
      }
}

double swiglu_ref(float g, float u) { return double(g) / (1 + std::exp(-double(g))) * u; }

TEST(GpuKernels, SwigluFusedQuantizeEqualsStandalone) {
  MINFER_REQUIRE_GPU();
  const int rows = 3;
  for (int width : {4864, 18944, 13824}) {
    const size_t n = size_t(rows) * size_t(width);
    const auto g = random_normal(n, 2.0f, 6), u = random_normal(n, 1.0f, 7);
    DeviceBuffer<float> dg(g), du(u), y_fused(n), y_plain(n);
    DeviceBuffer<uint16_t> b_fused(n), b_plain(n);
    DevicePlane q_fused(rows, width), q_plain(rows, width);
    cuda::launch_swiglu(dg.get(), du.get(), y_fused.get(), rows, width, q_fused.plane, rows, nullptr, b_fused.get());
    cuda::launch_swiglu(dg.get(), du.get(), y_plain.get(), rows, width, {}, 0, nullptr);
    cuda::launch_quantize_q8(y_plain.get(), width, q_plain.plane, rows, width, nullptr);
    cuda::launch_prefill_activation_bf16(y_plain.get(), b_plain.get(), int64_t(n), nullptr);
    const auto yf = y_fused.download(), yp = y_plain.download();
    ASSERT_EQ(std::memcmp(yf.data(), yp.data(), yf.size() * 4), 0);
    const auto bf = b_fused.download(), bp = b_plain.download();
    ASSERT_EQ(std::memcmp(bf.data(), bp.data(), bf.size() * 2), 0) << width;
    ASSERT_TRUE(same_pad40(q_fused.to_pad40(), q_plain.to_pad40()));
    ASSERT_TRUE(same_pad40(q_fused.to_pad40(), quantize_pad40_cpu(yf, rows, width)));
    for (size_t i = 0; i < n; ++i) ASSERT_NEAR(yf[i], swiglu_ref(g[i], u[i]), 1e-5 * (1 + std::fabs(swiglu_ref(g[i], u[i]))));
  }
}

// The wgmma decode matmul's operand image as rms_norm and swiglu write it beside their q8 plane is
// the image the matmul's own builder writes from that plane: both formats, 40 and 64 token rows,
// rms_norm's row kernel and (a row stride that is no multiple of 4) its generic kernel, which
// leaves the image to the builder. Both images start zeroed (the builder writes zeros in the token
// rows past its count; a q6_K image has no digits).
TEST(GpuKernels, ProducersWriteTheBuildersOperandImage) {
  MINFER_REQUIRE_GPU();
  for (int rows : {40, 64})
    for (cuda::OperandFormat format : {cuda::OperandFormat::Q4K, cuda::OperandFormat::Q6K}) {
      const auto check = [&](const char* producer, int width, const auto& produce) {
        const size_t bytes = size_t(cuda::wgmma_operand_bytes(width));
        DeviceBuffer<uint8_t> fused(std::vector<uint8_t>(bytes, 0)), built(std::vector<uint8_t>(bytes, 0));
        DevicePlane q(rows, width);
        produce(q.plane, cuda::OperandImage{fused.get(), format});
        cuda::launch_build_operand_image(q.plane, rows, width, {built.get(), format}, nullptr);
        const auto f = fused.download(), b = built.download();
        ASSERT_TRUE(std::any_of(b.begin(), b.end(), [](uint8_t x) { return x != 0; })) << producer;
        ASSERT_EQ(std::memcmp(f.data(), b.data(), bytes), 0)
            << producer << " width " << width << " rows " << rows << " format " << int(format);
      };
      for (int width : {3584, 5120})
        for (int pad : {4, 1}) {
          const int ld_x = width + pad;
          const auto x = random_normal(size_t(rows) * size_t(ld_x), 2.0f, 8 + uint64_t(width));
          const auto w = random_normal(size_t(width), 1.0f, 9 + uint64_t(width));
          DeviceBuffer<float> dx(x), dw(w), y(size_t(rows) * size_t(width));
          check(pad == 4 ? "rms_norm rows" : "rms_norm generic", width,
                [&](const cuda::Q8Plane& plane, const cuda::OperandImage& image) {
                  cuda::launch_rms_norm(dx.get(), ld_x, dw.get(), y.get(), width, rows, width, 0, 1e-6f, plane, rows,
                                        nullptr, nullptr, image);
                });
        }
      for (int width : {4864, 18944}) {
        const size_t n = size_t(rows) * size_t(width);
        const auto g = random_normal(n, 2.0f, 10 + uint64_t(width)), u = random_normal(n, 1.0f, 11 + uint64_t(width));
        DeviceBuffer<float> dg(g), du(u), y(n);
        check("swiglu", width, [&](const cuda::Q8Plane& plane, const cuda::OperandImage& image) {
          cuda::launch_swiglu(dg.get(), du.get(), y.get(), rows, width, plane, rows, nullptr, nullptr, image);
        });
      }
    }
}

// Rows whose blocks are not whole (a short last block) or not 16-byte aligned take the scalar path.
TEST(GpuKernels, SwigluOddWidthsMatchDoubleReference) {
  MINFER_REQUIRE_GPU();
  const int rows = 2;
  for (int width : {1000, 997, 31}) {
    const size_t n = size_t(rows) * size_t(width);
    const auto g = random_normal(n, 2.0f, 8), u = random_normal(n, 1.0f, 9);
    DeviceBuffer<float> dg(g), du(u), y(n);
    cuda::launch_swiglu(dg.get(), du.get(), y.get(), rows, width, {}, 0, nullptr);
    const auto got = y.download();
    for (size_t i = 0; i < n; ++i)
      ASSERT_NEAR(got[i], swiglu_ref(g[i], u[i]), 1e-5 * (1 + std::fabs(swiglu_ref(g[i], u[i])))) << width << " " << i;
  }
}

const GgmlType kWeightTypes[] = {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0,
                                 GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                                 GgmlType::F16, GgmlType::BF16, GgmlType::F32};

struct Mv {
  std::vector<float> out;
  std::vector<float> ref;  // CPU vec_dot_pad40 / vec_dot_f32
  std::vector<double> mag; // sum |w_i x_i| per output, for the tolerance
};

Mv run_matvec(GgmlType t, int rows, int cols, int n_tokens, uint64_t salt) {
  const auto wf = random_normal(static_cast<size_t>(rows) * cols, 0.5f, salt);
  const auto x = random_normal(static_cast<size_t>(n_tokens) * cols, 1.0f, salt + 1);
  const auto wq = quantize_matrix(t, wf, rows, cols);
  auto xq = quantize_pad40_cpu(x, n_tokens, cols);
  DeviceBuffer<uint8_t> dw(test::weights_image(t, cols, wq));
  DevicePlane dxq(xq, n_tokens, cols);
  DeviceBuffer<float> dx(x), dout(static_cast<size_t>(n_tokens) * rows);
  cuda::MatSeg seg;
  seg.w = {t, rows, cols, dw.get()};
  seg.out = dout.get();
  seg.ld_out = rows;
  cuda::launch_matvec(&seg, 1, dxq.plane, dx.get(), cols, n_tokens, {}, nullptr);
  Mv mv;
  mv.out = dout.download();
  std::vector<float> wrow(static_cast<size_t>(cols)), xd(static_cast<size_t>(cols));
  for (int tk = 0; tk < n_tokens; ++tk) {
    const BlockQ8Pad40* xb = pad40_row(xq, tk, cols);
    dequantize_row_pad40(xb, xd.data(), cols);
    for (int r = 0; r < rows; ++r) {
      const uint8_t* wr = wq.data() + row_bytes(t, cols) * size_t(r);
      const bool quant = type_traits(t).quantized;
      mv.ref.push_back(quant ? vec_dot_pad40(t, wr, xb, cols) : vec_dot_f32(t, wr, x.data() + size_t(tk) * cols, cols));
      dequantize_row(t, wr, wrow.data(), cols);
      double m = 0;
      for (int i = 0; i < cols; ++i)
        m += std::fabs(double(wrow[size_t(i)]) * (quant ? xd[size_t(i)] : x[size_t(tk) * cols + size_t(i)]));
      mv.mag.push_back(m);
    }
  }
  return mv;
}

TEST(GpuKernels, MatVecMatchesCpuDotForEveryType) {
  MINFER_REQUIRE_GPU();
  for (GgmlType t : kWeightTypes) {
    for (int n_tokens : {1, 3, 11}) {
      const int rows = 67, cols = 768;
      const Mv mv = run_matvec(t, rows, cols, n_tokens, 20 + uint64_t(t));
      for (size_t i = 0; i < mv.out.size(); ++i)
        ASSERT_NEAR(mv.out[i], mv.ref[i], 2e-6 * mv.mag[i] + 1e-6)
            << type_traits(t).name << " tokens " << n_tokens << " output " << i;
    }
  }
}

// The one-token matvec at a real row length (7B hidden size) matches the CPU dot and gives the same
// bits on every run (a CUDA graph replays it thousands of times).
TEST(GpuKernels, MatVecOneTokenAtModelWidthMatchesCpuAndIsDeterministic) {
  MINFER_REQUIRE_GPU();
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0}) {
    const int rows = 301, cols = 3584;
    const Mv a = run_matvec(t, rows, cols, 1, 60 + uint64_t(t));
    const Mv b = run_matvec(t, rows, cols, 1, 60 + uint64_t(t));
    ASSERT_EQ(std::memcmp(a.out.data(), b.out.data(), a.out.size() * 4), 0)
        << type_traits(t).name << " is not deterministic";
    for (size_t i = 0; i < a.out.size(); ++i)
      ASSERT_NEAR(a.out[i], a.ref[i], 2e-6 * a.mag[i] + 1e-6) << type_traits(t).name << " output " << i;
  }
}

TEST(GpuKernels, MatVecMultiTokenIsBitwiseThePerTokenResult) {
  MINFER_REQUIRE_GPU();
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::F16}) {
    const int rows = 34, cols = 512, n = 5;
    const auto wf = random_normal(static_cast<size_t>(rows) * cols, 0.5f, 40);
    const auto x = random_normal(static_cast<size_t>(n) * cols, 1.0f, 41);
    const auto wq = quantize_matrix(t, wf, rows, cols);
    DeviceBuffer<uint8_t> dw(test::weights_image(t, cols, wq));
    DevicePlane dxq(quantize_pad40_cpu(x, n, cols), n, cols);
    DeviceBuffer<float> dx(x), all(static_cast<size_t>(n) * rows), one(static_cast<size_t>(n) * rows);
    cuda::MatSeg seg;
    seg.w = {t, rows, cols, dw.get()};
    seg.out = all.get();
    seg.ld_out = rows;
    cuda::launch_matvec(&seg, 1, dxq.plane, dx.get(), cols, n, {}, nullptr);
    for (int tk = 0; tk < n; ++tk) {
      seg.out = one.get() + size_t(tk) * rows;
      cuda::launch_matvec(&seg, 1, dxq.plane.from_token(tk), dx.get() + size_t(tk) * cols, cols, 1, {}, nullptr);
    }
    const auto a = all.download(), b = one.download();
    ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << type_traits(t).name;
  }
}

// With unit scales the float part of every dot is exact, so the GPU must hit the integer sum.
TEST(GpuKernels, MatVecIntegerDotIsExact) {
  MINFER_REQUIRE_GPU();
  std::mt19937_64 rng(seed() + 50);
  const int rows = 16, cols = 512;
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::Q4_0,
                     GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1}) {
    const TypeTraits tt = type_traits(t);
    std::vector<uint8_t> w(row_bytes(t, cols) * rows);
    for (auto& b : w) b = uint8_t(rng());
    const uint16_t one = f32_to_f16(1.0f);
    for (size_t blk = 0; blk < w.size() / size_t(tt.type_size); ++blk) {
      uint8_t* b = w.data() + blk * size_t(tt.type_size);
      if (t == GgmlType::Q6_K) {
        std::memcpy(b + 208, &one, 2);
        for (int s = 0; s < 16; ++s) b[192 + s] = uint8_t(int8_t(int(rng() % 17) - 8));
      } else {
        std::memcpy(b, &one, 2);
        if (t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q4_1 || t == GgmlType::Q5_1)
          std::memcpy(b + 2, &one, 2);
      }
    }
    // activations: integers with one +-127 per block, so d = 1 exactly and q = x
    std::vector<float> x(static_cast<size_t>(cols));
    for (int i = 0; i < cols; ++i) x[size_t(i)] = float(int(rng() % 5) - 2);
    for (int b = 0; b < cols / 32; ++b) x[size_t(32 * b + int(rng() % 32))] = (rng() & 1) ? 127.0f : -127.0f;
    DeviceBuffer<uint8_t> dw(test::weights_image(t, cols, w));
    DevicePlane dxq(quantize_pad40_cpu(x, 1, cols), 1, cols);
    DeviceBuffer<float> dout(static_cast<size_t>(rows));
    cuda::MatSeg seg;
    seg.w = {t, rows, cols, dw.get()};
    seg.out = dout.get();
    seg.ld_out = rows;
    cuda::launch_matvec(&seg, 1, dxq.plane, nullptr, cols, 1, {}, nullptr);
    const auto out = dout.download();
    std::vector<float> wr(static_cast<size_t>(cols));
    for (int r = 0; r < rows; ++r) {
      dequantize_row(t, w.data() + row_bytes(t, cols) * size_t(r), wr.data(), cols);
      double exact = 0;
      for (int i = 0; i < cols; ++i) exact += double(wr[size_t(i)]) * x[size_t(i)];
      ASSERT_EQ(double(out[size_t(r)]), exact) << tt.name << " row " << r;
    }
  }
}

// The device layout (host code: no GPU needed): q6_K blocks kQ6KDeviceBlockBytes apart, each its
// 210 GGUF bytes and zeros after, its rows zero-padded to a multiple of 16 bytes (rows of 2, 3 and
// 4 groups: 8, 4 and no bytes of padding); other types' bytes as they are; and the upload's chunks
// (runs of whole rows) give the same bytes as the whole matrix at once.
TEST(GpuKernels, DeviceLayoutPadsOnlyQ6K) {
  for (GgmlType t : {GgmlType::Q6_K, GgmlType::Q4_K, GgmlType::Q8_0})
    for (const int cols : {512, 768, 1024}) {
      const int rows = 7;
      const auto w = quantize_matrix(t, random_normal(static_cast<size_t>(rows) * cols, 1.0f, 90), rows, cols);
      const std::vector<uint8_t> dev = cuda::device_layout(t, cols, w);
      const size_t block = type_traits(t).type_size, row = row_bytes(t, cols);
      const size_t stride = t == GgmlType::Q6_K ? size_t(cuda::kQ6KDeviceBlockBytes) : block;
      const size_t dev_row = size_t(cuda::device_row_bytes(t, cols));
      const std::string what = std::string(type_traits(t).name) + " cols " + std::to_string(cols);
      ASSERT_EQ(dev_row, t == GgmlType::Q6_K ? (cols / 256 * 212 + 15) / 16 * 16 : row) << what;
      ASSERT_EQ(dev.size(), size_t(rows) * dev_row) << what;
      for (int r = 0; r < rows; ++r) {
        const uint8_t* d = dev.data() + size_t(r) * dev_row;
        const size_t blocks = row / block;
        for (size_t b = 0; b < blocks; ++b) {
          ASSERT_EQ(std::memcmp(d + b * stride, w.data() + size_t(r) * row + b * block, block), 0) << what << " row " << r;
          for (size_t i = block; i < stride; ++i) ASSERT_EQ(d[b * stride + i], 0) << what << " row " << r;
        }
        for (size_t i = blocks * stride; i < dev_row; ++i) ASSERT_EQ(d[i], 0) << what << " row " << r << " byte " << i;
      }
      std::vector<uint8_t> chunked(dev.size(), 0xAA);
      for (int r = 0; r < rows; r += 3)
        cuda::copy_rows_to_device_layout(t, cols, w.data() + size_t(r) * row, std::min(3, rows - r),
                                         chunked.data() + size_t(r) * dev_row);
      EXPECT_EQ(chunked, dev) << what;
    }
  EXPECT_THROW(cuda::device_layout(GgmlType::Q6_K, 256, std::vector<uint8_t>(211)), Error);
  EXPECT_THROW(cuda::device_layout(GgmlType::Q6_K, 512, std::vector<uint8_t>(210 * 3)), Error);
}

TEST(GpuKernels, DequantizeRowsMatchesCpu) {
  MINFER_REQUIRE_GPU();
  for (GgmlType t : kWeightTypes) {
    const int rows = 6, cols = 512;
    const auto wf = random_normal(static_cast<size_t>(rows) * cols, 1.0f, 60);
    const auto wq = quantize_matrix(t, wf, rows, cols);
    DeviceBuffer<uint8_t> dw(test::weights_image(t, cols, wq));
    DeviceBuffer<float> out(static_cast<size_t>(3) * cols);
    cuda::launch_dequantize_rows({t, rows, cols, dw.get()}, 2, 3, out.get(), nullptr);
    const auto g = out.download();
    std::vector<float> ref(static_cast<size_t>(cols));
    for (int r = 0; r < 3; ++r) {
      dequantize_row(t, wq.data() + row_bytes(t, cols) * size_t(r + 2), ref.data(), cols);
      for (int i = 0; i < cols; ++i)
        ASSERT_NEAR(g[size_t(r * cols + i)], ref[size_t(i)], 1e-6 * (1 + std::fabs(ref[size_t(i)])))
            << type_traits(t).name;
    }
  }
}

// The qkv launch's rope and KV-cache epilogues against matvec + rope kernel + kv_append, for both
// decode matmul kernels and several tokens at different positions and cache slots; at one token
// fragment also with a q4_K v on one SM, where the launch's 48 row tiles of 2 groups take the
// kernel with the activations in shared memory, and with a q4_K v and rows of 9 groups on 24, 16
// and 12 SMs, where they stream through the weight ring at two, three and four CTAs an SM (the 7B's
// and the 14B's q/k/v launches in their q4_K-v layers on an H200).
TEST(GpuKernels, FusedQkvRopeKvEqualsUnfusedPath) {
  MINFER_REQUIRE_GPU();
  const int hd = 64, n_head = 8, n_kv = 2, n_slots = 64;
  const int qw = n_head * hd, kvw = n_kv * hd;
  // 3 tokens: one token fragment; 40: a 32-token tile and a part of the next
  for (const auto& [kernel, n] : {std::pair{"matvec", 3}, {"mma", 3}, {"mma shared activations", 3},
                                  {"mma weight ring", 3}, {"mma weight ring 3 CTAs an SM", 3},
                                  {"mma weight ring 4 CTAs an SM", 3}, {"matvec", 40}, {"mma", 40}}) {
    const bool mma = std::string(kernel) != "matvec", shared = std::string(kernel) == "mma shared activations";
    const int ring_ctas_per_sm = std::string(kernel) == "mma weight ring"                ? 2
                                 : std::string(kernel) == "mma weight ring 3 CTAs an SM" ? 3
                                 : std::string(kernel) == "mma weight ring 4 CTAs an SM" ? 4
                                                                                        : 0;
    const int dim = ring_ctas_per_sm ? 9 * 256 : 512;
    for (bool neox : {true, false}) {
      const GgmlType types[3] = {GgmlType::Q4_K, GgmlType::Q4_K,
                                 shared || ring_ctas_per_sm ? GgmlType::Q4_K : GgmlType::Q6_K};
      const int widths[3] = {qw, kvw, kvw};
      std::vector<std::unique_ptr<DeviceBuffer<uint8_t>>> w;
      std::vector<std::unique_ptr<DeviceBuffer<float>>> bias;
      for (int s = 0; s < 3; ++s) {
        const auto wf = random_normal(static_cast<size_t>(widths[s]) * dim, 0.3f, 70 + uint64_t(s));
        w.push_back(std::make_unique<DeviceBuffer<uint8_t>>(
            test::weights_image(types[s], dim, quantize_matrix(types[s], wf, widths[s], dim))));
        bias.push_back(std::make_unique<DeviceBuffer<float>>(random_normal(static_cast<size_t>(widths[s]), 0.1f, 80 + uint64_t(s))));
      }
      const auto x = random_normal(static_cast<size_t>(n) * dim, 1.0f, 90);
      DevicePlane xq(quantize_pad40_cpu(x, n, dim), n, dim);
      std::vector<float> inv(static_cast<size_t>(hd / 2));
      for (int j = 0; j < hd / 2; ++j) inv[size_t(j)] = float(std::pow(1e6, -2.0 * j / hd));
      DeviceBuffer<float> dinv(inv);
      std::vector<int32_t> positions(static_cast<size_t>(n)), slot_of(static_cast<size_t>(n));
      for (int t = 0; t < n; ++t) {
        positions[size_t(t)] = (11 + 389 * t) % 1000;
        slot_of[size_t(t)] = (40 + 7 * t) % n_slots;  // distinct: 7 is prime to 64
      }
      DeviceBuffer<int32_t> pos(positions), slots(slot_of);
      DeviceBuffer<uint16_t> k1(static_cast<size_t>(n_slots * kvw)), v1(static_cast<size_t>(n_slots * kvw)),
          k2(static_cast<size_t>(n_slots * kvw)), v2(static_cast<size_t>(n_slots * kvw));
      DeviceBuffer<float> q1(static_cast<size_t>(n * qw)), q2(static_cast<size_t>(n * qw)), kf(static_cast<size_t>(n * kvw)),
          vf(static_cast<size_t>(n * kvw));
      cuda::MatVecExtra extra;
      extra.rope = {dinv.get(), hd, neox};
      extra.positions = pos.get();
      extra.slots = slots.get();
      extra.kv = {k1.get(), v1.get(), n_kv, hd};
      extra.sm_count = shared ? 1 : ring_ctas_per_sm > 0 ? 48 / ring_ctas_per_sm : 0;  // 48 row tiles
      cuda::MatSeg segs[3];
      const cuda::Epilogue epi[3] = {cuda::Epilogue::RopeQ, cuda::Epilogue::RopeK, cuda::Epilogue::StoreV};
      float* outs[3] = {q1.get(), nullptr, nullptr};
      for (int s = 0; s < 3; ++s) {
        segs[s].w = {types[s], widths[s], dim, w[size_t(s)]->get()};
        segs[s].bias = bias[size_t(s)]->get();
        segs[s].out = outs[s];
        segs[s].ld_out = widths[s];
        segs[s].epi = epi[s];
      }
      auto matmul = [&](const cuda::MatSeg* sg, int n_segs, const cuda::MatVecExtra& ex) {
        if (mma)
          cuda::launch_matmul_mma(sg, n_segs, xq.plane, n, ex, nullptr);
        else
          cuda::launch_matvec(sg, n_segs, xq.plane, nullptr, dim, n, ex, nullptr);
      };
      ASSERT_EQ(cuda::matmul_mma_shared_activations(segs, 3, n, extra), shared);
      ASSERT_EQ(cuda::matmul_mma_weight_ring_ctas_per_sm(segs, 3, n, extra), ring_ctas_per_sm);
      matmul(segs, 3, extra);
      float* plain_outs[3] = {q2.get(), kf.get(), vf.get()};
      for (int s = 0; s < 3; ++s) {
        cuda::MatSeg seg = segs[s];
        seg.epi = cuda::Epilogue::Store;
        seg.out = plain_outs[s];
        matmul(&seg, 1, {});
      }
      cuda::launch_rope(q2.get(), qw, n, n_head, extra.rope, pos.get(), nullptr);
      cuda::launch_rope(kf.get(), kvw, n, n_kv, extra.rope, pos.get(), nullptr);
      cuda::launch_kv_append(kf.get(), vf.get(), n, {k2.get(), v2.get(), n_kv, hd}, slots.get(), nullptr);
      const auto a = q1.download(), b = q2.download();
      ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << kernel << ", " << n << " tokens";
      const auto ka = k1.download(), kb = k2.download(), va = v1.download(), vb = v2.download();
      for (int slot : slot_of) {
        ASSERT_EQ(std::memcmp(ka.data() + slot * kvw, kb.data() + slot * kvw, size_t(kvw) * 2), 0) << slot;
        ASSERT_EQ(std::memcmp(va.data() + slot * kvw, vb.data() + slot * kvw, size_t(kvw) * 2), 0) << slot;
      }
    }
  }
}

// The prompt rows' fused rope and KV write gives the bits of rope on q, rope on k and kv_append,
// for both pair layouts and head sizes 64 and 128 (q rows from a padded stride).
TEST(GpuKernels, RopeKvEqualsRopeThenAppend) {
  MINFER_REQUIRE_GPU();
  const int n = 37, n_head = 7, n_kv = 2, n_slots = 64;
  for (const int hd : {64, 128})
    for (const bool neox : {true, false}) {
      const int qw = n_head * hd, ldq = qw + 8, kvw = n_kv * hd;
      std::vector<float> inv(static_cast<size_t>(hd / 2));
      for (int j = 0; j < hd / 2; ++j) inv[size_t(j)] = float(std::pow(1e6, -2.0 * j / hd));
      std::vector<int32_t> positions(static_cast<size_t>(n)), slot_of(static_cast<size_t>(n));
      for (int t = 0; t < n; ++t) {
        positions[size_t(t)] = (11 + 389 * t) % 20000;
        slot_of[size_t(t)] = (40 + 7 * t) % n_slots;  // distinct: 7 is prime to 64
      }
      DeviceBuffer<float> dinv(inv);
      DeviceBuffer<int32_t> pos(positions), slots(slot_of);
      const auto q = random_normal(size_t(n) * size_t(ldq), 1.0f, 200 + uint64_t(hd));
      const auto k = random_normal(size_t(n) * size_t(kvw), 1.0f, 201 + uint64_t(hd));
      const auto v = random_normal(size_t(n) * size_t(kvw), 1.0f, 202 + uint64_t(hd));
      DeviceBuffer<float> q1(q), q2(q), k1(k), k2(k), dv(v);
      DeviceBuffer<uint16_t> kc1(size_t(n_slots * kvw)), vc1(size_t(n_slots * kvw)), kc2(size_t(n_slots * kvw)),
          vc2(size_t(n_slots * kvw));
      const cuda::RopeParams rp{dinv.get(), hd, neox};
      cuda::launch_rope(q1.get(), ldq, n, n_head, rp, pos.get(), nullptr);
      cuda::launch_rope(k1.get(), kvw, n, n_kv, rp, pos.get(), nullptr);
      cuda::launch_kv_append(k1.get(), dv.get(), n, {kc1.get(), vc1.get(), n_kv, hd}, slots.get(), nullptr);
      cuda::launch_rope_kv(q2.get(), ldq, k2.get(), dv.get(), kvw, n, n_head, rp, {kc2.get(), vc2.get(), n_kv, hd},
                           pos.get(), slots.get(), nullptr);
      const std::string what = "head_dim " + std::to_string(hd) + (neox ? " neox" : " pairs");
      const auto qa = q1.download(), qb = q2.download(), ka = k1.download(), kb = k2.download();
      ASSERT_EQ(std::memcmp(qa.data(), qb.data(), qa.size() * 4), 0) << what;
      ASSERT_EQ(std::memcmp(ka.data(), kb.data(), ka.size() * 4), 0) << what;
      const auto kca = kc1.download(), kcb = kc2.download(), vca = vc1.download(), vcb = vc2.download();
      for (int slot : slot_of) {
        ASSERT_EQ(std::memcmp(kca.data() + slot * kvw, kcb.data() + slot * kvw, size_t(kvw) * 2), 0) << what << " " << slot;
        ASSERT_EQ(std::memcmp(vca.data() + slot * kvw, vcb.data() + slot * kvw, size_t(kvw) * 2), 0) << what << " " << slot;
      }
    }
}

// Both decode matmul kernels return exactly the canonical order's bits (quant/canonical_dot.h, the
// CPU statement of it), with bias and residual, for any token count: a token's result does not
// depend on how many tokens share the launch or which kernel runs it.
TEST(GpuKernels, DecodeMatmulsFollowTheCanonicalOrderBitForBit) {
  MINFER_REQUIRE_GPU();
  struct Shape { GgmlType t; int rows, cols; };
  const Shape shapes[] = {{GgmlType::Q4_K, 67, 768},  {GgmlType::Q5_K, 67, 768},   {GgmlType::Q6_K, 67, 768},
                          {GgmlType::Q8_0, 67, 768},  {GgmlType::Q8_0, 45, 544},   {GgmlType::Q4_K, 301, 3584},
                          {GgmlType::Q6_K, 40, 18944}, {GgmlType::Q4_K, 33, 18944}, {GgmlType::Q6_K, 132, 3584},
                          {GgmlType::Q4_K, 67, 6144}};
  for (const Shape& sh : shapes) {
    const int max_tokens = 70;
    const auto wq = quantize_matrix(sh.t, random_normal(size_t(sh.rows) * sh.cols, 0.5f, 150 + uint64_t(sh.cols)), sh.rows, sh.cols);
    const auto x = random_normal(size_t(max_tokens) * sh.cols, 1.0f, 151);
    const auto bias = random_normal(size_t(sh.rows), 0.2f, 152);
    const auto residual = random_normal(size_t(max_tokens) * sh.rows, 1.0f, 153);
    auto xq = quantize_pad40_cpu(x, max_tokens, sh.cols);
    std::vector<float> want(size_t(max_tokens) * sh.rows);
    for (int t = 0; t < max_tokens; ++t)
      for (int r = 0; r < sh.rows; ++r) {
        const float dot = canonical_dot(sh.t, wq.data() + row_bytes(sh.t, sh.cols) * size_t(r), pad40_row(xq, t, sh.cols), sh.cols);
        want[size_t(t) * sh.rows + size_t(r)] = (dot + bias[size_t(r)]) + residual[size_t(t) * sh.rows + size_t(r)];
      }
    DeviceBuffer<uint8_t> dw(test::weights_image(sh.t, sh.cols, wq));
    DevicePlane dxq(xq, max_tokens, sh.cols);
    DeviceBuffer<float> dbias(bias), dres(residual), dout(size_t(max_tokens) * sh.rows);
    // The q4_K and q6_K launches of 33..64 tokens also through the warpgroup-MMA kernel (sm_90).
    DeviceBuffer<uint8_t> operand(size_t(cuda::wgmma_operand_bytes(sh.cols)));
    cuda::MatVecExtra wgmma;
    wgmma.wgmma_operand = operand.get();
    wgmma.wgmma_operand_bytes = cuda::wgmma_operand_bytes(sh.cols);
    const bool has_wgmma = (sh.t == GgmlType::Q4_K || sh.t == GgmlType::Q6_K) && cuda::prefill_gemm_device_has_wgmma();
    // At one token fragment (<= 8 tokens) also with 3 CTAs, each taking several row tiles, with
    // two groups in flight a warp in registers (rows of more than 16 groups, on 132 SMs), with the
    // weights streamed through the weight ring (rows of more than 8 groups: on 132 SMs at two CTAs
    // an SM; 3 row tiles on one SM, at three; over several tiles a CTA on one SM: q4_K, more than 4
    // row tiles, at four; q6_K, more than 3, at three), and with the activations in shared memory
    // (q4_K rows of <= 6,144 columns — 48 KB of them beside the reduction buffer at 6,144 — more row
    // tiles than 3 CTAs an SM take at once on one SM, without the ring).
    cuda::MatVecExtra three_ctas, on_132_sms, in_registers_on_132_sms, on_one_sm, in_registers_on_one_sm;
    three_ctas.decode_ctas = 3;
    on_132_sms.sm_count = in_registers_on_132_sms.sm_count = 132;
    in_registers_on_132_sms.weights_in_registers = in_registers_on_one_sm.weights_in_registers = true;
    on_one_sm.sm_count = in_registers_on_one_sm.sm_count = 1;
    for (const char* kernel : {"matvec", "mma", "mma 3 CTAs", "mma two groups", "mma weight ring",
                               "mma weight ring 3 CTAs an SM", "mma weight ring over tiles", "mma shared activations",
                               "wgmma"})
      for (int n : {1, 2, 5, 8, 9, 16, 17, 33, 40, 64, 70}) {
        const bool wgmma_kernel = std::string(kernel) == "wgmma", few_ctas = std::string(kernel) == "mma 3 CTAs";
        const bool two_groups = std::string(kernel) == "mma two groups", ring = std::string(kernel) == "mma weight ring";
        const bool ring3 = std::string(kernel) == "mma weight ring 3 CTAs an SM";
        const bool ring_over_tiles = std::string(kernel) == "mma weight ring over tiles";
        const bool shared = std::string(kernel) == "mma shared activations";
        if (wgmma_kernel && !(has_wgmma && n >= cuda::kWgmmaMinTokens && n <= 64)) continue;
        if (few_ctas && n > 8) continue;
        if (two_groups && (n > 8 || sh.t == GgmlType::Q8_0 || sh.cols <= 16 * 256)) continue;
        if (ring && (n > 8 || sh.t == GgmlType::Q8_0 || sh.cols <= 8 * 256)) continue;
        if (ring3 && (n > 8 || sh.t == GgmlType::Q8_0 || sh.cols <= 8 * 256 || (sh.rows + 15) / 16 != 3)) continue;
        if (ring_over_tiles && (n > 8 || (sh.t != GgmlType::Q4_K && sh.t != GgmlType::Q6_K) || sh.cols <= 8 * 256 ||
                                (sh.rows + 15) / 16 <= (sh.t == GgmlType::Q4_K ? 4 : 3)))
          continue;
        if (shared && (n > 8 || sh.t != GgmlType::Q4_K || sh.cols > 6144)) continue;
        cuda::MatSeg seg;
        seg.w = {sh.t, sh.rows, sh.cols, dw.get()};
        seg.bias = dbias.get();
        seg.residual = dres.get();
        seg.out = dout.get();
        seg.ld_out = sh.rows;
        cuda_ok(cudaMemset(dout.get(), 0xFF, size_t(max_tokens) * sh.rows * 4));
        if (wgmma_kernel) {
          ASSERT_TRUE(cuda::matmul_wgmma_takes(&seg, 1, n, wgmma));
          cuda::launch_matmul_mma(&seg, 1, dxq.plane, n, wgmma, nullptr);
        } else if (few_ctas) {
          cuda::launch_matmul_mma(&seg, 1, dxq.plane, n, three_ctas, nullptr);
        } else if (two_groups) {
          ASSERT_TRUE(cuda::matmul_mma_two_groups_in_flight(&seg, 1, n, in_registers_on_132_sms));
          cuda::launch_matmul_mma(&seg, 1, dxq.plane, n, in_registers_on_132_sms, nullptr);
        } else if (ring) {
          ASSERT_EQ(cuda::matmul_mma_weight_ring_ctas_per_sm(&seg, 1, n, on_132_sms), 2);
          cuda::launch_matmul_mma(&seg, 1, dxq.plane, n, on_132_sms, nullptr);
        } else if (ring3) {
          ASSERT_EQ(cuda::matmul_mma_weight_ring_ctas_per_sm(&seg, 1, n, on_one_sm), 3);
          cuda::launch_matmul_mma(&seg, 1, dxq.plane, n, on_one_sm, nullptr);
        } else if (ring_over_tiles) {
          ASSERT_TRUE(cuda::matmul_mma_weight_ring_over_tiles(&seg, 1, n, on_one_sm));
          cuda::launch_matmul_mma(&seg, 1, dxq.plane, n, on_one_sm, nullptr);
        } else if (shared) {
          ASSERT_TRUE(cuda::matmul_mma_shared_activations(&seg, 1, n, in_registers_on_one_sm));
          cuda::launch_matmul_mma(&seg, 1, dxq.plane, n, in_registers_on_one_sm, nullptr);
        } else if (std::string(kernel) == "mma") {
          cuda::launch_matmul_mma(&seg, 1, dxq.plane, n, {}, nullptr);
        } else {
          cuda::launch_matvec(&seg, 1, dxq.plane, nullptr, sh.cols, n, {}, nullptr);
        }
        const auto got = dout.download();
        for (size_t i = 0; i < size_t(n) * sh.rows; ++i)
          ASSERT_EQ(got[i], want[i]) << type_traits(sh.t).name << " " << sh.rows << "x" << sh.cols << " " << kernel
                                     << " tokens " << n << " output " << i;
      }
  }
}

// segs launched with `tried` and again with `reference`, each into outputs of its own (n tokens,
// ld_out the segment's rows): the same bits in every segment's outputs.
void expect_same_decode_matmul_bits(std::vector<cuda::MatSeg> segs, const cuda::Q8Plane& plane, int n,
                                    const cuda::MatVecExtra& tried, const cuda::MatVecExtra& reference,
                                    const std::string& what) {
  std::vector<std::vector<float>> got[2];
  for (int v = 0; v < 2; ++v) {
    std::vector<std::unique_ptr<DeviceBuffer<float>>> out;
    for (cuda::MatSeg& seg : segs) {
      out.push_back(std::make_unique<DeviceBuffer<float>>(size_t(n) * size_t(seg.w.rows)));
      seg.out = out.back()->get();
      seg.ld_out = seg.w.rows;
    }
    cuda::launch_matmul_mma(segs.data(), int(segs.size()), plane, n, v == 0 ? tried : reference, nullptr);
    for (const auto& o : out) got[v].push_back(o->download());
  }
  for (size_t s = 0; s < segs.size(); ++s)
    ASSERT_EQ(std::memcmp(got[0][s].data(), got[1][s].data(), got[0][s].size() * 4), 0)
        << what << ", tokens " << n << ", segment " << s;
}

// A preset's gate and up weights (q4_K, random rows) on the device, as the two segments of its
// gate+up launch.
struct GateUp {
  std::vector<std::unique_ptr<DeviceBuffer<uint8_t>>> w;
  std::vector<cuda::MatSeg> segs;
  GateUp(const synth::Preset& preset, uint64_t seed) {
    for (int s = 0; s < 2; ++s) {
      w.push_back(std::make_unique<DeviceBuffer<uint8_t>>(test::weights_image(
          GgmlType::Q4_K, preset.n_embd, test::random_weight_rows(GgmlType::Q4_K, preset.n_ff, preset.n_embd, seed + uint64_t(s)))));
      cuda::MatSeg seg;
      seg.w = {GgmlType::Q4_K, preset.n_ff, preset.n_embd, w.back()->get()};
      segs.push_back(seg);
    }
  }
};

// The 7B's gate+up launch (2,368 row tiles, q4_K) and head (9,504, q6_K) at 1, 5 and 8 tokens:
// with CTAs taking several row tiles each (the backend's launch on an H200's 132 SMs: gate+up
// through the weight ring at four CTAs an SM, the head through it at three; and both with the
// weights in registers) the bits of one CTA a row tile.
TEST(GpuKernels, DecodeMatmulCtasTakingSeveralRowTilesKeepTheBits) {
  MINFER_REQUIRE_GPU();
  const synth::Preset& preset = synth::find_preset("qwen2.5-7b");
  cuda::MatVecExtra several, in_registers, one_a_tile;
  several.sm_count = in_registers.sm_count = 132;
  several.activations_from_global = in_registers.activations_from_global = true;
  in_registers.weights_in_registers = true;
  one_a_tile.decode_ctas = -1;
  const int cols = preset.n_embd;
  DevicePlane plane(quantize_pad40_cpu(random_normal(size_t(8) * cols, 1.0f, 181), 8, cols), 8, cols);
  const GateUp gate_up(preset, 180);
  DeviceBuffer<uint8_t> head(
      test::weights_image(GgmlType::Q6_K, cols, test::random_weight_rows(GgmlType::Q6_K, preset.n_vocab, cols, 182)));
  cuda::MatSeg head_seg;
  head_seg.w = {GgmlType::Q6_K, preset.n_vocab, cols, head.get()};
  ASSERT_TRUE(cuda::matmul_mma_weight_ring_over_tiles(gate_up.segs.data(), 2, 1, several));
  ASSERT_FALSE(cuda::matmul_mma_weight_ring_over_tiles(gate_up.segs.data(), 2, 1, in_registers));
  ASSERT_FALSE(cuda::matmul_mma_weight_ring_over_tiles(gate_up.segs.data(), 2, 1, one_a_tile));
  ASSERT_TRUE(cuda::matmul_mma_weight_ring_over_tiles(&head_seg, 1, 1, several));
  ASSERT_FALSE(cuda::matmul_mma_weight_ring_over_tiles(&head_seg, 1, 1, in_registers));
  for (int n : {1, 5, 8}) {
    expect_same_decode_matmul_bits(gate_up.segs, plane.plane, n, several, one_a_tile, "q4_K gate+up, ring");
    expect_same_decode_matmul_bits(gate_up.segs, plane.plane, n, in_registers, one_a_tile, "q4_K gate+up");
    expect_same_decode_matmul_bits({head_seg}, plane.plane, n, several, one_a_tile, "q6_K head, ring");
    expect_same_decode_matmul_bits({head_seg}, plane.plane, n, in_registers, one_a_tile, "q6_K head");
  }
}

// The 7B's and the 14B's gate+up launches (q4_K, 3,584 and 5,120 columns) at 1, 5 and 8 tokens:
// with the activations in each CTA's shared memory at four CTAs an SM (the backend's launch on an
// H200's 132 SMs without the weight ring) the bits of B from global memory; and through the
// weight ring over several tiles a CTA (the backend's launch) the same bits.
TEST(GpuKernels, DecodeMatmulWithSharedActivationsKeepsTheBits) {
  MINFER_REQUIRE_GPU();
  cuda::MatVecExtra shared, global, ring;
  shared.sm_count = global.sm_count = ring.sm_count = 132;
  shared.weights_in_registers = global.weights_in_registers = true;
  global.activations_from_global = true;
  for (const char* name : {"qwen2.5-7b", "qwen2.5-14b"}) {
    const synth::Preset& preset = synth::find_preset(name);
    const int cols = preset.n_embd;
    DevicePlane plane(quantize_pad40_cpu(random_normal(size_t(8) * cols, 1.0f, 250), 8, cols), 8, cols);
    const GateUp gate_up(preset, 251);
    ASSERT_TRUE(cuda::matmul_mma_shared_activations(gate_up.segs.data(), 2, 1, shared)) << name;
    ASSERT_FALSE(cuda::matmul_mma_shared_activations(gate_up.segs.data(), 2, 1, global)) << name;
    ASSERT_FALSE(cuda::matmul_mma_shared_activations(gate_up.segs.data(), 2, 1, ring)) << name;
    ASSERT_TRUE(cuda::matmul_mma_weight_ring_over_tiles(gate_up.segs.data(), 2, 1, ring)) << name;
    for (int n : {1, 5, 8}) {
      expect_same_decode_matmul_bits(gate_up.segs, plane.plane, n, shared, global, name);
      expect_same_decode_matmul_bits(gate_up.segs, plane.plane, n, ring, global, std::string(name) + ", ring");
    }
  }
}

// A preset's one-tile weight-ring launches (down in q4_K and q6_K, o, q, a q6_K v; rings at two
// and three CTAs an SM) and an eighth of its q6_K head (the ring over several tiles a CTA).
struct RingShape {
  GgmlType t;
  int rows, cols;
  const char* what;
};
std::vector<RingShape> ring_shapes(const synth::Preset& preset) {
  const int d = preset.n_embd, ff = preset.n_ff, q_rows = preset.n_head * preset.head_dim;
  return {{GgmlType::Q4_K, d, ff, "down q4_K"}, {GgmlType::Q6_K, d, ff, "down q6_K"},
          {GgmlType::Q4_K, d, q_rows, "o"},     {GgmlType::Q4_K, q_rows, d, "q"},
          {GgmlType::Q6_K, preset.n_head_kv * preset.head_dim, d, "v q6_K"},
          {GgmlType::Q6_K, preset.n_vocab / 8, d, "head q6_K (an eighth)"}};
}
// check(shape, segment, plane of 8 tokens, what) for each shape, its weights random rows on the
// device (seed + 1 + rows) and its plane random activations (seed).
template <typename Check>
void for_each_ring_shape(const char* name, const std::vector<RingShape>& shapes, uint64_t seed, Check check) {
  for (const RingShape& sh : shapes) {
    DevicePlane plane(quantize_pad40_cpu(random_normal(size_t(8) * sh.cols, 1.0f, seed), 8, sh.cols), 8, sh.cols);
    DeviceBuffer<uint8_t> w(test::weights_image(
        sh.t, sh.cols, test::random_weight_rows(sh.t, sh.rows, sh.cols, seed + 1 + uint64_t(sh.rows))));
    cuda::MatSeg seg;
    seg.w = {sh.t, sh.rows, sh.cols, w.get()};
    check(sh, seg, plane.plane, std::string(name) + " " + sh.what);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// The 7B's and the 14B's ring shapes at one token, B holding 8 tokens: forming only token 0's
// column of each product gives the bits of every column (MatVecExtra::every_token_column), as the
// ring forms at 2..8.
TEST(GpuKernels, OneTokenColumnKeepsTheBits) {
  MINFER_REQUIRE_GPU();
  cuda::MatVecExtra one_column, every_column;
  one_column.sm_count = every_column.sm_count = 132;
  every_column.every_token_column = true;
  for (const char* name : {"qwen2.5-7b", "qwen2.5-14b"}) {
    for_each_ring_shape(name, ring_shapes(synth::find_preset(name)), 270,
                        [&](const RingShape&, const cuda::MatSeg& seg, const cuda::Q8Plane& plane, const std::string& what) {
                          ASSERT_TRUE(cuda::matmul_mma_weight_ring_ctas_per_sm(&seg, 1, 1, one_column) > 0 ||
                                      cuda::matmul_mma_weight_ring_over_tiles(&seg, 1, 1, one_column))
                              << what;
                          expect_same_decode_matmul_bits({seg}, plane, 1, one_column, every_column, what);
                        });
    if (HasFatalFailure()) return;
  }
}

// The weight rings' rounds by tensor copies, a copy a half tile, give the bits of a bulk copy a row
// (MatVecExtra::ring_row_copies) at 1, 5 and 8 tokens: the 7B's and the 14B's ring shapes, o and a
// q6_K down with a last tile of 5 rows (whose missing rows the copies zero-fill) and gate+up (two segments,
// several tiles a CTA), q6_K among them in rows of groups 2 modulo 4 (the 7B's down, v and head,
// the 14B's down: rows the device layout pads by 8 bytes so that a box may start at each).
TEST(GpuKernels, RingTensorCopiesKeepTheBits) {
  MINFER_REQUIRE_GPU();
  cuda::MatVecExtra tensor, rows;
  tensor.sm_count = rows.sm_count = 132;
  rows.ring_row_copies = true;
  for (const char* name : {"qwen2.5-7b", "qwen2.5-14b"}) {
    const synth::Preset& preset = synth::find_preset(name);
    const int d = preset.n_embd;
    std::vector<RingShape> shapes = ring_shapes(preset);
    shapes.push_back({GgmlType::Q4_K, d + 5, preset.n_head * preset.head_dim, "o, a partial tile"});
    shapes.push_back({GgmlType::Q6_K, d + 5, preset.n_ff, "down q6_K, a partial tile"});
    for_each_ring_shape(name, shapes, 290,
                        [&](const RingShape& sh, const cuda::MatSeg& seg, const cuda::Q8Plane& plane, const std::string& what) {
                          ASSERT_TRUE(cuda::matmul_mma_ring_tensor_copies(&seg, 1, 1, tensor)) << what;
                          ASSERT_FALSE(cuda::matmul_mma_ring_tensor_copies(&seg, 1, 1, rows)) << what;
                          for (int n : {1, 5, 8}) expect_same_decode_matmul_bits({seg}, plane, n, tensor, rows, what);
                        });
    if (HasFatalFailure()) return;
    DevicePlane plane(quantize_pad40_cpu(random_normal(size_t(8) * d, 1.0f, 292), 8, d), 8, d);
    const GateUp gate_up(preset, 293);
    ASSERT_TRUE(cuda::matmul_mma_weight_ring_over_tiles(gate_up.segs.data(), 2, 1, tensor)) << name;
    ASSERT_TRUE(cuda::matmul_mma_ring_tensor_copies(gate_up.segs.data(), 2, 1, tensor)) << name;
    for (int n : {1, 5, 8})
      expect_same_decode_matmul_bits(gate_up.segs, plane.plane, n, tensor, rows, std::string(name) + " gate+up");
  }
}

// The 7B's and the 14B's gate+up launch with the swiglu in its epilogue (the weight ring over
// several tiles, each tile gate rows above the same up rows; the CTA counting a 256-column group's
// 32nd tile quantizes it) at 1, 5 and 8 tokens: the bits of the launch, then the swiglu kernel, in
// the values and the q8 plane; the counters end at zero, so a second launch on them gives them
// again.
TEST(GpuKernels, SwigluInTheGateUpEpilogueKeepsTheBits) {
  MINFER_REQUIRE_GPU();
  cuda::MatVecExtra ring, every_column;  // the reference forms every column at one token too
  ring.sm_count = every_column.sm_count = 132;
  every_column.every_token_column = true;
  for (const char* name : {"qwen2.5-7b", "qwen2.5-14b"}) {
    const synth::Preset& preset = synth::find_preset(name);
    const int cols = preset.n_embd, ff = preset.n_ff;
    DevicePlane plane(quantize_pad40_cpu(random_normal(size_t(8) * cols, 1.0f, 260), 8, cols), 8, cols);
    const GateUp gate_up(preset, 261);
    DeviceBuffer<int32_t> counts(std::vector<int32_t>(size_t(ff / 256), 0));
    for (int n : {1, 5, 8}) {
      const size_t values = size_t(n) * size_t(ff);
      DeviceBuffer<float> gate(values), up(values), plain(values);
      DevicePlane plain_q8(n, ff);
      std::vector<cuda::MatSeg> segs = gate_up.segs;
      segs[0].out = gate.get();
      segs[1].out = up.get();
      segs[0].ld_out = segs[1].ld_out = ff;
      cuda::launch_matmul_mma(segs.data(), 2, plane.plane, n, every_column, nullptr);
      cuda::launch_swiglu(gate.get(), up.get(), plain.get(), n, ff, plain_q8.plane, n, nullptr);
      const auto want = plain.download();
      ASSERT_TRUE(cuda::matmul_mma_swiglu_takes({segs[0], segs[1]}, n, ring)) << name;
      for (int launch = 0; launch < 2; ++launch) {
        const std::string what = std::string(name) + ", tokens " + std::to_string(n) + ", launch " + std::to_string(launch);
        DeviceBuffer<float> fused(std::vector<float>(values, NAN));
        DevicePlane fused_q8(n, ff);
        cuda::MatVecExtra e = ring;
        e.swiglu_out = fused.get();
        e.swiglu_ld = ff;
        e.swiglu_q8 = fused_q8.plane;
        e.swiglu_q8_rows = n;
        e.swiglu_counts = counts.get();
        cuda::launch_matmul_mma_swiglu({segs[0], segs[1]}, plane.plane, n, e, nullptr);
        const auto got = fused.download();
        ASSERT_EQ(std::memcmp(got.data(), want.data(), values * 4), 0) << what;
        ASSERT_TRUE(same_pad40(fused_q8.to_pad40(), plain_q8.to_pad40())) << what;
        ASSERT_EQ(counts.download(), std::vector<int32_t>(size_t(ff / 256), 0)) << what;
      }
    }
  }
  // Launches it does not take: more than 8 tokens, other kernels (one CTA a row tile), no counters.
  const synth::Preset& preset = synth::find_preset("qwen2.5-7b");
  const GateUp gate_up(preset, 262);
  const cuda::MatSeg (&segs)[2] = {gate_up.segs[0], gate_up.segs[1]};
  EXPECT_FALSE(cuda::matmul_mma_swiglu_takes(segs, 9, ring));
  cuda::MatVecExtra e = ring;
  e.decode_ctas = -1;
  EXPECT_FALSE(cuda::matmul_mma_swiglu_takes(segs, 1, e));
  DevicePlane plane(quantize_pad40_cpu(random_normal(size_t(8) * preset.n_embd, 1.0f, 263), 8, preset.n_embd), 8,
                    preset.n_embd);
  DeviceBuffer<float> out(size_t(8) * preset.n_ff);
  e = ring;
  e.swiglu_out = out.get();
  e.swiglu_ld = preset.n_ff;
  EXPECT_THROW(cuda::launch_matmul_mma_swiglu(segs, plane.plane, 1, e, nullptr), Error);
}

// Launches that keep more than one group in flight a warp, each with bias and residual at 1, 5 and
// 8 tokens, q4_K and q6_K: the 7B's down projection (3,584 rows of 18,944 columns: 74 groups a row,
// 224 row tiles, one wave at two CTAs an SM on an H200's 132 SMs) and 201 rows of it (a partial
// last tile; q6_K rows start 8 bytes past a 16-byte boundary every other row, and the last one does
// not), with the weights streamed through the ring in shared memory at two CTAs an SM and with two
// groups in registers; the 7B's o (14 groups: 1 or 2 a warp) through the ring at two; the 14B's
// down (5,120 rows of 13,824 columns: 54 groups, 320 row tiles, one wave only at three) and o
// (5,120 columns: 20 groups), and 201 rows of its down on 5 SMs (13 tiles), through the ring at
// three CTAs an SM, and 201 rows of its o on 4 SMs through the ring at four (q4_K; q6_K's stages
// do not fit four CTAs an SM: one group in flight): the bits of one group in flight.
TEST(GpuKernels, DecodeMatmulWithTwoGroupsInFlightKeepsTheBits) {
  MINFER_REQUIRE_GPU();
  struct Case {
    const char* what;
    int rows, cols, sm_count, ring_ctas_per_sm, q6k_ring_ctas_per_sm;
    bool in_registers;
  };
  const int d7 = synth::find_preset("qwen2.5-7b").n_embd, ff7 = synth::find_preset("qwen2.5-7b").n_ff;
  const int d14 = synth::find_preset("qwen2.5-14b").n_embd, ff14 = synth::find_preset("qwen2.5-14b").n_ff;
  const Case cases[] = {{"7B down", d7, ff7, 132, 2, 2, true},      {"7B down, 201 rows", 201, ff7, 132, 2, 2, true},
                        {"7B o", d7, d7, 132, 2, 2, false},         {"14B down", d14, ff14, 132, 3, 3, false},
                        {"14B o", d14, d14, 132, 3, 3, false},      {"14B down, 201 rows", 201, ff14, 5, 3, 3, false},
                        {"14B o, 201 rows", 201, d14, 4, 4, 0, false}};
  const int max_tokens = 8;
  for (const Case& c : cases) {
    cuda::MatVecExtra ring, registers, one;
    ring.sm_count = registers.sm_count = one.sm_count = c.sm_count;
    registers.weights_in_registers = true;
    one.one_group_in_flight = true;
    DevicePlane plane(quantize_pad40_cpu(random_normal(size_t(max_tokens) * c.cols, 1.0f, 242), max_tokens, c.cols),
                      max_tokens, c.cols);
    DeviceBuffer<float> bias(random_normal(size_t(c.rows), 0.2f, 240)),
        residual(random_normal(size_t(max_tokens) * c.rows, 1.0f, 241));
    for (GgmlType type : {GgmlType::Q4_K, GgmlType::Q6_K}) {
      DeviceBuffer<uint8_t> w(
          test::weights_image(type, c.cols, test::random_weight_rows(type, c.rows, c.cols, 243)));
      cuda::MatSeg seg;
      seg.w = {type, c.rows, c.cols, w.get()};
      seg.bias = bias.get();
      seg.residual = residual.get();
      const std::string what = std::string(c.what) + ", " + type_traits(type).name;
      ASSERT_EQ(cuda::matmul_mma_weight_ring_ctas_per_sm(&seg, 1, 1, ring),
                type == GgmlType::Q6_K ? c.q6k_ring_ctas_per_sm : c.ring_ctas_per_sm)
          << what;
      ASSERT_FALSE(cuda::matmul_mma_two_groups_in_flight(&seg, 1, 1, ring)) << what;
      ASSERT_EQ(cuda::matmul_mma_two_groups_in_flight(&seg, 1, 1, registers), c.in_registers) << what;
      ASSERT_EQ(cuda::matmul_mma_weight_ring_ctas_per_sm(&seg, 1, 1, registers), 0) << what;
      ASSERT_EQ(cuda::matmul_mma_weight_ring_ctas_per_sm(&seg, 1, 1, one), 0) << what;
      ASSERT_FALSE(cuda::matmul_mma_two_groups_in_flight(&seg, 1, 1, one)) << what;
      for (int n : {1, 5, 8}) {
        expect_same_decode_matmul_bits({seg}, plane.plane, n, ring, one, what + ", ring");
        if (c.in_registers) expect_same_decode_matmul_bits({seg}, plane.plane, n, registers, one, what + ", registers");
      }
    }
  }
}

// q/k in q4_K with a q6_K v in one launch at one token fragment (each row tile its own type's
// code) gives the bits of a launch per type: segments of 512 and 256 q4_K rows and 256 q6_K rows
// with bias and residual, 1, 5 and 8 tokens; the register kernel with a CTA a tile and with 3 CTAs
// walking both types' tiles, both types' weight rings at three CTAs an SM (64 row tiles on 22
// SMs), and on 16 SMs (one wave of neither) a launch per type.
TEST(GpuKernels, DecodeMatmulOfTwoTypesInOneLaunchKeepsTheBits) {
  MINFER_REQUIRE_GPU();
  const int cols = 3584, max_tokens = 8;
  struct Segment { GgmlType type; int rows; };
  const Segment parts[] = {{GgmlType::Q4_K, 512}, {GgmlType::Q4_K, 256}, {GgmlType::Q6_K, 256}};
  std::vector<std::unique_ptr<DeviceBuffer<uint8_t>>> w;
  std::vector<std::unique_ptr<DeviceBuffer<float>>> bias, residual, out[2];
  cuda::MatSeg segs[2][3];
  for (int i = 0; i < 3; ++i) {
    const auto [type, rows] = parts[i];
    w.push_back(std::make_unique<DeviceBuffer<uint8_t>>(
        test::weights_image(type, cols, test::random_weight_rows(type, rows, cols, 200 + uint64_t(i)))));
    bias.push_back(std::make_unique<DeviceBuffer<float>>(random_normal(size_t(rows), 0.2f, 210 + uint64_t(i))));
    residual.push_back(
        std::make_unique<DeviceBuffer<float>>(random_normal(size_t(max_tokens) * rows, 1.0f, 220 + uint64_t(i))));
    for (int v = 0; v < 2; ++v) {
      out[v].push_back(std::make_unique<DeviceBuffer<float>>(size_t(max_tokens) * size_t(rows)));
      segs[v][i].w = {type, rows, cols, w.back()->get()};
      segs[v][i].bias = bias.back()->get();
      segs[v][i].residual = residual.back()->get();
      segs[v][i].out = out[v].back()->get();
      segs[v][i].ld_out = rows;
    }
  }
  DevicePlane plane(quantize_pad40_cpu(random_normal(size_t(max_tokens) * cols, 1.0f, 230), max_tokens, cols),
                    max_tokens, cols);
  cuda::MatVecExtra per_type;
  per_type.launch_per_type = true;
  struct Arm { int decode_ctas, sm_count; bool register_kernel; int ring_ctas_per_sm; };
  for (const Arm arm : {Arm{0, 0, false, 0}, Arm{3, 0, false, 0}, Arm{0, 22, false, 3}, Arm{0, 16, false, 0},
                        Arm{0, 22, true, 0}})
    for (int n : {1, 5, 8}) {
      cuda::MatVecExtra together;
      together.decode_ctas = arm.decode_ctas;
      together.sm_count = arm.sm_count;
      together.two_type_register_kernel = arm.register_kernel;
      const std::string what = "tokens " + std::to_string(n) + ", ctas " + std::to_string(arm.decode_ctas) + ", " +
                               std::to_string(arm.sm_count) + " SMs" + (arm.register_kernel ? ", registers" : "");
      ASSERT_EQ(cuda::matmul_mma_two_type_ring_ctas_per_sm(segs[0], 3, n, together), arm.ring_ctas_per_sm) << what;
      cuda::launch_matmul_mma(segs[0], 3, plane.plane, n, together, nullptr);
      cuda::launch_matmul_mma(segs[1], 3, plane.plane, n, per_type, nullptr);
      for (int i = 0; i < 3; ++i) {
        const auto a = out[0][size_t(i)]->download(), b = out[1][size_t(i)]->download();
        ASSERT_EQ(std::memcmp(a.data(), b.data(), size_t(n) * size_t(parts[i].rows) * 4), 0)
            << what << ", segment " << i;
      }
    }
}

// Which q/k/v launches take both types' weight rings on 132 SMs (the H100's and the H200's): the
// 7B's (288 row tiles) at three CTAs an SM and tiny-wide's (9 groups a row), whose trace the
// backend test compares; not the 14B's (448: one wave only at four, where it lost to v and q/k side
// by side), rows of 8 groups (2,048 columns) or a q5_K q/k.
TEST(GpuKernels, TwoTypeWeightRingTakesTheQkvLaunchesOfQ4KM) {
  MINFER_REQUIRE_GPU();
  alignas(16) static uint8_t weights[16];  // the choice reads only the rows' alignment
  struct Shape { const char* what; int cols, q_rows, kv_rows; GgmlType qk; int ring_ctas_per_sm; };
  for (const Shape& c : {Shape{"7B", 3584, 3584, 512, GgmlType::Q4_K, 3}, Shape{"14B", 5120, 5120, 1024, GgmlType::Q4_K, 0},
                         Shape{"tiny-wide", 2304, 2304, 256, GgmlType::Q4_K, 3},
                         Shape{"8 groups", 2048, 2048, 256, GgmlType::Q4_K, 0},
                         Shape{"q5_K q/k", 3584, 3584, 512, GgmlType::Q5_K, 0}}) {
    cuda::MatSeg segs[3];
    const int rows[3] = {c.q_rows, c.kv_rows, c.kv_rows};
    const cuda::Epilogue epi[3] = {cuda::Epilogue::RopeQ, cuda::Epilogue::RopeK, cuda::Epilogue::StoreV};
    for (int i = 0; i < 3; ++i) {
      segs[i].w = {i < 2 ? c.qk : GgmlType::Q6_K, rows[i], c.cols, weights};
      segs[i].epi = epi[i];
    }
    cuda::MatVecExtra extra;
    extra.sm_count = 132;
    EXPECT_EQ(cuda::matmul_mma_two_type_ring_ctas_per_sm(segs, 3, 1, extra), c.ring_ctas_per_sm) << c.what;
    extra.two_type_register_kernel = true;
    EXPECT_EQ(cuda::matmul_mma_two_type_ring_ctas_per_sm(segs, 3, 1, extra), 0) << c.what << ", registers";
  }
}

// The warpgroup-MMA kernel's f32 sums are exact only while every partial sum stays below 2^24.
// q4_K sums each half group apart: rows whose every quant, scale and min is at its maximum against
// tokens whose every activation quant is +-127 reach 128 * 945 * 127 (the bound's 92 %). q6_K sums
// a whole group in each of its two operands: every quant 0 (q - 32 = -32) with every scale 127
// (lo = 15: 256 * 480 * 127, 93 %) or -128 (hi = -8: 256 * 256 * 127). Two matrices in one launch
// (gate/up), a partial second 128-row tile, bitwise against the canonical order.
TEST(GpuKernels, WgmmaDecodeMatmulIsExactAtItsIntegerBound) {
  MINFER_REQUIRE_GPU();
  if (!cuda::prefill_gemm_device_has_wgmma()) GTEST_SKIP() << "needs an sm_90 device";
  const int cols = 3584, groups = cols / 256, n = 64;
  auto x = random_normal(size_t(n) * cols, 1.0f, 162);
  for (int t = 0; t < 8; ++t)
    for (int c = 0; c < cols; ++c) x[size_t(t) * cols + size_t(c)] = t % 2 ? -1.0f : 1.0f;  // quants +-127
  auto xq = quantize_pad40_cpu(x, n, cols);
  DevicePlane dxq(xq, n, cols);
  DeviceBuffer<uint8_t> operand(size_t(cuda::wgmma_operand_bytes(cols)));
  cuda::MatVecExtra extra;
  extra.wgmma_operand = operand.get();
  extra.wgmma_operand_bytes = cuda::wgmma_operand_bytes(cols);
  for (const GgmlType type : {GgmlType::Q4_K, GgmlType::Q6_K}) {
    const int rows = type == GgmlType::Q4_K ? 130 : 132;
    const size_t block = type_traits(type).type_size;
    std::vector<std::vector<uint8_t>> wq;
    for (int m = 0; m < 2; ++m) {
      wq.push_back(quantize_matrix(type, random_normal(size_t(rows) * cols, 0.5f, 160 + uint64_t(m)), rows, cols));
      for (size_t b = 0; b < wq.back().size() / block; ++b) {
        uint8_t* blk = wq.back().data() + b * block;
        const int row = int(b / groups);
        if (row % 3 == 1) continue;  // 2 rows in 3 saturated
        if (type == GgmlType::Q4_K) {
          std::memset(blk + 4, 0xFF, 140);
        } else {
          std::memset(blk, 0, 192);                           // ql, qh: q = 0
          std::memset(blk + 192, row % 3 == 0 ? 0x7F : 0x80, 16);  // scales 127 or -128
        }
      }
    }
    std::vector<std::unique_ptr<DeviceBuffer<uint8_t>>> dw;
    std::vector<std::unique_ptr<DeviceBuffer<float>>> out;
    cuda::MatSeg segs[2];
    for (int m = 0; m < 2; ++m) {
      dw.push_back(std::make_unique<DeviceBuffer<uint8_t>>(test::weights_image(type, cols, wq[size_t(m)])));
      out.push_back(std::make_unique<DeviceBuffer<float>>(size_t(n) * rows));
      segs[m].w = {type, rows, cols, dw.back()->get()};
      segs[m].out = out.back()->get();
      segs[m].ld_out = rows;
    }
    ASSERT_TRUE(cuda::matmul_wgmma_takes(segs, 2, n, extra));
    cuda::launch_matmul_mma(segs, 2, dxq.plane, n, extra, nullptr);
    for (int m = 0; m < 2; ++m) {
      const auto got = out[size_t(m)]->download();
      for (int t = 0; t < n; ++t)
        for (int r = 0; r < rows; ++r) {
          const float want = canonical_dot(type, wq[size_t(m)].data() + row_bytes(type, cols) * size_t(r),
                                           pad40_row(xq, t, cols), cols);
          ASSERT_EQ(got[size_t(t) * rows + size_t(r)], want)
              << type_traits(type).name << " matrix " << m << " token " << t << " row " << r;
        }
    }
  }
}

// The device draw is the host's draw_softmax bit for bit: the same token for every row,
// temperature and uniform number, at vocabulary sizes with and without a partial last block, with
// masked (-inf) entries, ties and a flat row.
TEST(GpuKernels, DrawSoftmaxIsTheHostDraw) {
  MINFER_REQUIRE_GPU();
  std::mt19937_64 rng(test::seed() + 300);
  for (int width : {1, 7, 256, 1000, 151936}) {
    std::vector<std::vector<float>> rows;
    rows.push_back(random_normal(size_t(width), 3.0f, 301 + uint64_t(width)));
    rows.push_back(std::vector<float>(size_t(width), 0.5f));  // flat: every token equally likely
    std::vector<float> masked = random_normal(size_t(width), 1.0f, 302 + uint64_t(width));
    for (size_t i = 0; i < masked.size(); i += 3) masked[i] = -std::numeric_limits<float>::infinity();
    if (width > 1) masked[1] = 4.0f, masked[masked.size() - 1] = 4.0f;  // a tie at the top
    rows.push_back(masked);
    std::vector<float> host_rows;
    for (const auto& r : rows) host_rows.insert(host_rows.end(), r.begin(), r.end());
    std::vector<cuda::DrawJob> jobs;
    for (int r = 0; r < int(rows.size()); ++r)
      for (float temperature : {0.3f, 1.0f, 1.9f})
        for (double u : {0.0, 1e-9, 0.25, 0.5, 0.999999999, double(rng() >> 11) * 0x1.0p-53})
          jobs.push_back({r, temperature, u});
    DeviceBuffer<float> dx(host_rows);
    DeviceBuffer<cuda::DrawJob> djobs(jobs);
    DeviceBuffer<int32_t> dtokens(jobs.size());
    cuda::launch_draw_softmax(dx.get(), width, width, djobs.get(), int(jobs.size()), dtokens.get(), {});
    cuda_ok(cudaGetLastError());
    const auto got = dtokens.download();
    std::vector<float> weight;
    std::vector<double> block_sum;
    for (size_t j = 0; j < jobs.size(); ++j) {
      const int32_t want = draw_softmax(rows[size_t(jobs[j].row)], jobs[j].temperature, jobs[j].uniform, weight, block_sum);
      ASSERT_EQ(got[j], want) << "width " << width << " row " << jobs[j].row << " temperature " << jobs[j].temperature
                              << " uniform " << jobs[j].uniform;
    }
  }
}

TEST(GpuKernels, RopeMatchesDoubleReference) {
  MINFER_REQUIRE_GPU();
  const int hd = 128, n_heads = 3, n_tokens = 4;
  const std::vector<int32_t> positions = {1000, 3, 77, 1001};  // tokens of different sequences
  for (bool neox : {true, false}) {
    const auto x = random_normal(static_cast<size_t>(n_tokens * n_heads * hd), 1.0f, 95);
    std::vector<float> inv(static_cast<size_t>(hd / 2));
    for (int j = 0; j < hd / 2; ++j) inv[size_t(j)] = float(std::pow(1e4, -2.0 * j / hd));
    DeviceBuffer<float> dx(x), dinv(inv);
    DeviceBuffer<int32_t> pos(positions);
    cuda::launch_rope(dx.get(), n_heads * hd, n_tokens, n_heads, {dinv.get(), hd, neox}, pos.get(), nullptr);
    const auto y = dx.download();
    for (int t = 0; t < n_tokens; ++t)
      for (int h = 0; h < n_heads; ++h)
        for (int j = 0; j < hd / 2; ++j) {
          const int i0 = neox ? j : 2 * j, i1 = neox ? j + hd / 2 : 2 * j + 1;
          const size_t base = size_t((t * n_heads + h) * hd);
          const double th = double(positions[size_t(t)]) * inv[size_t(j)];
          const double a = x[base + size_t(i0)], b = x[base + size_t(i1)];
          ASSERT_NEAR(y[base + size_t(i0)], a * std::cos(th) - b * std::sin(th), 2e-4);
          ASSERT_NEAR(y[base + size_t(i1)], a * std::sin(th) + b * std::cos(th), 2e-4);
        }
  }
}

// The cache is paged: each token's sequence has its own block table of shuffled blocks.
// A decode attention launch's inputs: q of one token a sequence, each sequence's K/V rows in
// blocks of a paged cache dealt in shuffled order.
struct PagedAttention {
  struct Case {
    int hd, n_head, n_kv, splits, block_size;
    std::vector<int> lens;
  };
  // What a launch may vary (launch_attention's AttnParams beside the inputs).
  struct Launch {
    int sm_count = 100000;  // 1 gives a few blocks looping over many slices, 100000 one block a slice
    bool tensor_cores = true;
    DevicePlane* q8 = nullptr;
    int head_chunks = 1;
    bool combine_spread = true, combine_staging = true, early_reads = false;
  };
  struct Host {
    std::vector<int32_t> tables, offsets, positions;
    std::vector<float> q;
    std::vector<uint16_t> kh, vh;
  };
  static Host host_inputs(const Case& c) {
    Host h;
    const int kvw = c.n_kv * c.hd;
    int n_blocks = 0;
    for (int len : c.lens) n_blocks += (len + c.block_size - 1) / c.block_size;
    std::vector<int32_t> order(static_cast<size_t>(n_blocks));
    for (int b = 0; b < n_blocks; ++b) order[size_t(b)] = b;
    std::shuffle(order.begin(), order.end(), std::mt19937_64(seed() + 99));
    for (int len : c.lens) {
      h.offsets.push_back(int32_t(h.tables.size()));
      h.positions.push_back(len - 1);
      for (int b = 0; b < (len + c.block_size - 1) / c.block_size; ++b) h.tables.push_back(order[h.tables.size()]);
    }
    const size_t pool = size_t(n_blocks) * c.block_size * kvw;
    h.q = random_normal(c.lens.size() * size_t(c.n_head * c.hd), 1.0f, 100);
    const auto kf = random_normal(pool, 1.0f, 101), vf = random_normal(pool, 1.0f, 102);
    h.kh.resize(pool), h.vh.resize(pool);
    for (size_t i = 0; i < pool; ++i) h.kh[i] = f32_to_f16(kf[i]), h.vh[i] = f32_to_f16(vf[i]);
    return h;
  }
  const Case c;
  const int n_tokens;
  const Host h;
  const DeviceBuffer<float> dq;
  const DeviceBuffer<uint16_t> dk, dv;
  const DeviceBuffer<int32_t> dpos, dtables, doffsets;
  const DeviceBuffer<float> part;

  explicit PagedAttention(Case cs)
      : c(std::move(cs)), n_tokens(int(c.lens.size())), h(host_inputs(c)), dq(h.q), dk(h.kh), dv(h.vh),
        dpos(h.positions), dtables(h.tables), doffsets(h.offsets),
        part(static_cast<size_t>(cuda::attention_workspace_floats(n_tokens, c.n_head, c.hd, c.splits))) {}
  std::vector<float> attend(const Launch& l) const {
    DeviceBuffer<float> out(std::vector<float>(h.q.size(), NAN));
    cuda::AttnParams p;
    p.q = dq.get();
    p.out = out.get();
    p.kv = {dk.get(), dv.get(), c.n_kv, c.hd};
    p.n_head = c.n_head;
    p.n_tokens = n_tokens;
    p.positions = dpos.get();
    p.tables = dtables.get();
    p.table_offsets = doffsets.get();
    p.block_size = c.block_size;
    p.n_splits = c.splits;
    p.part = part.get();
    p.sm_count = l.sm_count;
    p.head_chunks = l.head_chunks;
    p.tensor_cores = l.tensor_cores;
    p.combine_spread = l.combine_spread;
    p.combine_staging = l.combine_staging;
    p.early_reads = l.early_reads;
    if (l.q8) p.q8 = l.q8->plane, p.q8_rows = n_tokens;
    cuda::launch_attention(p, nullptr);
    return out.download();
  }
};

TEST(GpuKernels, SplitKAttentionOverPagedCacheMatchesDoubleReference) {
  MINFER_REQUIRE_GPU();
  using Case = PagedAttention::Case;
  using Launch = PagedAttention::Launch;
  // 7B / 14B / 0.5b shapes at depth, splits with no positions, groups over 8 heads (12: two chunks
  // of 6; 9: chunks of 5 and 4), head_dim 256, several tokens of different sequences and lengths in
  // one launch
  for (const Case& cs : {Case{128, 28, 4, 66, 64, {1000}}, Case{128, 28, 4, 66, 16, {16384}}, Case{128, 40, 8, 33, 64, {4100}},
                         Case{64, 14, 2, 132, 32, {517}}, Case{64, 4, 2, 8, 16, {37, 5, 200}}, Case{128, 40, 8, 33, 64, {3}},
                         Case{128, 12, 1, 7, 128, {300}}, Case{64, 18, 2, 9, 16, {150, 7}}, Case{256, 8, 2, 5, 16, {129, 1}}}) {
    const PagedAttention a(cs);
    const Case& c = a.c;
    const int n_tokens = a.n_tokens;
    // Both bodies (the f16 tensor cores, and CUDA cores; head_dim 256 runs CUDA cores either way)
    // against the same reference and the same invariances.
    for (const bool tensor_cores : {true, false}) {
      Launch base;
      base.tensor_cores = tensor_cores;
      auto with = [&](auto change) {
        Launch l = base;
        change(l);
        return l;
      };
      const auto o = a.attend(base);
      // the bits depend on neither how many blocks share a token's slices
      for (const int sm_count : {1, 3, 132}) {
        const auto other = a.attend(with([&](Launch& l) { l.sm_count = sm_count; }));
        ASSERT_EQ(std::memcmp(other.data(), o.data(), o.size() * 4), 0) << "sm_count " << sm_count << " head_dim " << c.hd
                                                                       << " tensor cores " << tensor_cores;
      }
      // nor on whether the combine's CTAs take an SM each or bulk-copy their partials
      for (const auto [spread, staging] : {std::pair{false, false}, std::pair{true, false}, std::pair{false, true}}) {
        const auto other = a.attend(with([&](Launch& l) { l.combine_spread = spread, l.combine_staging = staging; }));
        ASSERT_EQ(std::memcmp(other.data(), o.data(), o.size() * 4), 0)
            << "combine spread " << spread << " staging " << staging << " head_dim " << c.hd;
      }
      // nor on reading the older rows first (AttnParams::early_reads; its race: test_attention_pdl.cu)
      for (const int sm_count : {3, 132}) {
        const auto other = a.attend(with([&](Launch& l) { l.sm_count = sm_count, l.early_reads = true; }));
        ASSERT_EQ(std::memcmp(other.data(), o.data(), o.size() * 4), 0) << "early reads, sm_count " << sm_count
                                                                       << " head_dim " << c.hd;
      }
      // nor on how a KV head's q heads are spread over blocks (down to one a block)
      for (const int head_chunks : {2, 3, c.n_head / c.n_kv}) {
        const auto other = a.attend(with([&](Launch& l) { l.sm_count = 132, l.head_chunks = head_chunks; }));
        ASSERT_EQ(std::memcmp(other.data(), o.data(), o.size() * 4), 0) << "head chunks " << head_chunks << " head_dim " << c.hd;
      }
      const int width = c.n_head * c.hd;
      if (width % 256 == 0) {  // the o-projection's q8 plane from the combine: the standalone quantize's bits
        DevicePlane fused(n_tokens, width), plain(n_tokens, width);
        const auto with_plane = a.attend(with([&](Launch& l) { l.sm_count = 132, l.q8 = &fused; }));
        ASSERT_EQ(std::memcmp(with_plane.data(), o.data(), o.size() * 4), 0) << "head_dim " << c.hd;
        DeviceBuffer<float> dout(o);
        cuda::launch_quantize_q8(dout.get(), width, plain.plane, n_tokens, width, nullptr);
        ASSERT_TRUE(same_pad40(fused.to_pad40(), plain.to_pad40())) << "head_dim " << c.hd << " heads " << c.n_head;
        DevicePlane unstaged(n_tokens, width);
        const auto unstaged_out = a.attend(
            with([&](Launch& l) { l.sm_count = 132, l.q8 = &unstaged, l.combine_spread = l.combine_staging = false; }));
        ASSERT_EQ(std::memcmp(unstaged_out.data(), o.data(), o.size() * 4), 0);
        ASSERT_TRUE(same_pad40(unstaged.to_pad40(), plain.to_pad40())) << "head_dim " << c.hd << " unstaged, one SM apart";
      }
      const int kvw = c.n_kv * c.hd, G = c.n_head / c.n_kv;
      for (int tk = 0; tk < n_tokens; ++tk) {
        const int len = c.lens[size_t(tk)];
        auto slot = [&](int pos) {
          return size_t(a.h.tables[size_t(a.h.offsets[size_t(tk)] + pos / c.block_size)]) * c.block_size +
                 size_t(pos % c.block_size);
        };
        for (int h = 0; h < c.n_head; ++h) {
          const int g = h / G;
          std::vector<double> s(static_cast<size_t>(len));
          double mx = -1e300;
          for (int t = 0; t < len; ++t) {
            double d = 0;
            for (int i = 0; i < c.hd; ++i)
              d += double(a.h.q[size_t((tk * c.n_head + h) * c.hd + i)]) * f16_to_f32(a.h.kh[slot(t) * kvw + size_t(g * c.hd + i)]);
            s[size_t(t)] = d / std::sqrt(double(c.hd));
            mx = std::max(mx, s[size_t(t)]);
          }
          double den = 0;
          for (auto& e : s) den += (e = std::exp(e - mx));
          for (int i = 0; i < c.hd; ++i) {
            double num = 0;
            for (int t = 0; t < len; ++t) num += s[size_t(t)] * f16_to_f32(a.h.vh[slot(t) * kvw + size_t(g * c.hd + i)]);
            ASSERT_NEAR(o[size_t((tk * c.n_head + h) * c.hd + i)], num / den, 1e-4)
                << "token " << tk << " head " << h << " dim " << i << " len " << len << " tensor cores " << tensor_cores;
          }
        }
      }
    }
  }
}

TEST(GpuKernels, ArgmaxTakesTheFirstLargest) {
  MINFER_REQUIRE_GPU();
  const int n = 152063, ld = n + 5;  // rows not a multiple of the slice count, nor 16-byte aligned
  const int rows = 5;
  std::vector<float> x(size_t(rows) * ld, -1e30f);
  std::mt19937_64 rng(seed() + 111);
  for (int r = 0; r < rows; ++r) {
    const auto v = random_normal(static_cast<size_t>(n), 1.0f, 110 + uint64_t(r));
    std::copy(v.begin(), v.end(), x.begin() + ptrdiff_t(r) * ld);
  }
  float* row = x.data();
  const int a = int(rng() % n), b = int(rng() % n);  // row 0: a tie, usually in two slices
  row[a] = row[b] = 50.0f;
  x[size_t(ld) + 17] = 60.0f;                       // row 1: the first element's neighbourhood
  x[size_t(2 * ld) + n - 1] = 70.0f;                // row 2: the last element
  x[size_t(3 * ld) + 5000] = std::nanf("");          // row 3: NaN never wins
  x[size_t(3 * ld) + 6000] = 80.0f;
  for (int i = 0; i < n; ++i) x[size_t(4 * ld) + i] = -std::numeric_limits<float>::infinity();  // row 4: no maximum
  DeviceBuffer<float> dx(x);
  DeviceBuffer<cuda::ArgmaxCandidate> candidates(size_t(rows) * cuda::kArgmaxSlices);
  DeviceBuffer<int32_t> r(static_cast<size_t>(rows)), next_tokens(static_cast<size_t>(rows));
  cuda::launch_argmax_rows(dx.get(), ld, rows, n, candidates.get(), r.get(), next_tokens.get(), nullptr);
  const auto got = r.download();
  const std::vector<int32_t> want = {std::min(a, b), 17, n - 1, 6000, 0};
  ASSERT_EQ(got, want);
  EXPECT_EQ(next_tokens.download(), want);  // the copy a fed step embeds
}

}  // namespace
}  // namespace minfer::test
