// GGML tensor types with their exact GGUF byte layouts. Shared by host code and CUDA kernels, so
// it holds only plain structs and constexpr tables (no host-only headers).
#pragma once
#include <cstddef>
#include <cstdint>

namespace minfer {

// Numeric ids as stored in GGUF tensor infos.
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
  IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

constexpr int QK = 32;    // elements per block of the 32-block formats
constexpr int QK_K = 256; // elements per super-block of the K formats

struct BlockQ4_0 { uint16_t d; uint8_t qs[QK / 2]; };
struct BlockQ4_1 { uint16_t d, m; uint8_t qs[QK / 2]; };
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[QK / 2]; };
struct BlockQ5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[QK / 2]; };
struct BlockQ8_0 { uint16_t d; int8_t qs[QK]; };
struct BlockQ8_1 { uint16_t d, s; int8_t qs[QK]; };
struct BlockQ2_K { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; uint16_t d, dmin; };
struct BlockQ3_K { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; uint16_t d; };
// q4_K/q5_K: 8 sub-blocks of 32, each with a 6-bit scale and 6-bit min packed into scales[12].
struct BlockQ4_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]; };
struct BlockQ5_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; };
// q6_K: 16 sub-blocks of 16 with int8 scales; low 4 bits in ql, high 2 bits in qh.
struct BlockQ6_K { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; };
struct BlockQ8_K { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; };

// Our activation layout for decode matmuls ("pad40"): q8 blocks of 32 padded to 40 bytes so the
// int8 payload is 4-byte aligned and the block carries the sum of its quants (for the min terms
// of q4_K/q5_K/q4_1/q5_1 without a second pass).
struct BlockQ8Pad40 { uint16_t d; uint16_t pad; int8_t qs[QK]; int32_t sum; };

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockQ4_K) == 144 &&
              sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210 && sizeof(BlockQ8_K) == 292);
static_assert(sizeof(BlockQ8Pad40) == 40);

struct TypeTraits {
  const char* name;    // as llama.cpp prints it: "q4_K", "f16", ...
  int block_size;      // elements per block (0: unknown type)
  int type_size;       // bytes per block
  bool quantized;
};

constexpr TypeTraits type_traits(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return {"f32", 1, 4, false};
    case GgmlType::F16: return {"f16", 1, 2, false};
    case GgmlType::BF16: return {"bf16", 1, 2, false};
    case GgmlType::F64: return {"f64", 1, 8, false};
    case GgmlType::I8: return {"i8", 1, 1, false};
    case GgmlType::I16: return {"i16", 1, 2, false};
    case GgmlType::I32: return {"i32", 1, 4, false};
    case GgmlType::I64: return {"i64", 1, 8, false};
    case GgmlType::Q4_0: return {"q4_0", QK, 18, true};
    case GgmlType::Q4_1: return {"q4_1", QK, 20, true};
    case GgmlType::Q5_0: return {"q5_0", QK, 22, true};
    case GgmlType::Q5_1: return {"q5_1", QK, 24, true};
    case GgmlType::Q8_0: return {"q8_0", QK, 34, true};
    case GgmlType::Q8_1: return {"q8_1", QK, 36, true};
    case GgmlType::Q2_K: return {"q2_K", QK_K, 84, true};
    case GgmlType::Q3_K: return {"q3_K", QK_K, 110, true};
    case GgmlType::Q4_K: return {"q4_K", QK_K, 144, true};
    case GgmlType::Q5_K: return {"q5_K", QK_K, 176, true};
    case GgmlType::Q6_K: return {"q6_K", QK_K, 210, true};
    case GgmlType::Q8_K: return {"q8_K", QK_K, 292, true};
    case GgmlType::IQ2_XXS: return {"iq2_xxs", QK_K, 66, true};
    case GgmlType::IQ2_XS: return {"iq2_xs", QK_K, 74, true};
    case GgmlType::IQ3_XXS: return {"iq3_xxs", QK_K, 98, true};
    case GgmlType::IQ1_S: return {"iq1_s", QK_K, 50, true};
    case GgmlType::IQ4_NL: return {"iq4_nl", QK, 18, true};
    case GgmlType::IQ3_S: return {"iq3_s", QK_K, 110, true};
    case GgmlType::IQ2_S: return {"iq2_s", QK_K, 82, true};
    case GgmlType::IQ4_XS: return {"iq4_xs", QK_K, 136, true};
    case GgmlType::IQ1_M: return {"iq1_m", QK_K, 56, true};
    case GgmlType::TQ1_0: return {"tq1_0", QK_K, 54, true};
    case GgmlType::TQ2_0: return {"tq2_0", QK_K, 66, true};
    case GgmlType::MXFP4: return {"mxfp4", QK, 17, true};
  }
  return {"unknown", 0, 0, false};
}

constexpr bool is_known_type(uint32_t id) {
  return type_traits(static_cast<GgmlType>(id)).block_size != 0;
}

// Bytes of one row of n elements; the caller guarantees n % block_size == 0.
constexpr size_t row_bytes(GgmlType t, int64_t n) {
  const TypeTraits tt = type_traits(t);
  return size_t(n / tt.block_size) * size_t(tt.type_size);
}

}  // namespace minfer
