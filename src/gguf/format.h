// Internal to src/gguf: facts about the GGUF encoding shared by the reader and the writer.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "gguf/gguf.h"

namespace minfer::gguf::format {

constexpr char kMagic[4] = {'G', 'G', 'U', 'F'};
constexpr uint32_t kVersion = 3;
constexpr uint64_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 4;
// Nested arrays are legal but no real file nests deeper than 2; the limit bounds recursion.
constexpr int kMaxArrayDepth = 8;
constexpr std::string_view kAlignmentKey = "general.alignment";

constexpr bool is_value_type(uint32_t id) { return id <= uint32_t(ValueType::FLOAT64); }

// Encoded bytes of a scalar type; 0 for STRING and ARRAY (variable length).
constexpr uint64_t scalar_size(ValueType t) {
  switch (t) {
    case ValueType::UINT8: case ValueType::INT8: case ValueType::BOOL: return 1;
    case ValueType::UINT16: case ValueType::INT16: return 2;
    case ValueType::UINT32: case ValueType::INT32: case ValueType::FLOAT32: return 4;
    case ValueType::UINT64: case ValueType::INT64: case ValueType::FLOAT64: return 8;
    case ValueType::STRING: case ValueType::ARRAY: return 0;
  }
  return 0;
}

// Smallest encoding of one value of type t: used to reject counts that cannot fit in what is left
// of the file before anything is allocated for them.
constexpr uint64_t min_encoded_size(ValueType t) {
  if (t == ValueType::STRING) return 8;             // length
  if (t == ValueType::ARRAY) return 4 + 8;          // element type + count
  return scalar_size(t);
}

constexpr bool is_unsigned(ValueType t) {
  return t == ValueType::UINT8 || t == ValueType::UINT16 || t == ValueType::UINT32 || t == ValueType::UINT64;
}
constexpr bool is_signed(ValueType t) {
  return t == ValueType::INT8 || t == ValueType::INT16 || t == ValueType::INT32 || t == ValueType::INT64;
}
constexpr bool is_float(ValueType t) { return t == ValueType::FLOAT32 || t == ValueType::FLOAT64; }

// Rounds x up to a multiple of the power of two `align`; false on overflow.
inline bool align_up(uint64_t x, uint64_t align, uint64_t* out) {
  uint64_t sum;
  if (__builtin_add_overflow(x, align - 1, &sum)) return false;
  *out = sum & ~(align - 1);
  return true;
}

}  // namespace minfer::gguf::format
