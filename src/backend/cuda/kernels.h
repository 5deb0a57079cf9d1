// Host-callable launchers of the CUDA backend's kernels, and the device-side layout of weights.
// Plain C++ (no CUDA syntax), so the backend and the GPU tests can include it from .cpp files.
// Every launcher checks its launch and throws minfer::Error naming the kernel on failure.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "quant/types.h"

namespace minfer::cuda {

// Where a launcher enqueues its kernels, and whether they may use Programmatic Dependent Launch
// (start while the kernel before them drains; launch.cuh). `pdl`: a launch's first kernel after
// the stream's previous one (the backend allows it for steps of up to 32 rows); `pdl_within`:
// the wgmma matmul after its operand builder or the image's producer, at any step size.
// MINFER_NO_PDL (Fusions::pdl) turns both off. `release_early` (with `pdl`): the row rms_norm and
// the decode attention's split and combine let the next kernel launch at their start (launch.cuh;
// MINFER_NO_EARLY_DEPENDENTS, Fusions::early_dependents, turns it off).
struct KernelStream {
  cudaStream_t stream = nullptr;
  bool pdl = false;
  bool pdl_within = true;
  bool release_early = false;
  KernelStream(cudaStream_t s = nullptr, bool allow_pdl = false, bool allow_pdl_within = true)
      : stream(s), pdl(allow_pdl), pdl_within(allow_pdl_within) {}
  bool releases_early() const { return pdl && release_early; }
};

// A weight matrix on the device, rows x cols, in its device layout (every kernel, the prefill GEMM
// included, reads the same bytes): the GGUF blocks as they are, except q6_K's, padded from 210 to
// kQ6KDeviceBlockBytes so that every block starts 4-byte aligned and its kernels load whole words
// (words assembled from two loads each, and their addresses, made the q6_K matmul the slowest per
// weight; docs/10 §5), and q6_K rows padded with zeros to a multiple of 16 bytes
// (q6k_device_row_bytes) so that every row starts 16-byte aligned (a tensor copy's box must start
// 16-byte aligned in global memory: the weight rings copy a round of 8 rows as one box, docs/13).
// q4_K/q5_K blocks are 16-byte multiples; the 32-blocks are only 2-byte aligned, so their kernels
// assemble words from aligned loads, which read up to one word past a row's last byte: a buffer
// holding matrices keeps kWeightsTailBytes readable bytes after the last one (the weights arena,
// and the GPU tests' weights).
constexpr int64_t kWeightsTailBytes = 64;
struct DevMat {
  GgmlType type = GgmlType::F32;
  int rows = 0, cols = 0;
  const uint8_t* data = nullptr;
};
constexpr int kQ6KDeviceBlockBytes = 212;  // ql[128] qh[64] scales[16] d, then 2 bytes of zeros
// Bytes of a q6_K row of `groups` 256-column groups on the device: its blocks, then zeros to a
// multiple of 16 (8 bytes where groups is 2 modulo 4, as in the 7B's rows of 3,584 and 18,944).
constexpr int64_t q6k_device_row_bytes(int64_t groups) { return (groups * kQ6KDeviceBlockBytes + 15) / 16 * 16; }
// Bytes of one row of `cols` values of type t in the device layout.
int64_t device_row_bytes(GgmlType t, int64_t cols);
// Copies n_rows consecutive GGUF rows of `cols` values of type t from src into the device layout
// at dst (device_row_bytes(t, cols) a row).
void copy_rows_to_device_layout(GgmlType t, int64_t cols, const uint8_t* src, int64_t n_rows, uint8_t* dst);
// A matrix's GGUF bytes (whole rows of `cols` values) in the device layout.
std::vector<uint8_t> device_layout(GgmlType t, int64_t cols, const std::vector<uint8_t>& gguf_bytes);
bool cuda_supports_weight_type(GgmlType t);

// The decode activation plane: rows of f32 activations quantized to int8 with one f16 scale per
// 256 columns (the numbers of quantize_row_pad40_grouped, quant/quant.h), stored as three arrays
// so that the tensor-core matmul reads a B fragment (8 tokens x 32 columns) as one contiguous,
// 8-byte-aligned run of 256 bytes, and the four fragments of a 32-token tile's block as one run of
// 1 KB (a CTA then addresses every fragment and sub-block from one pointer by immediate offsets):
//   quants  of token t, 32-column block b: 32 int8 at
//           ((t / 32) * n_blocks + b) * 1024 + (t / 8 % 4) * 256 + (t % 8) * 32
//   scales  of token t, 256-column group g: f16 at [g * token_rows + t] (group-major: a group's
//           scales of neighbouring tokens are adjacent, so the tensor-core matmul reads a thread's
//           two tokens' scales as one 4-byte load at an immediate offset from one pointer)
//   sums    of the 32 quants of (t, b): int32 at [t * n_blocks + b] (the k-quant min terms of the
//           warp-per-row kernel)
//   digits  the same sums as two int8 digits, sum = 64 h + l (l in 0..63, h in -64..63), laid out
//           as the B fragments of the tensor-core matmul's min product M = sum_j m_j sum_j: per
//           32-token tile and group 512 bytes, [t / 8 % 4][(t % 8) / 2][part l, h][j / 4][t % 2]
//           [j % 4] (j = b % 8; sum_digits(t, g) points at the run of t's token pair)
// A view may start at token token0 of its plane (the warp-per-row kernel's launches of 8 tokens,
// the prompt rows of a matmul without a GEMM).
struct Q8Plane {
  uint8_t* quants = nullptr;
  uint16_t* scales = nullptr;
  int32_t* sums = nullptr;
  uint8_t* digits = nullptr;
  int n_blocks = 0;
  int token0 = 0;
  int token_rows = 0;  // tokens the plane holds, a multiple of 32

  constexpr int n_groups() const { return (n_blocks + 7) / 8; }
  constexpr uint8_t* block_quants(int t, int b) const {
    t += token0;
    return quants + (size_t(t / 32) * size_t(n_blocks) + size_t(b)) * 1024 + size_t(t / 8 % 4) * 256 + size_t(t % 8) * 32;
  }
  constexpr uint16_t* scale(int t, int g) const { return scales + size_t(g) * size_t(token_rows) + size_t(t + token0); }
  constexpr int32_t* sum(int t, int b) const { return sums + size_t(t + token0) * size_t(n_blocks) + size_t(b); }
  // The digits' strides in bytes (the layout above; the matmul reads them at these offsets).
  static constexpr int kDigitsFragment = 128, kDigitsPair = 32, kDigitsPart = 16, kDigitsHalf = 8, kDigitsParity = 4;
  constexpr uint8_t* sum_digits(int t, int g) const {
    t += token0;
    return digits + (size_t(t / 32) * size_t(n_groups()) + size_t(g)) * 4 * kDigitsFragment +
           size_t(t / 8 % 4) * kDigitsFragment + size_t(t % 8 / 2) * kDigitsPair;
  }
  // Block b's sum as its digits (the producers' store; the host's packing in the GPU tests).
  constexpr void set_sum(int t, int b, int32_t s) const {
    *sum(t, b) = s;
    uint8_t* d = sum_digits(t, b / 8) + (b % 8 / 4) * kDigitsHalf + (t + token0) % 2 * kDigitsParity + b % 4;
    d[0] = uint8_t(s & 63);                        // l
    d[kDigitsPart] = uint8_t(int8_t(s >> 6));      // h: s = 64 h + l (arithmetic shift)
  }
  constexpr Q8Plane from_token(int t) const {
    Q8Plane v = *this;
    v.token0 += t;
    return v;
  }
};
// Bytes of a plane of `tokens` rows of `width` columns (tokens rounded up to whole tiles of 32), and
// the plane carved from such a buffer (256-byte aligned).
int64_t q8_plane_bytes(int tokens, int width);
Q8Plane q8_plane(uint8_t* buffer, int tokens, int width);

// The wgmma decode matmul's operand image (operand_image.cuh) that a q8 plane's producer writes
// beside the plane for the matmul that reads it next, in that weight format's k order; format
// None: no image.
enum class OperandFormat : uint8_t { None, Q4K, Q6K };
struct OperandImage {
  uint8_t* image = nullptr;
  OperandFormat format = OperandFormat::None;
};

// ---- elementwise / norm ------------------------------------------------------------------------
// rows of width `width` (x rows ld_x floats apart); group > 0 normalises each group separately.
// q8_rows > 0: also writes the first q8_rows output rows to the q8 plane (the producer-fused
// A-quantize; needs group == 0 and width % 32 == 0; q8.n_blocks == width / 32). bf16: also writes
// every output row as the prompt GEMM's bf16 plane, [n_rows][width] (prefill_activation_bf16,
// the standalone conversion's bits; 16-byte aligned). image.format != None: also the q8 rows'
// operand image (check_operand_image: q8_rows in 1..64, width % 256 == 0), the bytes
// launch_build_operand_image writes for those rows; its other token rows are left as they are.
void launch_rms_norm(const float* x, int ld_x, const float* w, float* out, int ld_out, int n_rows,
                     int width, int group, float eps, const Q8Plane& q8, int q8_rows, const KernelStream& s,
                     uint16_t* bf16 = nullptr, const OperandImage& image = {});
// out = silu(gate) * up over n_rows x width (row-contiguous); q8, bf16 and image as for rms_norm.
void launch_swiglu(const float* gate, const float* up, float* out, int n_rows, int width,
                   const Q8Plane& q8, int q8_rows, const KernelStream& s, uint16_t* bf16 = nullptr,
                   const OperandImage& image = {});
void launch_add(const float* a, const float* b, float* out, int64_t n, const KernelStream& s);
// The standalone quantize: n_rows rows of width floats (ld_x apart) to tokens 0.. of the q8 plane.
void launch_quantize_q8(const float* x, int ld_x, const Q8Plane& q8, int n_rows, int width, const KernelStream& s);
// out[t] = row tokens[t] of the embedding matrix, dequantized to f32.
void launch_embed(const DevMat& emb, const int32_t* tokens, float* out, int n_tokens,
                  const KernelStream& s);
// rows [row0, row0 + n_rows) of m as f32 (tests and embedding share this path).
void launch_dequantize_rows(const DevMat& m, int row0, int n_rows, float* out, const KernelStream& s);
// dst[i] = src[rows[i]] for i < n_rows (rows of width floats; ld floats apart in src and dst).
void launch_gather_rows(const float* src, int ld, const int32_t* rows, int n_rows, int width, float* dst,
                        const KernelStream& s);
// result[r] = index of the largest value of row r (first one on ties; NaN never wins; 0 for a row
// with no value above -FLT_MAX), rows `ld` floats apart. Each row is scanned in kArgmaxSlices slices by
// as many blocks (one block reading a 152k-entry row alone is latency-bound: 60 us); candidates
// (n_rows * kArgmaxSlices) holds the slices' winners for the second pass.
constexpr int kArgmaxSlices = 32;
struct ArgmaxCandidate {
  float value;
  int32_t index;
};
// result[i] = the first index of row i's largest value (0 when it has none); next_tokens, when not
// null, gets the same (the token section of the step a fed step runs in).
void launch_argmax_rows(const float* x, int ld, int n_rows, int width, ArgmaxCandidate* candidates, int32_t* result,
                        int32_t* next_tokens, const KernelStream& s);

// tokens[i] = one draw from softmax(row jobs[i].row / temperature) over `width` entries with the
// job's uniform number, bit for bit the host's draw_softmax (sampling/draw_math.h); rows `ld`
// floats apart. One block a job.
struct DrawJob {
  int32_t row = 0;
  float temperature = 1.0f;
  double uniform = 0.0;
};
void launch_draw_softmax(const float* x, int64_t ld, int width, const DrawJob* jobs, int n_jobs, int32_t* tokens,
                         const KernelStream& s);

// ---- rope / kv cache ---------------------------------------------------------------------------
struct RopeParams {
  const float* inv_freq = nullptr;  // [head_dim / 2]: theta_j = pos * inv_freq[j]
  int head_dim = 0;
  bool neox = false;  // pairs (j, j + hd/2) within a head, else (2j, 2j + 1)
};
// In place on n_tokens rows of n_heads * head_dim floats (ld apart); token t at positions[t].
void launch_rope(float* x, int ld, int n_tokens, int n_heads, const RopeParams& rp,
                 const int32_t* positions, const KernelStream& s);
// One layer of the paged KV cache: f16 rows of n_kv_heads * head_dim, one per slot; the slot of
// position p of a sequence is table[p / block_size] * block_size + p % block_size.
struct KvLayer {
  uint16_t* k = nullptr;
  uint16_t* v = nullptr;
  int n_kv_heads = 0, head_dim = 0;
};
// Writes n_tokens rows of k and v (n_kv_heads * head_dim floats each) to slots[t].
void launch_kv_append(const float* k, const float* v, int n_tokens, const KvLayer& kv,
                      const int32_t* slots, const KernelStream& s);

// rope on n_tokens rows of q (n_q_heads heads, ldq apart) and of k, then k and v rows (ld_kv =
// n_kv_heads * head_dim apart) into the cache at slots[t]: launch_rope on q and on k followed by
// launch_kv_append, bit for bit, in one launch.
void launch_rope_kv(float* q, int ldq, float* k, const float* v, int ld_kv, int n_tokens, int n_q_heads,
                    const RopeParams& rp, const KvLayer& kv, const int32_t* positions, const int32_t* slots,
                    const KernelStream& s);

// ---- the decode matmul: y = W x for tokens whose activations are q8 plane rows ---------------------
// What a segment's epilogue does with each row pair after bias and residual.
enum class Epilogue : int {
  Store,     // out[t][r] = v
  RopeQ,     // rope the pair, store to out
  RopeK,     // rope the pair, write f16 into the K cache (out unused)
  StoreV,    // write f16 into the V cache
};
// Weight matrices one decode-matmul launch takes (q/k/v; gate/up; one).
constexpr int kMaxMatSegs = 3;
struct MatSeg {
  DevMat w;
  const float* bias = nullptr;      // [rows]
  const float* residual = nullptr;  // [n_tokens][ld_out]: out = dot + bias + residual
  float* out = nullptr;             // [n_tokens][ld_out]
  int ld_out = 0;
  Epilogue epi = Epilogue::Store;
};
struct MatVecExtra {
  RopeParams rope;                   // RopeQ / RopeK (pairs follow rope.neox)
  const int32_t* positions = nullptr;  // [n_tokens]
  const int32_t* slots = nullptr;      // [n_tokens]: KV cache rows for RopeK / StoreV
  KvLayer kv;
  // The operand image of the q4_K / q6_K decode matmul on warpgroup MMA (matmul_wgmma.cu), written
  // by each launch that takes it unless wgmma_operand_ready; null: launch_matmul_mma never takes
  // that kernel.
  uint8_t* wgmma_operand = nullptr;
  int64_t wgmma_operand_bytes = 0;
  // The image already holds this plane's rows in this format (its producer wrote it): the launch
  // of that format skips its builder.
  OperandFormat wgmma_operand_ready = OperandFormat::None;
  // The tensor-core decode matmul's CTAs at one token fragment (<= 8 tokens): 0, at most the CTAs
  // sm_count multiprocessors hold at once, each taking several row tiles (one a row tile when
  // sm_count is 0); > 0, at most that many; < 0, one a row tile. The same bits whichever.
  int decode_ctas = 0;
  int sm_count = 0;  // the device's multiprocessors (DeviceContext::sm_count)
  // The tensor-core decode matmul at one token fragment takes q4_K and q6_K segments (q/k with a
  // q6_K v) in one launch, unless this is set: a launch per type. The same bits.
  bool launch_per_type = false;
  // That launch streams both types' weights through the weight ring, one row tile a CTA running its
  // type's ring (matmul_mma_weight_ring_q4k_q6k_kernel, one wave at three CTAs an SM, rows of
  // more than 8 groups), unless this is set: the register kernel where its row tiles fit one wave
  // at three CTAs an SM, else a launch per type. The same bits.
  bool two_type_register_kernel = false;
  // Where that matmul launches a weight type at a time at one token fragment, the type of the
  // fewest row tiles launches first and the others beside it (they read the plane it reads, written
  // before it passed its PDL wait, and write rows of their own), each waiting for the launch before
  // it only before its CTAs exit: the 14B's q6_K v, then its q/k. The same bits.
  bool types_side_by_side = false;
  // The tensor-core decode matmul at one token fragment keeps more than one group's weights in
  // flight a warp where its rows have more groups than the CTA's 8 streams and the row tiles fit
  // one wave at two to four CTAs an SM (down, o, q/k/v), unless this is set: one group.
  // The same bits.
  bool one_group_in_flight = false;
  // There that matmul streams the tile's weights through a ring of stages in shared memory (bulk
  // copies, matmul_mma_weight_ring_kernel, at two CTAs an SM, else three, else four) unless this
  // is set: two groups in registers where every warp streams more than two and the tiles fit one
  // wave at two CTAs an SM (the 7B's down), else one. So do q4_K launches of more tiles than four
  // CTAs an SM hold (gate/up), four CTAs an SM each taking several tiles, unless this is set: the
  // activations in shared memory. The same bits.
  bool weights_in_registers = false;
  // The tensor-core decode matmul at one token fragment copies the activations into each CTA's
  // shared memory and runs four CTAs an SM where its CTAs take several row tiles (gate/up; q4_K,
  // rows of <= 6,144 columns), unless this is set: B from global memory. The same bits.
  bool activations_from_global = false;
  // The weight ring's launches of one token form only that token's column of each product's
  // fragment (half the scale products and terms, one of the two min products), unless this is
  // set: every column, as for up to 8 tokens. The same bits.
  bool every_token_column = false;
  // The weight rings copy each round's rows one bulk copy a row instead of a tensor copy a half tile
  // (matmul_mma.cu's RingCopyMaps; MINFER_NO_RING_TENSOR_COPIES). The same bits.
  bool ring_row_copies = false;
  // The weight rings' copies pass the weights through L2 evict-first (read once a step, they would
  // otherwise push out what the step's small kernels re-read: norms' weights, biases, the residual,
  // short-context K/V), unless this is set: evict-unchanged, L2's own choice
  // (MINFER_NO_L2_EVICT_FIRST). The same bits.
  bool weights_l2_unchanged = false;
  // The swiglu in the epilogue of a gate/up launch (segments 0 and 1 gate and up: one type, the same
  // shape, rows a multiple of 256, no bias or residual), where swiglu_counts is set and the launch
  // takes the weight ring over several tiles: a row tile is gate rows 8i..8i+7 above up rows
  // 8i..8i+7, its join writes silu(gate) * up (the swiglu kernel's function) into swiglu_out, and
  // the CTA that counts the last of a 256-column group's 32 tiles (each CTA counts its tiles after
  // its last) quantizes the group's first swiglu_q8_rows tokens into swiglu_q8 (the standalone
  // quantize's bits). swiglu_counts: rows / 256 counters, zero between launches (that CTA sets its
  // group's back). The same bits as the matmul, then the swiglu kernel.
  float* swiglu_out = nullptr;
  int swiglu_ld = 0;
  Q8Plane swiglu_q8;
  int swiglu_q8_rows = 0;
  int* swiglu_counts = nullptr;
};
// For the quantized types with a tensor-core kernel (q4_K, q5_K, q6_K, q8_0) every output element
// is summed in one fixed order that depends only on the weight type and K ("the canonical order",
// quant/canonical_dot.h, docs/10-batching.md): one float term per 256-column group (formed from
// exact integer sums, which needs the q8 plane's one scale per group); groups g go to stream
// g % 8, each stream summed in order; a tree over the 8 streams; + bias; + residual. The kernels
// below (and the q4_K / q6_K warpgroup-MMA kernel) follow it, so for these types they give the
// same bits for any token count.
bool matmul_mma_supports(GgmlType t);
// The segments of segs[first]'s type from first on, in order, into of_type (marked taken);
// returns their count. The matmuls launch per weight type: a kernel per type keeps its
// registers to what that type needs.
int segments_of_type(const MatSeg* segs, int n_segs, int first, bool (&taken)[kMaxMatSegs],
                     MatSeg (&of_type)[kMaxMatSegs]);
// Warp-per-row-pair kernel (dp4a): up to kMaxMatSegs weight matrices in one launch (q/k/v, gate/up),
// tokens in launches of 8, one token in a launch per weight type. Activations: the q8 plane's
// tokens 0..n_tokens-1 for quantized weights, f32 rows for float weights (their own fixed order).
void launch_matvec(const MatSeg* segs, int n_segs, const Q8Plane& act_q8, const float* act_f32, int act_f32_stride,
                   int n_tokens, const MatVecExtra& extra, const KernelStream& s);
// Whether gate/up (segs[0], segs[1]) at n_tokens takes the swiglu in its epilogue: q4_K, <= 8
// tokens, and launch_matmul_mma would run the weight ring over several tiles on them.
bool matmul_mma_swiglu_takes(const MatSeg (&segs)[2], int n_tokens, const MatVecExtra& extra);
// The gate/up launch with the swiglu in its epilogue (MatVecExtra::swiglu_out ...). REQUIRES
// matmul_mma_swiglu_takes; swiglu_q8 is not act_q8's buffer (the launch's last tiles quantize
// while other CTAs still read their activations).
void launch_matmul_mma_swiglu(const MatSeg (&segs)[2], const Q8Plane& act_q8, int n_tokens, const MatVecExtra& extra,
                              const KernelStream& s);
// Tensor-core kernel (int8 mma): same segments and epilogues, every type matmul_mma_supports.
// REQUIRES act_q8.token0 % 32 == 0 (its fragments are the plane's tiles).
void launch_matmul_mma(const MatSeg* segs, int n_segs, const Q8Plane& act_q8, int n_tokens, const MatVecExtra& extra,
                       const KernelStream& s);
// Whether launch_matmul_mma runs these segments (one k-quant type, <= 8 tokens) with two groups'
// weights in flight a warp in registers (MatVecExtra::one_group_in_flight, weights_in_registers).
bool matmul_mma_two_groups_in_flight(const MatSeg* segs, int n_segs, int n_tokens, const MatVecExtra& extra);
// The CTAs an SM (2 to 4) at which launch_matmul_mma runs these segments (one k-quant type, <= 8
// tokens) with their weights through a ring in shared memory (MatVecExtra::weights_in_registers);
// 0 where it does not.
int matmul_mma_weight_ring_ctas_per_sm(const MatSeg* segs, int n_segs, int n_tokens, const MatVecExtra& extra);
// The CTAs an SM (3) at which launch_matmul_mma runs q4_K and q6_K segments (<= 8 tokens) in
// one launch of the weight ring (MatVecExtra::two_type_register_kernel); 0 where it does not.
int matmul_mma_two_type_ring_ctas_per_sm(const MatSeg* segs, int n_segs, int n_tokens, const MatVecExtra& extra);
// Whether launch_matmul_mma runs these segments (one k-quant type, <= 8 tokens) with their weights
// through a ring in shared memory over several row tiles a CTA (gate/up;
// MatVecExtra::weights_in_registers).
bool matmul_mma_weight_ring_over_tiles(const MatSeg* segs, int n_segs, int n_tokens, const MatVecExtra& extra);
// Whether launch_matmul_mma runs these segments (one k-quant type, <= 8 tokens) through a weight
// ring whose rounds come in by tensor copies, a copy a half tile (MatVecExtra::ring_row_copies).
bool matmul_mma_ring_tensor_copies(const MatSeg* segs, int n_segs, int n_tokens, const MatVecExtra& extra);
// Whether launch_matmul_mma runs these segments (one k-quant type, <= 8 tokens) with the
// activations in shared memory (MatVecExtra::activations_from_global).
bool matmul_mma_shared_activations(const MatSeg* segs, int n_segs, int n_tokens, const MatVecExtra& extra);
// The q4_K and q6_K decode matmul on warpgroup MMA (sm_90a) for kWgmmaMinTokens..64 tokens: the
// canonical order's bits from f16 tensor-core products of exact integers (matmul_wgmma.cu).
// launch_matmul_mma takes it for a type's segments of a launch when matmul_wgmma_takes says so:
// extra.wgmma_operand holds wgmma_operand_bytes(cols), every segment stores (bias and residual
// allowed, no rope or KV write) and all have the same cols. The caller sets wgmma_operand only on an
// sm_90 device.
constexpr int kWgmmaMinTokens = 33;
int64_t wgmma_operand_bytes(int width);
bool matmul_wgmma_takes(const MatSeg* segs, int n_segs, int n_tokens, const MatVecExtra& extra);
void launch_matmul_wgmma(const MatSeg* segs, int n_segs, const Q8Plane& act_q8, int n_tokens, const MatVecExtra& extra,
                         const KernelStream& s);
// The format of the first operand image launch_matmul_mma would build for these arguments (the
// first of its per-type launches that takes the wgmma kernel), or None.
OperandFormat matmul_mma_operand_format(const MatSeg* segs, int n_segs, int n_tokens, const MatVecExtra& extra);
// Fails, naming `writer`, unless an image of that format can hold n_tokens rows of width columns
// (1..64 rows of whole 256-column groups, a buffer); format None passes.
void check_operand_image(const char* writer, const OperandImage& image, int n_tokens, int width);
// The wgmma matmul's own builder: tokens 0..n_tokens-1 of the plane (width columns) into the image,
// zeros in its other token rows.
void launch_build_operand_image(const Q8Plane& plane, int n_tokens, int width, const OperandImage& image,
                                const KernelStream& s);

// ---- decode attention over the paged cache ------------------------------------------------------
struct AttnParams {
  const float* q = nullptr;  // [n_tokens][n_head * head_dim]
  float* out = nullptr;      // [n_tokens][n_head * head_dim]
  KvLayer kv;
  int n_head = 0;
  int n_tokens = 0;
  const int32_t* positions = nullptr;     // token t attends to positions [0, positions[t]]
  const int32_t* tables = nullptr;        // block tables, concatenated
  const int32_t* table_offsets = nullptr; // [n_tokens]: token t's table starts at tables[offset]
  int block_size = 0;                     // a power of two
  // Split-K over the KV length: at most n_splits slices of at least two block iterations each (64
  // positions at head_dim 128, 128 at 64). The slice boundaries depend only on the length, so a
  // token's bits do not depend on the batch.
  int n_splits = 1;
  // Blocks a KV head's q heads are spread over (at least as many as kAttnMaxHeads asks): launch
  // geometry only, no bit depends on it (a head's arithmetic involves no other head).
  int head_chunks = 1;
  // The f16 tensor-core body (head_dim 64 and 128; q and the probabilities as f16 hi + lo pairs),
  // or CUDA cores (false, and always at head_dim 256). The backend clears it with
  // MINFER_NO_MMA_ATTENTION.
  bool tensor_cores = true;
  // The combine where its CTAs are no more than the SMs: one CTA an SM (combine_spread; the
  // backend clears it with MINFER_NO_COMBINE_SPREAD) and the partials bulk-copied into shared
  // memory (combine_staging; MINFER_NO_COMBINE_STAGING). Launch geometry and load path only: no
  // bit depends on them.
  bool combine_spread = true;
  bool combine_staging = true;
  // The split's K/V loads evict-first in L2 (a decode step reads each position's K and V once),
  // or (the backend clears it with MINFER_NO_L2_EVICT_FIRST) evict-unchanged. No bit depends on it.
  bool kv_evict_first = true;
  // The split and combine kernels read each token's position and block table, and the split its
  // K/V rows before the token's own position, before their PDL wait, i.e. while the launch before
  // them may still run. Set it only where no kernel of the stream writes those: the decode step,
  // whose rows, tables and block copies are copied in before its first kernel and whose q/k/v launch
  // writes each token's own row only. The backend clears it with MINFER_NO_EARLY_ATTENTION_READS.
  bool early_reads = false;
  float* part = nullptr;  // workspace: attention_workspace_floats(...)
  int sm_count = 0;  // the device's multiprocessors (DeviceContext::sm_count): the split launch fills one wave
  // q8_rows > 0: the combine also writes tokens 0..q8_rows-1 of the output to the q8 plane (the
  // producer-fused A-quantize of the o-projection; the standalone quantize's bits). Needs
  // 256 % head_dim == 0 and whole 256-column groups (n_head * head_dim % 256 == 0).
  Q8Plane q8;
  int q8_rows = 0;
};
int64_t attention_workspace_floats(int n_tokens, int n_head, int head_dim, int n_splits);
// AttnParams::n_splits for decode on a device of sm_count multiprocessors: two waves' worth of
// slices a KV head, so one sequence's long context fills the card.
int decode_attention_splits(int sm_count, int n_kv_heads);
// The slices holding positions of a sequence of len positions (what the split launch works on).
int attention_slices(int len, int n_splits, int head_dim);
void launch_attention(const AttnParams& p, const KernelStream& s);

}  // namespace minfer::cuda
