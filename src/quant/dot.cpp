// Dot products of weight rows against activations: the CPU backend's matmul inner loops.
//
// The pad40 kernels (dot_kernels.inc) are written once against an `Isa` that supplies the integer
// block dots, and compiled twice: portable, and on x86-64 under an AVX2/FMA/F16C target pragma
// (so the compiler also vectorizes the bit unpacking with AVX2). The AVX2 build is picked at run
// time, so binaries need no -march flags.
#include <cstring>

#include "quant/quant.h"
#include "quant/unpack.h"
#include "util/error.h"
#include "util/half.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MINFER_X86 1
#endif

namespace minfer {
using namespace quant_detail;

namespace {

namespace portable {
// Integer dots of one 32-element block (and of two 16-element halves with their scales).
struct Isa {
  static void unpack_nibbles32(const uint8_t* qs, uint8_t* out) { quant_detail::unpack_nibbles32(qs, out); }
  static void unpack_q5_32(const uint8_t* qh, const uint8_t* qs, uint8_t* out) {
    quant_detail::unpack_q5_32(qh, qs, out);
  }
  static int32_t dot_u8s8_32(const uint8_t* u, const int8_t* x) {
    int32_t s = 0;
    for (int j = 0; j < 32; ++j) s += int32_t(u[j]) * int32_t(x[j]);
    return s;
  }
  static int32_t dot_s8s8_32(const int8_t* a, const int8_t* x) {
    int32_t s = 0;
    for (int j = 0; j < 32; ++j) s += int32_t(a[j]) * int32_t(x[j]);
    return s;
  }
  static int32_t dot_s8s8_16x2(const int8_t* a, const int8_t* x, int sc0, int sc1) {
    int32_t s0 = 0, s1 = 0;
    for (int j = 0; j < 16; ++j) s0 += int32_t(a[j]) * int32_t(x[j]);
    for (int j = 16; j < 32; ++j) s1 += int32_t(a[j]) * int32_t(x[j]);
    return sc0 * s0 + sc1 * s1;
  }
};
#include "quant/dot_kernels.inc"
}  // namespace portable

// ---- f32/f16/bf16 weights x float activations ----------------------------------------------
// Eight independent partial sums (the compiler vectorizes the lanes without reassociating).
template <typename Load>
float dot_lanes(const Load& load, const float* x, int64_t n) {
  float lanes[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) lanes[k] += load(i + k) * x[i + k];
  float acc = 0;
  for (; i < n; ++i) acc += load(i) * x[i];
  for (int k = 0; k < 8; ++k) acc += lanes[k];
  return acc;
}

float dot_float_portable(GgmlType t, const void* w, const float* x, int64_t n) {
  const uint16_t* h = static_cast<const uint16_t*>(w);
  switch (t) {
    case GgmlType::F32: {
      const float* f = static_cast<const float*>(w);
      return dot_lanes([f](int64_t i) { return f[i]; }, x, n);
    }
    case GgmlType::F16: return dot_lanes([h](int64_t i) { return f16_to_f32(h[i]); }, x, n);
    case GgmlType::BF16: return dot_lanes([h](int64_t i) { return bf16_to_f32(h[i]); }, x, n);
    default: return 0;
  }
}

#ifdef MINFER_X86
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
namespace avx2 {
struct Isa {
  static int32_t hsum(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
  }
  // The 32-block unpacks write all 32 bytes with one store, so the dot's 32-byte load that follows
  // is forwarded from it (byte-wise stores would stall that load).
  static __m256i nibbles32(const uint8_t* qs) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m128i low4 = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low4), _mm_and_si128(v, low4));
  }
  static void unpack_nibbles32(const uint8_t* qs, uint8_t* out) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), nibbles32(qs));
  }
  static void unpack_q5_32(const uint8_t* qh_bytes, const uint8_t* qs, uint8_t* out) {
    uint32_t qh;
    std::memcpy(&qh, qh_bytes, 4);
    // Byte j of the vector gets qh byte j/8, then keeps only its bit j%8: 0x10 where set.
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(int(qh)),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
    const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201));
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    const __m256i high = _mm256_and_si256(set, _mm256_set1_epi8(0x10));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_or_si256(nibbles32(qs), high));
  }
  // 16 int8 pairs sign-extended and multiplied: 8 exact int32 pair sums.
  static __m256i madd16(const int8_t* a, const int8_t* x) {
    const __m256i a16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a)));
    const __m256i x16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
    return _mm256_madd_epi16(a16, x16);
  }
  // maddubs saturates its int16 pair sums; callers guarantee u <= 63, so 2 * 63 * 128 fits.
  static int32_t dot_u8s8_32(const uint8_t* u, const int8_t* x) {
    const __m256i uv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u));
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
    return hsum(_mm256_madd_epi16(_mm256_maddubs_epi16(uv, xv), _mm256_set1_epi16(1)));
  }
  static int32_t dot_s8s8_32(const int8_t* a, const int8_t* x) {
    return hsum(_mm256_add_epi32(madd16(a, x), madd16(a + 16, x + 16)));
  }
  static int32_t dot_s8s8_16x2(const int8_t* a, const int8_t* x, int sc0, int sc1) {
    const __m256i s0 = _mm256_mullo_epi32(madd16(a, x), _mm256_set1_epi32(sc0));
    const __m256i s1 = _mm256_mullo_epi32(madd16(a + 16, x + 16), _mm256_set1_epi32(sc1));
    return hsum(_mm256_add_epi32(s0, s1));
  }
};
#include "quant/dot_kernels.inc"

float hsum_ps(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// 8 weights from element i as floats.
template <GgmlType T>
__m256 load8(const void* w, int64_t i) {
  if constexpr (T == GgmlType::F32) return _mm256_loadu_ps(static_cast<const float*>(w) + i);
  const __m128i h =
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i));
  if constexpr (T == GgmlType::F16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

template <GgmlType T>
float dot_float_typed(const void* w, const float* x, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_fmadd_ps(load8<T>(w, i), _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(load8<T>(w, i + 8), _mm256_loadu_ps(x + i + 8), a1);
    a2 = _mm256_fmadd_ps(load8<T>(w, i + 16), _mm256_loadu_ps(x + i + 16), a2);
    a3 = _mm256_fmadd_ps(load8<T>(w, i + 24), _mm256_loadu_ps(x + i + 24), a3);
  }
  float acc = hsum_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  const size_t elem = T == GgmlType::F32 ? 4 : 2;
  if (i < n) acc += dot_float_portable(T, static_cast<const char*>(w) + size_t(i) * elem, x + i, n - i);
  return acc;
}

float dot_float(GgmlType t, const void* w, const float* x, int64_t n) {
  switch (t) {
    case GgmlType::F32: return dot_float_typed<GgmlType::F32>(w, x, n);
    case GgmlType::F16: return dot_float_typed<GgmlType::F16>(w, x, n);
    case GgmlType::BF16: return dot_float_typed<GgmlType::BF16>(w, x, n);
    default: return 0;
  }
}
}  // namespace avx2
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

bool cpu_has_avx2() {
  // Every AVX2 CPU also has F16C (which not every compiler's builtin can query).
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}
#endif

void check_dot_args(const char* what, GgmlType t, int64_t n, bool supported) {
  const TypeTraits tt = type_traits(t);
  if (!supported) fail(what, ": no kernel for weight type ", tt.name, " (id ", uint32_t(t), ")");
  if (n < 0 || n % tt.block_size != 0 || n % QK != 0)
    fail(what, ": row of ", n, " elements is not a multiple of the ", tt.name, " block size ",
         tt.block_size, " and of 32");
}

bool is_float_type(GgmlType t) {
  return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16;
}

}  // namespace

bool has_pad40_dot(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1:
    case GgmlType::Q8_0: case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K:
      return true;
    default:
      return false;
  }
}

float vec_dot_pad40(GgmlType t, const void* w_row, const BlockQ8Pad40* x, int64_t n) {
  check_dot_args("vec_dot_pad40", t, n, has_pad40_dot(t));
#ifdef MINFER_X86
  if (cpu_has_avx2()) return avx2::dot_pad40(t, w_row, x, n);
#endif
  return portable::dot_pad40(t, w_row, x, n);
}

float vec_dot_pad40_portable(GgmlType t, const void* w_row, const BlockQ8Pad40* x, int64_t n) {
  check_dot_args("vec_dot_pad40", t, n, has_pad40_dot(t));
  return portable::dot_pad40(t, w_row, x, n);
}

float vec_dot_f32(GgmlType t, const void* w_row, const float* x, int64_t n) {
  if (!is_float_type(t)) fail("vec_dot_f32: weight type ", type_traits(t).name, " is not f32/f16/bf16");
  if (n < 0) fail("vec_dot_f32: negative length ", n);
#ifdef MINFER_X86
  if (cpu_has_avx2()) return avx2::dot_float(t, w_row, x, n);
#endif
  return dot_float_portable(t, w_row, x, n);
}

float vec_dot_f32_portable(GgmlType t, const void* w_row, const float* x, int64_t n) {
  if (!is_float_type(t)) fail("vec_dot_f32: weight type ", type_traits(t).name, " is not f32/f16/bf16");
  if (n < 0) fail("vec_dot_f32: negative length ", n);
  return dot_float_portable(t, w_row, x, n);
}

}  // namespace minfer
