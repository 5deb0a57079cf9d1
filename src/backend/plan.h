// The lowering pass: the forward graph, the fusion switches and the shape of a step become the
// list of launches a GPU backend executes. Launch, CUDA-graph capture, the census, dumps and the
// tests all read this one list; a fusion is a named rule here, each with its environment opt-out,
// and switched off it restores the node-by-node launches bit for bit.
//
// Rows of a step: decode rows [0, D) (generated tokens: the decode matmul, split-K decode
// attention), prompt rows [D, n) (the prompt GEMM, flash attention), output rows [0, n_out) of the
// gathered output slot (the decode matmul for the head). Elementwise launches cover all rows.
#pragma once
#include <array>
#include <string>
#include <vector>

#include "graph/graph.h"

namespace minfer {

struct Fusions {
  bool decode_a_fuse = true;   // MINFER_NO_DECODE_A_FUSE: rms_norm/swiglu/attention write the q8 plane
  bool attention_q8 = true;    // MINFER_NO_ATTENTION_Q8: of those, the decode attention (with decode_a_fuse)
  bool prompt_a_fuse = true;   // MINFER_NO_PROMPT_A_FUSE: rms_norm/swiglu/attention write the bf16 plane
  bool cuda_graph = true;      // MINFER_NO_CUDA_GRAPH: launch decode steps one by one
  bool fused_qkv = true;       // MINFER_NO_FUSED_QKV: q/k/v (+ bias, rope, KV write) in one launch
  bool fused_ffn = true;       // MINFER_NO_FUSED_FFN: gate and up in one launch
  // MINFER_NO_SWIGLU_IN_MATMUL: a decode-only step's swiglu (and its q8 plane) in that launch's
  // epilogue where the backend's kernel takes it (CUDA backend), not a launch of its own
  bool swiglu_in_matmul = true;
  bool gemm_swiglu = true;     // MINFER_NO_GEMM_SWIGLU: prompt rows' gate, up and swiglu in one GEMM
  bool fused_rope_kv = true;   // MINFER_NO_FUSED_ROPE_KV: prompt rows' q/k rope and KV write in one launch
  bool concurrent_gemms = true;  // MINFER_NO_CONCURRENT_GEMMS: q/k/v GEMMs of two types on two streams
  // MINFER_NO_DECODE_BESIDE_PROMPT: a step's decode rows and prompt rows (independent up to the
  // output rows) run on two streams, the decode rows' urgent (CUDA backend)
  bool decode_beside_prompt = true;
  bool fused_residual = true;  // MINFER_NO_FUSED_RESIDUAL: residual add in the matmul epilogue
  bool pdl = true;             // MINFER_NO_PDL: each kernel starts only after the one before it ends
  // MINFER_NO_EARLY_DEPENDENTS: with pdl, the row rms_norm and the decode attention let the next
  // kernel launch only after their own wait, not at their start (CUDA backend)
  bool early_dependents = true;
  // MINFER_NO_OPERAND_IMAGE_FUSE: the wgmma decode matmul builds its operand image in a launch of
  // its own instead of the q8 plane's producer writing it (CUDA backend)
  bool operand_image = true;
  // MINFER_NONDETERMINISTIC: plan the prompt GEMM's K split for each launch's own token count
  // (otherwise for a fixed count, so a token's bits do not depend on the batch around it).
  bool batch_invariant = true;
  static Fusions from_env();
  static Fusions none();  // everything off (dumps; the reference side of the opt-out tests)
};

enum class Rows : uint8_t { All, Decode, Prompt, Output };

enum class LaunchKind : uint8_t {
  Embed,            // token rows -> X
  RmsNorm,          // in -> out (rows); writes_q8: also the q8 plane of its decode/output rows
                    // writes_bf16: also the bf16 plane of its rows (the prompt GEMM's input)
  Quantize,         // the q8 plane of `in`'s rows (its producer could not write it)
  ConvertBf16,      // the bf16 plane of `in`'s prompt rows (its producer could not write it)
  DecodeMatmul,     // the decode matmul over decode or output rows: 1-3 segments
  PromptMatmul,     // the prompt GEMM over prompt rows: one segment, q/k/v (stacked) or gate/up (swiglu)
  Rope,             // in place on `out` (rows)
  KvAppend,         // K (in) and V (in2) rows into the cache of `layer`
  RopeKv,           // rope on q (out) and K (in) in place, then K and V (in2) into the cache of `layer`
  DecodeAttention,  // decode rows: q (in) over the cache of `layer` -> out
  PromptAttention,  // prompt rows: q (in) over the cache of `layer` -> out (writes_bf16 as RmsNorm)
  SwiGLU,           // silu(in) * in2 -> out (writes_q8, writes_bf16 as RmsNorm)
  Add,              // in + in2 -> out
  GatherOutputRows, // rows of `in` wanted for output -> the output slot
  Argmax,           // of each output row of `in`
};

enum class SegmentEpilogue : uint8_t { Store, RopeQ, RopeK, StoreV };

constexpr int kOutputRowsSlot = kNumSlots;  // the gathered output rows (n_embd wide)
constexpr int kNumPlanSlots = kNumSlots + 1;

struct Launch {
  LaunchKind kind;
  std::string name;  // census label: the fusion rule or the op ("matvec_qkv_rope_kv", "rms_norm")
  Rows rows = Rows::All;
  int in = -1, in2 = -1, out = -1;
  int node = -1;              // the graph node whose parameters (weights, group, heads) it uses
  int completes_node = -1;    // after this launch, this node's output is complete (dumps)
  // DecodeMatmul / PromptMatmul
  int n_segs = 0;
  std::array<int, 3> seg_node{{-1, -1, -1}};  // matmul nodes: weight, bias, output slot
  std::array<SegmentEpilogue, 3> epi{};
  int residual = -1;          // slot added in the epilogue; the result goes to `out` (the Add's)
  // PromptMatmul, DecodeMatmul: segments gate and up, silu(gate) * up into `out` (a DecodeMatmul
  // also the q8 plane with writes_q8)
  bool swiglu = false;
  // RmsNorm / SwiGLU
  bool writes_q8 = false;
  // RmsNorm / SwiGLU / PromptAttention / the SwiGLU PromptMatmul: the next matmul is a prompt GEMM
  // reading this plane
  bool writes_bf16 = false;
  // The two bf16 planes: which one a writer (or ConvertBf16) fills, which one a PromptMatmul
  // reads. Only the SwiGLU GEMM, reading one plane while writing the other, uses plane 1.
  uint8_t bf16_out = 0, bf16_in = 0;
};

// Which kinds of rows a step has.
struct StepShape {
  bool decode = false;
  bool prompt = false;
  // The output rows are exactly all rows of a decode-only step: the head reads them in place.
  bool output_is_all_rows = false;
};

std::vector<Launch> lower(const Graph& graph, const Fusions& fusions, StepShape shape);

// The GGUF bytes of the weight matrices a matmul launch streams (each segment's once); 0 for the
// other launches. The census divides it (with the attention's KV bytes) by the copy rate.
int64_t launch_weight_bytes(const Launch& l, const Graph& graph);

}  // namespace minfer
