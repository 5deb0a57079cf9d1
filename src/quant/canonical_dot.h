// The canonical summation order of the decode matmuls (docs/10-batching.md), written out in plain
// C++ with the same roundings as the GPU kernels: the bitwise oracle for both of them (the
// warp-per-row kernel and the tensor-core kernel must return exactly these bits, for any number of
// tokens), and a readable statement of the order itself.
//
// The activation row is pad40 as quantize_row_pad40_grouped writes it: the 8 blocks of a 256-column group
// share one scale, da (read from the group's first block). For a weight row of K columns:
//   term of group g (columns 256g .. 256g + 255):
//     q4_K / q5_K  S = sum_j sc_j * isum_j, M = sum_j m_j * asum_j (exact int32 over the 8
//                  sub-blocks), T = da * fma(d, S, -(dmin * M))
//     q6_K         S = sum_h sc_h * isum_h over the 16 halves of 16 columns, T = (d * da) * S
//     q8_0         T = ((t0 + t1) + (t2 + t3)) + ((t4 + t5) + (t6 + t7)),
//                  t_j = (d_j * da_j) * isum_j of block 8g + j, +0 past the row's end
//     (isum: the exact integer dot of the quants; asum: the activation block's sum; every product
//      and sum rounded to f32, int to f32 by round-to-nearest)
//   stream s = 0..7: the groups g = s, s + 8, ... added in order to 0
//   y = ((S0 + S4) + (S2 + S6)) + ((S1 + S5) + (S3 + S7)), then + bias, then + residual.
// One float term per group (not per 32 columns) is what lets the tensor-core kernel keep up with
// many tokens: the per-sub-block work is integer multiply-adds and tensor-core products.
#pragma once
#include <cstdint>

#include "quant/types.h"

namespace minfer {

// Types the canonical order covers.
bool has_canonical_dot(GgmlType t);
// One row; cols a multiple of the type's block size; x as quantize_row_pad40_grouped writes it.
float canonical_dot(GgmlType t, const uint8_t* w_row, const BlockQ8Pad40* x, int64_t cols);

}  // namespace minfer
