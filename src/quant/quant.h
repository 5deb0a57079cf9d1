// CPU quantize / dequantize / dot kernels for every supported GGML type. These are the reference
// ("oracle") implementations the CUDA kernels are tested against, and the CPU backend's matmul.
#pragma once
#include <cstddef>
#include <cstdint>

#include "quant/types.h"

namespace minfer {

// Types whose rows the CPU can turn into floats (dequantize_row accepts them).
bool can_dequantize(GgmlType t);
// Types the quantizer can produce (quantize_row accepts them): f32, f16, bf16, q8_0, q4_0, q4_1,
// q5_0, q5_1, q4_K, q5_K, q6_K, q8_K.
bool can_quantize(GgmlType t);

// n must be a multiple of the type's block size. Throws minfer::Error on an unsupported type.
void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n);
// Returns the bytes written (row_bytes(t, n)). Search-based scale selection for the K types.
size_t quantize_row(GgmlType t, const float* src, void* dst, int64_t n);
// n_rows consecutive rows of n_cols elements each (rows are row_bytes(t, n_cols) apart).
void dequantize_rows(GgmlType t, const void* src, float* dst, int64_t n_rows, int64_t n_cols);

// Activation quantization to the pad40 layout (n % 32 == 0), per block of 32 (the CPU backend's
// activations):
//   amax = max|x|; d = amax / 127; id = d != 0 ? 1 / d : 0; q = clamp(rintf(x * id), -128, 127);
//   stored d = f16(d); sum = sum of q.
void quantize_row_pad40(const float* src, BlockQ8Pad40* dst, int64_t n);
// The same rule with one amax per 256-column group (blocks 8g .. 8g + 7, fewer in the row's last
// group): every block of a group stores the group's d and its own sum. The CUDA decode matmuls
// read this form (the CUDA quantize kernels reproduce it bit for bit): the shared scale lets them
// sum a k-quant group in integers (quant/canonical_dot.h). Coarser than per-block scales, as
// llama.cpp's q8_K on the CPU.
void quantize_row_pad40_grouped(const float* src, BlockQ8Pad40* dst, int64_t n);
// d * q per element (the values the pad40 dot products see).
void dequantize_row_pad40(const BlockQ8Pad40* src, float* dst, int64_t n);

// Weight types that have a dot product against pad40 activations: q4_0, q4_1, q5_0, q5_1, q8_0,
// q4_K, q5_K, q6_K. The integer part of each block is exact; scales are applied in float.
bool has_pad40_dot(GgmlType t);
float vec_dot_pad40(GgmlType t, const void* w_row, const BlockQ8Pad40* x, int64_t n);

// Float activations against f32/f16/bf16 weight rows.
float vec_dot_f32(GgmlType t, const void* w_row, const float* x, int64_t n);

// The portable (non-SIMD) kernels behind the two dots above, which pick an AVX2 path at run time
// where the CPU has one; exposed so tests and benchmarks can check and time both.
float vec_dot_pad40_portable(GgmlType t, const void* w_row, const BlockQ8Pad40* x, int64_t n);
float vec_dot_f32_portable(GgmlType t, const void* w_row, const float* x, int64_t n);

}  // namespace minfer
