// The canonical summation order of the decode matmuls (docs/10-batching.md), written out in plain
// C++ with the same roundings as the GPU kernels: the bitwise oracle for both of them (the
// warp-per-row kernel and the tensor-core kernel must return exactly these bits, for any number of
// tokens), and a readable statement of the order itself.
//
// For a weight row of K columns against one pad40 activation row:
//   term of 32-column sub-block j: q4_K/q5_K  da * fma(d*sc, isum, -(dmin*m) * asum)
//                                  q6_K       (d * da) * (sc_lo * isum_lo + sc_hi * isum_hi)
//                                  q8_0       (d * da) * isum
//     (isum: the exact integer dot of the quants; asum, da: the activation block's sum and scale;
//      every product and sum rounded to f32, int to f32 by round-to-nearest)
//   group g (columns 256g .. 256g + 255): ((T0 + T1) + (T2 + T3)) + ((T4 + T5) + (T6 + T7)),
//     missing sub-blocks (q8_0 rows that end inside a group) counting as +0
//   stream s = 0..7: the groups g = s, s + 8, ... added in order to 0
//   y = ((S0 + S4) + (S2 + S6)) + ((S1 + S5) + (S3 + S7)), then + bias, then + residual.
#pragma once
#include <cstdint>

#include "quant/types.h"

namespace minfer {

// Types the canonical order covers.
bool has_canonical_dot(GgmlType t);
// One row; cols a multiple of the type's block size.
float canonical_dot(GgmlType t, const uint8_t* w_row, const BlockQ8Pad40* x, int64_t cols);

}  // namespace minfer
