#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <tuple>

#include "backend/cuda/device.h"
#include "backend/cuda/device_timeline.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/prefill.h"
#include "backend/cuda/weights.h"
#include "util/env.h"
#include "util/error.h"

namespace minfer {
namespace cuda {

int mma_min_rows() {
  static const int rows = int(env_int("MINFER_MMA_MIN_ROWS", 1, 1));
  return rows;
}

namespace {

// The wgmma decode matmul builds its operand image in a launch of its own (≈ 4 µs) unless the
// plane's producer wrote it (rms_norm, swiglu: Fusions::operand_image); on a 3584 x 3584 matrix
// at 64 tokens the kernel alone saves ≈ 2 µs (16.0 against 18.3), and o_proj's plane comes from
// the attention combine (no image), so only launches of at least this many weights take it (7B:
// gate/up, ffn_down and the output head).
// MINFER_DECODE_WGMMA_MIN_WEIGHTS overrides it (the tests run the kernel on small models).
int64_t decode_wgmma_min_weights() { return env_int("MINFER_DECODE_WGMMA_MIN_WEIGHTS", int64_t(32) << 20, 0); }

// The most decode rows of a step whose gate/up launch takes the swiglu in its epilogue: it gains
// at one and two rows (H100: 7B +1.0 % / ±0, 14B +1.5 / +1.6 %), not beyond (four: 7B -0.8 %, 14B
// +1.0 %; eight: 7B -5.7 %, 14B -0.7 %; docs/13 §3). MINFER_SWIGLU_EPILOGUE_MAX_ROWS overrides it
// (the tests run the epilogue at more rows; the kernel takes at most 8).
int swiglu_epilogue_max_rows() { return int(env_int("MINFER_SWIGLU_EPILOGUE_MAX_ROWS", 2, 0)); }

// The prompt GEMM's K split is planned for this many tokens whatever a launch holds (batch
// invariance); 512 is the default step size, where the split was tuned (docs/08).
constexpr int kGemmPlanTokens = 512;

// Kernels start with PDL in steps of up to this many rows: below the warpgroup-MMA matmul's 33.
// Measured against MINFER_NO_PDL: +1.5-4.6 % at one sequence, +3.5-6.6 % at 8; against a limit
// of 8 (docs/perf.md, twenty-fifth session, run 6): +2.0 % at 32 rows, +2.8 % at 16, and -3.1 % at
// 64 with the limit at 64, where the matmul's CTAs launched early hold SMs the kernel before needs.
constexpr int kPdlMaxRows = 32;

// The row rms_norm and the decode attention release their dependents at their start
// (KernelStream::release_early) in steps of up to this many rows. At one row the next matmul's
// first rounds then stream during the matmul before (+2.4 / +1.3 % on the 7B / 14B, H100,
// docs/perf.md seventy-eighth session); at eight the 14B lost 0.6 %.
constexpr int kEarlyReleaseMaxRows = 1;

// Decode-only steps are captured per bucket: the row count padded up to the next bucket.
int bucket_rows(int rows) {
  if (rows <= 8) return rows;
  if (rows <= 64) return (rows + 7) / 8 * 8;
  return (rows + 31) / 32 * 32;
}

// Host and device copies of one step's per-row and per-chunk inputs.
struct StepIo {
  std::vector<int32_t> tokens, positions, slots, table_offsets, output_rows, tables;
  std::vector<PrefillChunk> chunks;
  std::vector<PrefillTile> tiles;
  std::vector<PrefillHeadGroup> head_groups;
  int head_group_items = 2;
  void clear() {
    for (auto* v : {&tokens, &positions, &slots, &table_offsets, &output_rows, &tables}) v->clear();
    chunks.clear();
    tiles.clear();
    head_groups.clear();
  }
};

}  // namespace

struct CudaBackend::Impl {
  const Model& model;
  const Graph graph;
  const HParams& hp;
  const Fusions fusions;
  DeviceContext ctx;
  Stream stream;
  // A second stream for GEMMs of one step that may run beside the main stream's (q/k/v runs of
  // different types), forked from and joined back to it by events.
  Stream side_stream;
  Event fork_event, join_event;
  // A mixed step's decode rows beside its prompt rows (Fusions::decode_beside_prompt), forked from
  // and joined back to the main stream, which runs the prompt rows.
  Stream decode_stream{Stream::Urgent{}};
  Event lanes_fork, lanes_join;
  // A fed step's rows go up on upload_stream while the step before it runs; every step's results
  // come back on copy_back_stream, so the main stream goes from one step's last launch to the next
  // step's first.
  Stream upload_stream, copy_back_stream;
  UploadStats upload;
  DeviceWeights weights;
  LoadStats stats;

  // sized by reserve()
  int n_blocks = 0, block_size = 0, max_tokens = 0, max_outputs = 0, decode_splits = 1;
  // The decode attention on the f16 tensor cores (AttnParams::tensor_cores); MINFER_NO_MMA_ATTENTION
  // runs the CUDA-core body (other roundings, so not a Fusions switch).
  const bool attention_tensor_cores = !env_flag("MINFER_NO_MMA_ATTENTION");
  // MINFER_NO_COMBINE_SPREAD / MINFER_NO_COMBINE_STAGING: the decode attention's combine at a few
  // rows without one CTA an SM / with its partials read by the sum loop (AttnParams).
  const bool combine_spread = !env_flag("MINFER_NO_COMBINE_SPREAD");
  const bool combine_staging = !env_flag("MINFER_NO_COMBINE_STAGING");
  // AttnParams::early_reads for the decode attention: the position, block table and older K/V rows
  // read before the PDL wait; MINFER_NO_EARLY_ATTENTION_READS reads everything after it.
  const bool early_attention_reads = !env_flag("MINFER_NO_EARLY_ATTENTION_READS");
  // The q4_K / q6_K decode matmul on warpgroup MMA for 33..64 rows (same bits as the mma.sync
  // kernel): on an sm_90 device unless MINFER_NO_DECODE_WGMMA is set (MINFER_NO_DECODE_WGMMA_Q6K:
  // q4_K only); its operand image (one per launch).
  const bool decode_wgmma = prefill_gemm_device_has_wgmma() && !env_flag("MINFER_NO_DECODE_WGMMA");
  const bool decode_wgmma_q6k = !env_flag("MINFER_NO_DECODE_WGMMA_Q6K");
  const int64_t wgmma_min_weights = decode_wgmma_min_weights();
  const int swiglu_epilogue_rows = swiglu_epilogue_max_rows();
  // MINFER_NO_PERSISTENT_DECODE_MATMUL: the tensor-core decode matmul at one token fragment runs a
  // CTA a row tile (MatVecExtra::decode_ctas < 0) instead of CTAs taking several.
  const bool persistent_decode_matmul = !env_flag("MINFER_NO_PERSISTENT_DECODE_MATMUL");
  // MINFER_NO_TWO_TYPE_DECODE_MATMUL: that matmul launches q/k and a q6_K v apart
  // (MatVecExtra::launch_per_type).
  const bool two_type_decode_matmul = !env_flag("MINFER_NO_TWO_TYPE_DECODE_MATMUL");
  // MINFER_NO_TWO_TYPE_WEIGHT_RING: that launch runs the register kernel (where its row tiles fit
  // one wave of it, else a launch per type) instead of both types' weight rings
  // (MatVecExtra::two_type_register_kernel).
  const bool two_type_weight_ring = !env_flag("MINFER_NO_TWO_TYPE_WEIGHT_RING");
  // MINFER_NO_TYPES_SIDE_BY_SIDE: where that matmul launches a type at a time, the types launch in
  // their segments' order, each waiting for the one before it first (MatVecExtra::types_side_by_side).
  const bool types_side_by_side = !env_flag("MINFER_NO_TYPES_SIDE_BY_SIDE");
  // MINFER_NO_TWO_GROUPS_IN_FLIGHT: that matmul keeps one group's weights in flight a warp
  // (MatVecExtra::one_group_in_flight) instead of more where its warps stream several (down, o,
  // the 7B's q/k/v).
  const bool two_groups_in_flight = !env_flag("MINFER_NO_TWO_GROUPS_IN_FLIGHT");
  // MINFER_NO_WEIGHT_RING: where that matmul would stream a tile's weights through shared memory,
  // it holds two groups in registers (MatVecExtra::weights_in_registers) where that was measured
  // to pay (the 7B's down), else one group; gate/up copies its activations into shared memory.
  const bool weight_ring = !env_flag("MINFER_NO_WEIGHT_RING");
  // MINFER_NO_SHARED_ACTIVATIONS: that matmul reads its activations from global memory
  // (MatVecExtra::activations_from_global) where it would copy them into shared memory (gate/up).
  const bool shared_activations = !env_flag("MINFER_NO_SHARED_ACTIVATIONS");
  // MINFER_NO_ONE_TOKEN_COLUMN: the weight ring's one-token launches form every column of their
  // products (MatVecExtra::every_token_column), as for up to 8 tokens.
  const bool one_token_column = !env_flag("MINFER_NO_ONE_TOKEN_COLUMN");
  // MINFER_NO_RING_TENSOR_COPIES: the weight rings copy a round's rows one bulk copy a row
  // (MatVecExtra::ring_row_copies) instead of a tensor copy a half tile.
  const bool ring_tensor_copies = !env_flag("MINFER_NO_RING_TENSOR_COPIES");
  // MINFER_NO_L2_EVICT_FIRST: the weight rings' copies (MatVecExtra::weights_l2_unchanged) and the
  // decode attention's K/V loads (AttnParams::kv_evict_first) leave L2's eviction to L2.
  const bool l2_evict_first = !env_flag("MINFER_NO_L2_EVICT_FIRST");
  DeviceArray<uint8_t> wgmma_operand;
  std::vector<DeviceArray<uint16_t>> k_cache, v_cache;  // per layer: (n_blocks + 1) blocks
  std::array<DeviceArray<float>, kNumPlanSlots> slots;
  DeviceArray<uint8_t> q8;     // the q8 activation plane's buffer (q8_plane)
  // The prompt GEMM's bf16 activation planes, rows as in the slot they mirror (row r at r * width):
  // written by the producer (rms_norm, swiglu, prompt attention, the SwiGLU GEMM) or a ConvertBf16
  // launch; two, so the SwiGLU GEMM reads one and writes the other (Launch::bf16_in / bf16_out).
  DeviceArray<uint16_t> bf16[2];
  DeviceArray<float> attn_part, gemm_workspace;
  DeviceArray<int32_t> swiglu_counts;  // MatVecExtra::swiglu_counts, zero between launches
  DeviceArray<uint8_t> swiglu_q8;      // swiglu_plane's buffer
  DeviceArray<uint8_t> gemm_weight_image;  // PrefillGemm::weight_image_buffer (empty below its token count)
  // The step's rows and block tables, so that a step uploads them in one copy: six sections of
  // rows_pitch() ints (tokens | positions | slots | table offsets | output rows | argmax), then the
  // tables; grows with the tables. Two, taken by steps in turn (`parity()`): a step's argmax also
  // goes into the other one's tokens, where a step fed by it (StepBatch::tokens_from_previous)
  // finds them while the step before it still runs.
  std::array<DeviceArray<int32_t>, 2> d_step;
  DeviceArray<ArgmaxCandidate> argmax_candidates;
  DeviceArray<int32_t> d_chunks;  // PrefillChunk[max_tokens] | PrefillTile[2 max_tokens]
  DeviceArray<PrefillHeadGroup> d_head_groups;  // grows with the step's prompt tiles
  std::array<PinnedArray<int32_t>, 2> h_staging;  // by parity, as d_step
  std::array<PinnedArray<int32_t>, 2> h_argmax;   // StepOutput::argmax, copied back into page-locked memory
  PinnedArray<float> h_logits;  // StepOutput::logits of the last forward
  // StepBatch::draws (jobs up, tokens back), max_tokens each once a step draws
  PinnedArray<DrawJob> h_draws;
  DeviceArray<DrawJob> d_draws;
  PinnedArray<int32_t> h_drawn;
  DeviceArray<int32_t> d_drawn;
  StepIo io;

  struct Captured {
    GraphExec exec;
    std::vector<Launch> launches;
    std::vector<TimelineLaunch> kernels;  // every kernel launch of the graph (timeline builds)
  };
  // decode-only steps by bucket, attention head chunks and parity
  std::map<std::tuple<int, int, int>, Captured> graphs;
  std::vector<Launch> eager_launches;
  const std::vector<Launch>* launches = &eager_launches;  // of the last step
  int step = 0;  // steps submitted: the index of the step being submitted
  // The step's d_step, h_staging and h_argmax (two of each, taken in turn).
  static int parity_of(int s) { return s % 2; }
  int parity() const { return parity_of(step); }

  // A step's events: begin (before its upload), its upload on upload_stream (a fed step), its
  // launches' begin (split_step_times) and end, the end of its copies back. Three sets, in turn: a
  // step's idle time is read when it is collected, from the end of the step before it, while the
  // step after it may be in flight.
  struct StepEvents {
    Event begin, uploaded, launches_begin, launches_end, end;
  };
  std::array<StepEvents, 3> events;
  StepEvents& events_of(int s) { return events[size_t(s % 3)]; }
  StepTimes step_times;
  int previous_collected = -1;  // the step collected last since reset_step_times
  bool split_steps = false;

  // Steps submitted and not yet collected (two at most), oldest first.
  struct InFlight {
    int step = 0, n_out = 0, n_drawn = 0;
    std::span<const float> logits;
    bool split = false;
    const std::vector<TimelineLaunch>* timeline_kernels = nullptr;  // a step recording the timeline
  };
  std::deque<InFlight> in_flight;
  SubmittedStep last_submitted;
  int last_argmax_rows = 0;  // the rows the last step's argmax wrote into the next one's tokens

  // census: each launch's events and the bytes it must move at least (census_bytes)
  bool census_next = false, timing = false;
  struct CensusMark {
    std::string name;
    int64_t bytes = 0;
    Event begin, end;
  };
  std::vector<CensusMark> marks;

  // timeline (builds with MINFER_TIMELINE): the next step's CTA records and its kernel launches
  bool timeline_next = false;
  std::vector<TimelineLaunch> eager_kernels;
  TimelineSummary last_timeline;

  // CudaBackend::interleave_lanes: the lanes of a mixed step on the main stream, the decode lane
  // this many launches ahead.
  std::optional<int> lanes_lead;

  Impl(const Model& m, Fusions f, int device)
      : model(m), graph(build_graph(m)), hp(m.hp), fusions(f), ctx(device), weights(m, graph, upload) {
    stats.upload_seconds = upload.seconds;
    stats.weight_bytes = upload.bytes;
  }

  int64_t kv_width() const { return int64_t(hp.n_head_kv) * hp.head_dim; }
  int64_t width(int slot) const { return slot == kOutputRowsSlot ? graph.slot_width[kH] : graph.slot_width[size_t(slot)]; }
  float* slot(int s) const { return slots[size_t(s)].get(); }
  // The step's rows (a captured graph's bucket, so its launches' pointers hold).
  size_t rows_pitch() const { return io.tokens.size(); }
  int32_t* rows_section(int i) const { return d_step[size_t(parity())].get() + size_t(i) * rows_pitch(); }
  int32_t* d_next_tokens() const { return d_step[size_t(1 - parity())].get(); }
  int32_t* d_tokens() const { return rows_section(0); }
  int32_t* d_positions() const { return rows_section(1); }
  int32_t* d_slots() const { return rows_section(2); }
  int32_t* d_table_offsets() const { return rows_section(3); }
  int32_t* d_output_rows() const { return rows_section(4); }
  int32_t* d_argmax() const { return rows_section(5); }
  int32_t* d_tables() const { return rows_section(6); }
  PrefillChunk* d_prefill_chunks() const { return reinterpret_cast<PrefillChunk*>(d_chunks.get()); }
  PrefillTile* d_prefill_tiles() const {
    return reinterpret_cast<PrefillTile*>(d_chunks.get() + 4 * size_t(max_tokens));
  }
  KvLayer kv_layer(int layer) const {
    return {k_cache[size_t(layer)].get(), v_cache[size_t(layer)].get(), hp.n_head_kv, hp.head_dim};
  }
  RopeParams rope() const { return {weights.inv_freq(), hp.head_dim, hp.rope_type == RopeType::NeoX}; }

  // The weight rows of the matmuls next to `node` reading its input (q/k/v, gate/up): each GEMM's
  // K split is planned for their total (PrefillGemm::n_plan), stacked in one launch or not.
  int64_t group_rows(size_t node) const {
    const auto reads_same_input = [&](size_t j) {
      return graph.nodes[j].op == Op::MatMul && graph.nodes[j].in[0] == graph.nodes[node].in[0];
    };
    size_t first = node, last = node;
    while (first > 0 && reads_same_input(first - 1)) --first;
    while (last + 1 < graph.nodes.size() && reads_same_input(last + 1)) ++last;
    int64_t rows = 0;
    for (size_t j = first; j <= last; ++j) rows += graph.nodes[j].weight->rows();
    return rows;
  }

  // The most split-K workspace a prompt GEMM takes: a whole group stacked in one launch at most.
  int64_t gemm_workspace_needed(int tokens) const {
    size_t most = 0;
    for (size_t i = 0; i < graph.nodes.size(); ++i) {
      const Node& n = graph.nodes[i];
      if (n.op != Op::MatMul || !prefill_gemm_supports(n.weight->type)) continue;
      PrefillGemm g;
      g.w_type = n.weight->type;
      g.n = group_rows(i);
      g.k = n.weight->shape[0];
      g.m = tokens;
      g.m_plan = fusions.batch_invariant ? kGemmPlanTokens : 0;
      g.sm_count = ctx.sm_count;
      most = std::max(most, prefill_gemm_workspace_bytes(g));
    }
    return int64_t(most) + 3 * 256;  // the runs of one group start 256-byte aligned (prompt_stacked)
  }
  // The largest weight image of a prompt GEMM (a whole group at most; + 384 rows: up to three runs
  // of a group each round up to whole 128-row tiles), where steps of `tokens` reach the image's
  // token count on a device with the warp-specialized GEMM.
  int64_t weight_image_needed(int tokens) const {
    if (tokens < kPrefillGemmWeightImageMinTokens || !prefill_gemm_device_has_wgmma() ||
        env_flag("MINFER_NO_GEMM_WEIGHT_IMAGE"))
      return 0;
    size_t most = 0;
    for (size_t i = 0; i < graph.nodes.size(); ++i) {
      const Node& n = graph.nodes[i];
      if (n.op != Op::MatMul || !prefill_gemm_supports(n.weight->type)) continue;
      PrefillGemm g;
      g.n = group_rows(i) + 384;
      g.k = n.weight->shape[0];
      most = std::max(most, prefill_gemm_weight_image_bytes(g));
    }
    return int64_t(most);
  }
  int splits_for_decode() const { return decode_attention_splits(ctx.sm_count, hp.n_head_kv); }
  // Rows of the buffers of output rows and generated tokens (at most `outputs` a step: the logits,
  // the gathered output rows, the decode attention's partials), a captured decode step's padded
  // to its bucket; rows of slot s.
  static int output_capacity(int tokens, int outputs) { return std::min(bucket_rows(outputs), tokens); }
  static int64_t slot_rows(int s, int tokens, int outputs) {
    return s == kLogits || s == kOutputRowsSlot ? output_capacity(tokens, outputs) : tokens;
  }
  // The widest matmul input, the width of the q8 and bf16 activation planes (the logits are no
  // matmul's input).
  int64_t input_width() const {
    int64_t most = 0;
    for (int s = 0; s < kNumPlanSlots; ++s)
      if (s != kLogits) most = std::max(most, width(s));
    return most;
  }
  // MatVecExtra::swiglu_counts: one a 256-column group of the FFN's width.
  int64_t swiglu_groups() const { return hp.n_ff / 256; }
  // The q8 plane of the swiglu in gate/up's epilogue: that kernel's tokens (<= 8).
  static constexpr int kSwigluPlaneTokens = 8;
  int64_t workspace_bytes(int tokens, int outputs) const {
    int64_t floats = 0;
    for (int s = 0; s < kNumPlanSlots; ++s) floats += slot_rows(s, tokens, outputs) * width(s);
    floats += attention_workspace_floats(output_capacity(tokens, outputs), hp.n_head, hp.head_dim, splits_for_decode());
    const int64_t planes = input_width();
    return floats * 4 + q8_plane_bytes(tokens, int(planes)) + 2 * (int64_t(tokens) * planes * 2) +
           gemm_workspace_needed(tokens) + weight_image_needed(tokens) + int64_t(tokens) * 64 + swiglu_groups() * 4 +
           q8_plane_bytes(kSwigluPlaneTokens, int(hp.n_ff)) +
           (decode_wgmma ? wgmma_operand_bytes(int(planes)) : 0);
  }

  void reserve(int n_blocks_, int block_size_, int max_tokens_, int max_outputs_) {
    if (n_blocks_ <= 0 || block_size_ <= 0 || max_tokens_ <= 0 || max_outputs_ <= 0 || max_outputs_ > max_tokens_)
      fail("cuda backend: invalid sizes n_blocks=", n_blocks_, " block_size=", block_size_, " max_tokens=", max_tokens_,
           " max_outputs=", max_outputs_);
    if (block_size_ & (block_size_ - 1)) fail("cuda backend: the KV block size ", block_size_, " is not a power of two");
    if (max_tokens) fail("cuda backend: reserve called twice");
    ctx.make_current();
    n_blocks = n_blocks_;
    block_size = block_size_;
    max_tokens = max_tokens_;
    max_outputs = max_outputs_;
    // One block past the pool: the padding rows of captured decode graphs write their K/V there.
    const size_t cache_elems = size_t(n_blocks + 1) * size_t(block_size) * size_t(kv_width());
    for (int l = 0; l < hp.n_layer; ++l) {
      k_cache.emplace_back(cache_elems, "cudaMalloc (KV cache)");
      v_cache.emplace_back(cache_elems, "cudaMalloc (KV cache)");
      stats.kv_bytes += int64_t(2 * cache_elems * 2);
    }
    for (int s = 0; s < kNumPlanSlots; ++s)
      slots[size_t(s)] = DeviceArray<float>(size_t(slot_rows(s, max_tokens, max_outputs)) * size_t(width(s)));
    const int64_t planes = input_width();
    q8 = DeviceArray<uint8_t>(size_t(q8_plane_bytes(max_tokens, int(planes))));
    for (DeviceArray<uint16_t>& plane : bf16) plane = DeviceArray<uint16_t>(size_t(max_tokens) * size_t(planes));
    decode_splits = splits_for_decode();
    attn_part = DeviceArray<float>(size_t(
        attention_workspace_floats(output_capacity(max_tokens, max_outputs), hp.n_head, hp.head_dim, decode_splits)));
    gemm_workspace = DeviceArray<float>(size_t(gemm_workspace_needed(max_tokens) / 4));
    swiglu_counts = DeviceArray<int32_t>(size_t(swiglu_groups()));
    check(cudaMemset(swiglu_counts.get(), 0, swiglu_counts.bytes()), "cudaMemset (swiglu counts)");
    swiglu_q8 = DeviceArray<uint8_t>(size_t(q8_plane_bytes(kSwigluPlaneTokens, int(hp.n_ff))));
    if (const int64_t image = weight_image_needed(max_tokens))
      gemm_weight_image = DeviceArray<uint8_t>(size_t(image), "cudaMalloc (prompt GEMM weight image)");
    if (decode_wgmma) {
      wgmma_operand = DeviceArray<uint8_t>(size_t(wgmma_operand_bytes(int(planes))));
      // A producer writes only its rows: the others stay finite (they reach no stored output)
      check(cudaMemset(wgmma_operand.get(), 0, wgmma_operand.size()), "cudaMemset (operand image)");
    }
    for (int q = 0; q < 2; ++q) {
      d_step[size_t(q)] = DeviceArray<int32_t>(7 * size_t(max_tokens));
      // A captured step's padding rows embed whatever section 0 holds: a token id from the start
      check(cudaMemset(d_step[size_t(q)].get(), 0, d_step[size_t(q)].bytes()), "cudaMemset (step rows)");
      h_argmax[size_t(q)] = PinnedArray<int32_t>(size_t(max_tokens));
    }
    argmax_candidates = DeviceArray<ArgmaxCandidate>(size_t(max_tokens) * kArgmaxSlices);
    d_chunks = DeviceArray<int32_t>(4 * size_t(max_tokens) + 2 * 2 * size_t(max_tokens));
    stats.workspace_bytes = workspace_bytes(max_tokens, max_outputs);
  }

  void copy_blocks(std::span<const BlockCopy> copies) {
    ctx.make_current();
    const size_t block_bytes = size_t(block_size) * size_t(kv_width()) * 2;
    for (const BlockCopy& c : copies) {
      if (c.src < 0 || c.dst < 0 || c.src >= n_blocks || c.dst >= n_blocks)
        fail("cuda backend: block copy ", c.src, " -> ", c.dst, " outside the pool of ", n_blocks);
      for (int l = 0; l < hp.n_layer; ++l)
        for (auto* cache : {&k_cache, &v_cache}) {
          uint8_t* base = reinterpret_cast<uint8_t*>((*cache)[size_t(l)].get());
          check(cudaMemcpyAsync(base + size_t(c.dst) * block_bytes, base + size_t(c.src) * block_bytes, block_bytes,
                                cudaMemcpyDeviceToDevice, stream.get()),
                "cudaMemcpyAsync (KV block copy)");
        }
    }
  }

  // ---- one step ---------------------------------------------------------------------------------
  struct Geometry {
    int n = 0, decode = 0, out_rows = 0, n_tiles = 0;
    int attention_head_chunks = 1;  // AttnParams::head_chunks of the decode attention
  };

  // Blocks a KV head's q heads spread over in a step's decode attention: the most (doubling, up to
  // the group) that keep the split launch within a wave of two blocks an SM. Fewer heads a block
  // shorten each block where blocks are few; where they are not, each block re-reads the K/V its
  // siblings read (docs/10 §5). No bit depends on it.
  int attention_head_chunks(int decode_rows, int max_len) const {
    if (decode_rows == 0) return 1;
    const int group = hp.n_head / hp.n_head_kv, slots = 2 * ctx.sm_count;
    const int64_t blocks = int64_t(decode_rows) * hp.n_head_kv * attention_slices(max_len, decode_splits, hp.head_dim);
    int chunks = 1;
    while (2 * chunks <= group && 2 * chunks * blocks <= slots) chunks *= 2;
    return chunks;
  }

  // Fills io from the batch (plus `padding` decode rows for a captured graph's bucket).
  void build_io(const StepBatch& b, int padding) {
    io.clear();
    for (const SeqChunk& c : b.chunks) {
      const int32_t table_offset = int32_t(io.tables.size());
      io.tables.insert(io.tables.end(), c.blocks.begin(), c.blocks.end());
      if (!c.decode) io.chunks.push_back({c.row, c.n_tokens, c.pos, table_offset});
      for (int t = 0; t < c.n_tokens; ++t) {
        const int p = c.pos + t;
        io.tokens.push_back(b.tokens[size_t(c.row + t)]);
        io.positions.push_back(p);
        io.slots.push_back(c.blocks[size_t(p / block_size)] * block_size + p % block_size);
        io.table_offsets.push_back(table_offset);
      }
    }
    io.output_rows.assign(b.output_rows.begin(), b.output_rows.end());
    if (padding > 0) {  // rows that attend to one position of the scratch block and write only there
      const int32_t scratch_table = int32_t(io.tables.size());
      io.tables.push_back(n_blocks);
      for (int i = 0; i < padding; ++i) {
        io.output_rows.push_back(int32_t(io.tokens.size()));
        io.tokens.push_back(0);
        io.positions.push_back(0);
        io.slots.push_back(n_blocks * block_size);
        io.table_offsets.push_back(scratch_table);
      }
    }
    io.tiles = prefill_attention_tiles(io.chunks);
    const int kv_group = hp.n_head / hp.n_head_kv;
    io.head_group_items = prefill_attention_head_group_items(io.chunks, io.tiles, hp.n_head_kv, kv_group, ctx.sm_count);
    io.head_groups = prefill_attention_head_groups(io.chunks, io.tiles, kv_group, io.head_group_items);
  }

  // Both step buffers at least `ints` long, their contents kept (a step in flight may have written
  // the next one's tokens).
  void reserve_step_buffers(size_t ints) {
    if (d_step[0].size() >= ints) return;
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (step buffers)");
    const size_t n = std::max(ints, 2 * d_step[0].size());
    for (DeviceArray<int32_t>& buffer : d_step) {
      DeviceArray<int32_t> grown(n);
      check(cudaMemcpy(grown.get(), buffer.get(), buffer.size() * 4, cudaMemcpyDeviceToDevice), "cudaMemcpy (step rows)");
      buffer = std::move(grown);
    }
    graphs.clear();  // they hold the old addresses
  }

  // The step's rows and block tables in one copy (d_step; the argmax section goes up unwritten and
  // the argmax overwrites it), the prompt chunks' descriptions in their own. A fed step's tokens
  // are the previous step's argmax, which that step writes into section 0: the rest goes up on
  // upload_stream, beside the previous step, and the main stream waits for it.
  void upload_io(bool fed) {
    const size_t table_ints = io.tables.size(), step_ints = 6 * rows_pitch() + table_ints;
    const size_t chunk_ints = io.chunks.size() * 4, tile_ints = io.tiles.size() * 2;
    reserve_step_buffers(step_ints);
    const size_t group_ints = io.head_groups.size() * sizeof(PrefillHeadGroup) / 4;
    const size_t staging = step_ints + chunk_ints + tile_ints + group_ints;
    PinnedArray<int32_t>& h_stage = h_staging[size_t(parity())];
    if (h_stage.size() < staging) h_stage = PinnedArray<int32_t>(std::max(staging, 2 * h_stage.size()));
    int32_t* h = h_stage.get();
    const std::vector<int32_t>* sections[5] = {&io.tokens, &io.positions, &io.slots, &io.table_offsets, &io.output_rows};
    for (int i = 0; i < 5; ++i) std::copy(sections[i]->begin(), sections[i]->end(), h + size_t(i) * rows_pitch());
    std::copy(io.tables.begin(), io.tables.end(), h + 6 * rows_pitch());
    if (fed) {
      const StepEvents& ev = events_of(step);
      // The previous step's argmax wrote the first tokens; a captured bucket's rows past them take
      // the host's padding tokens, as in any step.
      const size_t skip = std::min(size_t(last_argmax_rows), rows_pitch());
      check(cudaMemcpyAsync(rows_section(0) + skip, h + skip, (step_ints - skip) * 4, cudaMemcpyHostToDevice,
                            upload_stream.get()),
            "cudaMemcpyAsync (step rows and block tables)");
      check(cudaEventRecord(ev.uploaded.get(), upload_stream.get()), "cudaEventRecord");
      check(cudaStreamWaitEvent(stream.get(), ev.uploaded.get()), "cudaStreamWaitEvent");
    } else {
      check(cudaMemcpyAsync(rows_section(0), h, step_ints * 4, cudaMemcpyHostToDevice, stream.get()),
            "cudaMemcpyAsync (step rows and block tables)");
    }
    int32_t* tail = h + step_ints;
    if (chunk_ints > 0) {
      std::memcpy(tail, io.chunks.data(), chunk_ints * 4);
      std::memcpy(tail + chunk_ints, io.tiles.data(), tile_ints * 4);
      check(cudaMemcpyAsync(d_chunks.get(), tail, chunk_ints * 4, cudaMemcpyHostToDevice, stream.get()),
            "cudaMemcpyAsync (prompt chunks)");
      check(cudaMemcpyAsync(d_prefill_tiles(), tail + chunk_ints, tile_ints * 4, cudaMemcpyHostToDevice, stream.get()),
            "cudaMemcpyAsync (prompt tiles)");
    }
    if (!io.head_groups.empty()) {
      if (d_head_groups.size() < io.head_groups.size())
        d_head_groups = DeviceArray<PrefillHeadGroup>(std::max(io.head_groups.size(), 2 * d_head_groups.size()));
      const size_t group_bytes = io.head_groups.size() * sizeof(PrefillHeadGroup);
      std::memcpy(tail + chunk_ints + tile_ints, io.head_groups.data(), group_bytes);
      check(cudaMemcpyAsync(d_head_groups.get(), tail + chunk_ints + tile_ints, group_bytes, cudaMemcpyHostToDevice,
                            stream.get()),
            "cudaMemcpyAsync (prompt attention head groups)");
    }
  }

  // The step's draws, from the output rows' logits on the device.
  void draw(std::span<const Draw> draws) {
    if (h_draws.size() < draws.size()) {
      const size_t n = std::max(draws.size(), size_t(max_tokens));
      h_draws = PinnedArray<DrawJob>(n);
      d_draws = DeviceArray<DrawJob>(n);
      h_drawn = PinnedArray<int32_t>(n);
      d_drawn = DeviceArray<int32_t>(n);
    }
    for (size_t i = 0; i < draws.size(); ++i) h_draws.get()[i] = {draws[i].output, draws[i].temperature, draws[i].uniform};
    check(cudaMemcpyAsync(d_draws.get(), h_draws.get(), draws.size() * sizeof(DrawJob), cudaMemcpyHostToDevice,
                          stream.get()),
          "cudaMemcpyAsync (draws)");
    launch_draw_softmax(slot(kLogits), hp.n_vocab, hp.n_vocab, d_draws.get(), int(draws.size()), d_drawn.get(),
                        {stream.get(), false});
  }

  void submit(const StepBatch& b) {
    validate_step(b, max_tokens, max_outputs, n_blocks, block_size, hp.n_vocab);
    validate_submit(b, last_submitted, int(in_flight.size()));
    ctx.make_current();
    // The timeline's records are the device's, one buffer: a step after it would add its own
    if (!in_flight.empty() && in_flight.back().timeline_kernels) finish_timeline(in_flight.back());
    const StepEvents& ev = events_of(step);
    const bool fed = b.tokens_from_previous;
    const int n = int(b.tokens.size());
    int decode_rows = 0;
    for (const SeqChunk& c : b.chunks) decode_rows += c.decode ? 1 : 0;
    const int n_out = int(b.output_rows.size());
    bool all_rows_out = decode_rows == n && n_out == n;
    for (int i = 0; all_rows_out && i < n_out; ++i) all_rows_out = b.output_rows[size_t(i)] == i;

    const bool dump = dump_enabled();
    timing = census_next;
    census_next = false;
    const bool record_timeline = timeline_next;
    timeline_next = false;
    const Fusions f = dump ? Fusions::none() : fusions;
    const bool use_graph = f.cuda_graph && !dump && !timing && all_rows_out;
    const int rows = use_graph ? std::min(bucket_rows(n), max_tokens) : n;
    build_io(b, rows - n);
    check(cudaEventRecord(ev.begin.get(), stream.get()), "cudaEventRecord");
    upload_io(fed);
    const bool split = split_steps;
    if (split) check(cudaEventRecord(ev.launches_begin.get(), stream.get()), "cudaEventRecord");

    int max_len = 0;
    for (const SeqChunk& c : b.chunks)
      if (c.decode) max_len = std::max(max_len, c.pos + 1);
    Geometry geo{rows, use_graph ? rows : decode_rows, use_graph ? rows : n_out, int(io.tiles.size())};
    geo.attention_head_chunks = attention_head_chunks(geo.decode, max_len);
    const StepShape shape{geo.decode > 0, geo.decode < geo.n, all_rows_out};
    const std::vector<TimelineLaunch>* step_kernels = &eager_kernels;  // the kernels this step launches
    if (use_graph) {
      const std::tuple<int, int, int> key{rows, geo.attention_head_chunks, parity()};
      auto it = graphs.find(key);
      if (it == graphs.end()) {
        // Captured on an idle stream, so that nothing before the capture can be mistaken for part of it
        check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize (before capture)");
        std::vector<Launch> plan = lower(graph, f, shape);
        std::vector<TimelineLaunch> kernels;
        cudaGraph_t g = nullptr;
        check(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
        try {
          const std::vector<LaunchOperands> ops = launch_operands(plan, geo, f);
          timeline_arm(&kernels);
          for (size_t i = 0; i < plan.size(); ++i) {
            timeline_label(launch_name(plan[i], geo));
            execute(plan[i], geo, f, ops[i], serial());
          }
          timeline_arm(nullptr);
        } catch (...) {
          timeline_arm(nullptr);
          cudaStreamEndCapture(stream.get(), &g);
          if (g) cudaGraphDestroy(g);
          throw;
        }
        check(cudaStreamEndCapture(stream.get(), &g), "cudaStreamEndCapture");
        GraphExec exec(g);
        cudaGraphDestroy(g);
        it = graphs.emplace(key, Captured{std::move(exec), std::move(plan), std::move(kernels)}).first;
      }
      launches = &it->second.launches;
      step_kernels = &it->second.kernels;
      if (record_timeline) timeline_reset(stream.get());
      check(cudaGraphLaunch(it->second.exec.get(), stream.get()), "cudaGraphLaunch");
    } else {
      eager_launches = lower(graph, f, shape);
      launches = &eager_launches;
      std::array<int64_t, 2> kv_positions{};  // the positions the step's decode / prompt rows attend to
      if (timing) {
        marks.clear();
        for (const SeqChunk& c : b.chunks) kv_positions[c.decode ? 0 : 1] += c.pos + c.n_tokens;
      }
      const std::vector<LaunchOperands> ops = launch_operands(eager_launches, geo, f);
      eager_kernels.clear();
      if (record_timeline) {
        timeline_reset(stream.get());
        timeline_arm(&eager_kernels);
      }
      if (f.decode_beside_prompt && shape.decode && shape.prompt && !timing && !dump && lanes_apart(eager_launches)) {
        execute_beside(eager_launches, geo, f, ops);
      } else {
        for (size_t i = 0; i < eager_launches.size(); ++i) {
          const Launch& l = eager_launches[i];
          if (timing) {
            marks.push_back({launch_name(l, geo), census_bytes(l, kv_positions), Event(), Event()});
            check(cudaEventRecord(marks.back().begin.get(), stream.get()), "cudaEventRecord");
          }
          if (record_timeline) timeline_label(launch_name(l, geo));
          execute(l, geo, f, ops[i], serial());
          if (timing) check(cudaEventRecord(marks.back().end.get(), stream.get()), "cudaEventRecord");
          if (dump && l.completes_node >= 0) dump_output(l.completes_node, geo);
        }
      }
      timeline_arm(nullptr);
    }

    if (!b.draws.empty()) draw(b.draws);
    check(cudaEventRecord(ev.launches_end.get(), stream.get()), "cudaEventRecord");
    const cudaStream_t back = copy_back_stream.get();
    check(cudaStreamWaitEvent(back, ev.launches_end.get()), "cudaStreamWaitEvent");
    // Into page-locked memory: a copy to pageable memory returns only once the step has finished,
    // so the host would wait there and then enqueue the rest.
    check(cudaMemcpyAsync(h_argmax[size_t(parity())].get(), d_argmax(), size_t(n_out) * 4, cudaMemcpyDeviceToHost, back),
          "cudaMemcpyAsync (argmax)");
    const size_t vocab = size_t(hp.n_vocab);
    size_t wanted = 0;
    for (uint8_t c : b.copy_logits) wanted += c;
    // Into page-locked memory: a copy to pageable memory runs through the driver's staging buffer
    // at a fraction of the link's rate (64 rows of a 152k vocabulary are 39 MB a step).
    // Grown to a power of two of rows: allocating page-locked memory takes milliseconds.
    if (h_logits.size() < wanted * vocab) h_logits = PinnedArray<float>(std::bit_ceil(wanted) * vocab);
    float* host = h_logits.get();
    const float* logits = slot(kLogits);
    if (wanted == size_t(n_out)) {
      if (wanted > 0)
        check(cudaMemcpyAsync(host, logits, wanted * vocab * 4, cudaMemcpyDeviceToHost, back),
              "cudaMemcpyAsync (logits)");
    } else {
      size_t k = 0;
      for (int r = 0; r < n_out; ++r)
        if (b.copy_logits[size_t(r)])
          check(cudaMemcpyAsync(host + k++ * vocab, logits + size_t(r) * vocab, vocab * 4, cudaMemcpyDeviceToHost,
                                back),
                "cudaMemcpyAsync (logits)");
    }
    if (!b.draws.empty())
      check(cudaMemcpyAsync(h_drawn.get(), d_drawn.get(), b.draws.size() * 4, cudaMemcpyDeviceToHost, back),
            "cudaMemcpyAsync (drawn tokens)");
    check(cudaEventRecord(ev.end.get(), back), "cudaEventRecord");
    last_argmax_rows = geo.out_rows;
    in_flight.push_back({step, n_out, int(b.draws.size()), std::span<const float>(host, wanted * vocab), split,
                         record_timeline ? step_kernels : nullptr});
    last_submitted = submitted(b);
    ++step;
  }

  void finish_timeline(InFlight& f) {
    check(cudaEventSynchronize(events_of(f.step).launches_end.get()), "timeline");
    last_timeline = summarize_timeline(*f.timeline_kernels, timeline_collect());
    f.timeline_kernels = nullptr;
  }

  void collect(StepOutput& result) {
    if (in_flight.empty()) fail("cuda backend: collect with no step submitted");
    InFlight f = in_flight.front();
    in_flight.pop_front();
    const StepEvents& ev = events_of(f.step);
    check(cudaEventSynchronize(ev.end.get()), "forward");
    if (f.timeline_kernels) finish_timeline(f);
    float device_ms = 0, idle_ms = 0;
    check(cudaEventElapsedTime(&device_ms, ev.begin.get(), ev.end.get()), "cudaEventElapsedTime");
    // A fed step begins before the step before it has copied its results back: no idle time
    if (previous_collected >= 0)
      check(cudaEventElapsedTime(&idle_ms, events_of(previous_collected).end.get(), ev.begin.get()),
            "cudaEventElapsedTime");
    const int32_t* argmax = h_argmax[size_t(parity_of(f.step))].get();
    result.argmax.assign(argmax, argmax + f.n_out);
    result.drawn.assign(h_drawn.get(), h_drawn.get() + f.n_drawn);
    result.logits = f.logits;
    step_times.steps += 1;
    step_times.device_seconds += 1e-3 * device_ms;
    step_times.idle_seconds += 1e-3 * std::max(idle_ms, 0.0f);
    if (f.split) {
      float upload_ms = 0, launch_ms = 0, copy_back_ms = 0;
      check(cudaEventElapsedTime(&upload_ms, ev.begin.get(), ev.launches_begin.get()), "cudaEventElapsedTime");
      check(cudaEventElapsedTime(&launch_ms, ev.launches_begin.get(), ev.launches_end.get()), "cudaEventElapsedTime");
      check(cudaEventElapsedTime(&copy_back_ms, ev.launches_end.get(), ev.end.get()), "cudaEventElapsedTime");
      step_times.split_steps += 1;
      step_times.upload_seconds += 1e-3 * upload_ms;
      step_times.launch_seconds += 1e-3 * launch_ms;
      step_times.copy_back_seconds += 1e-3 * copy_back_ms;
    }
    previous_collected = f.step;
  }

  // What a launch must move at least: a matmul's weights; the attention's K and V (f16) of the
  // positions its rows attend to ([decode rows, prompt rows] of the step).
  int64_t census_bytes(const Launch& l, const std::array<int64_t, 2>& kv_positions) const {
    if (l.kind == LaunchKind::DecodeAttention || l.kind == LaunchKind::PromptAttention)
      return kv_positions[l.kind == LaunchKind::DecodeAttention ? 0 : 1] * kv_width() * 2 * int64_t(sizeof(uint16_t));
    return launch_weight_bytes(l, graph);
  }
  std::string launch_name(const Launch& l, const Geometry& geo) const {
    if (l.kind == LaunchKind::DecodeMatmul && use_mma(l, rows_of(l, geo).second)) return l.name + "_mma";
    return l.name;
  }

  void dump_output(int node_index, const Geometry& geo) {
    const Node& node = graph.nodes[size_t(node_index)];
    const bool head = node.op == Op::Output;
    const int64_t rows = head ? geo.out_rows : geo.n, w = width(node.out);
    std::vector<float> host(size_t(rows * w));
    check(cudaMemcpyAsync(host.data(), slot(node.out), host.size() * 4, cudaMemcpyDeviceToHost, stream.get()),
          "cudaMemcpy (dump)");
    check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
    dump_node(step, node_index, node.name, rows, w, host.data());
  }

  // First row and row count of a launch's rows.
  std::pair<int, int> rows_of(const Launch& l, const Geometry& geo) const {
    switch (l.rows) {
      case Rows::All: return {0, geo.n};
      case Rows::Decode: return {0, geo.decode};
      case Rows::Prompt: return {geo.decode, geo.n - geo.decode};
      case Rows::Output: return {0, geo.out_rows};
    }
    return {0, 0};
  }

  // The q8 plane of rows `width` wide (every producer and consumer of a width carves it alike).
  Q8Plane plane(int64_t width) const { return q8_plane(q8.get(), max_tokens, int(width)); }
  Q8Plane swiglu_plane() const { return q8_plane(swiglu_q8.get(), kSwigluPlaneTokens, int(hp.n_ff)); }

  bool use_mma(const Launch& l, int rows) const {
    if (rows < mma_min_rows()) return false;
    for (int s = 0; s < l.n_segs; ++s)
      if (!matmul_mma_supports(graph.nodes[size_t(l.seg_node[size_t(s)])].weight->type)) return false;
    return true;
  }

  // A decode matmul's operands around a launch: the format of the wgmma matmul's operand image
  // that its q8 plane's producer writes beside the plane, and the one a decode matmul finds
  // already written; a gate/up launch with the swiglu in its epilogue, and its consumer reading
  // the q8 plane it wrote (apart from the one it reads: swiglu_plane).
  struct LaunchOperands {
    OperandFormat writes = OperandFormat::None, reads = OperandFormat::None;
    bool swiglu_epilogue = false, reads_swiglu_plane = false;
  };
  // The swiglu goes into gate/up's epilogue where its kernel takes it, the step has at most
  // swiglu_epilogue_rows decode rows, and the q8 plane it writes, if any, is read by the launch
  // right after it. A producer writes the image (Fusions::operand_image) when the launch right
  // after it is the decode matmul over its plane's rows and would build that image itself.
  std::vector<LaunchOperands> launch_operands(const std::vector<Launch>& plan, const Geometry& geo,
                                              const Fusions& f) const {
    std::vector<LaunchOperands> ops(plan.size());
    for (size_t i = 0; i < plan.size(); ++i) {
      const Launch& l = plan[i];
      if (l.kind != LaunchKind::DecodeMatmul || !l.swiglu) continue;
      const bool read_next = i + 1 < plan.size() && plan[i + 1].kind == LaunchKind::DecodeMatmul &&
                             plan[i + 1].in == l.out;
      const int rows = rows_of(l, geo).second;
      const DecodeMatmulArgs a = decode_matmul_args(l);
      ops[i].swiglu_epilogue = rows <= swiglu_epilogue_rows && (!l.writes_q8 || read_next) && use_mma(l, rows) &&
                               matmul_mma_swiglu_takes({a.segs[0], a.segs[1]}, rows, a.extra);
      if (ops[i].swiglu_epilogue && l.writes_q8) ops[i + 1].reads_swiglu_plane = true;
    }
    if (!f.operand_image || !decode_wgmma) return ops;
    for (size_t i = 0; i + 1 < plan.size(); ++i) {
      const Launch &producer = plan[i], &consumer = plan[i + 1];
      const bool writer = producer.kind == LaunchKind::RmsNorm || producer.kind == LaunchKind::SwiGLU ||
                          (producer.kind == LaunchKind::DecodeMatmul && producer.swiglu && !ops[i].swiglu_epilogue);
      if (!producer.writes_q8 || !writer) continue;
      const int rows = rows_of(consumer, geo).second;
      if (consumer.kind != LaunchKind::DecodeMatmul || consumer.in != producer.out || rows != geo.decode ||
          !use_mma(consumer, rows))
        continue;
      const DecodeMatmulArgs a = decode_matmul_args(consumer);
      const OperandFormat format = matmul_mma_operand_format(a.segs, consumer.n_segs, rows, a.extra);
      ops[i].writes = ops[i + 1].reads = format;
    }
    return ops;
  }
  // Where a launch runs: the stream, and (beside) the rows of its lane, which a launch over all
  // rows covers; beside, kernels wait for their predecessor in full (no PDL across a fork).
  struct Lane {
    cudaStream_t stream;
    bool beside = false;
    int row0 = 0, rows = 0;
  };
  Lane serial() const { return {stream.get()}; }

  // Decode rows and prompt rows share nothing up to the output rows when the prompt rows never
  // touch the decode rows' scratch: the q8 plane (a prompt matmul without a GEMM quantizes into
  // it) and the split-K partials (the prompt attention of head sizes other than 64 and 128). The
  // bf16 planes are the prompt rows' alone (execute).
  bool lanes_apart(const std::vector<Launch>& plan) const {
    if (hp.head_dim != 64 && hp.head_dim != 128) return false;
    for (const Launch& l : plan) {
      if (l.kind != LaunchKind::PromptMatmul) continue;
      for (int i = 0; i < l.n_segs; ++i) {
        const Node& n = graph.nodes[size_t(l.seg_node[size_t(i)])];
        if (!gemm_takes(weights.mat(n.weight), l.in, n.out)) return false;
      }
    }
    return true;
  }
  // The launches up to the output rows in two lanes: decode rows on the urgent decode stream,
  // prompt rows on the main stream (a launch over all rows once in each), issued in plan order so
  // both start at once; then the output rows after both. Tests put both lanes on the main stream
  // (interleave_lanes): tick t issues the decode lane's launch t, then the prompt lane's t - lead.
  void execute_beside(const std::vector<Launch>& plan, const Geometry& geo, const Fusions& f,
                      const std::vector<LaunchOperands>& ops) {
    int end = 0;
    while (end < int(plan.size()) && plan[size_t(end)].rows != Rows::Output) ++end;
    const bool forked = !lanes_lead;
    const Lane decode{forked ? decode_stream.get() : stream.get(), true, 0, geo.decode},
        prompt{stream.get(), true, geo.decode, geo.n - geo.decode};
    if (forked) {
      check(cudaEventRecord(lanes_fork.get(), stream.get()), "cudaEventRecord (lanes fork)");
      check(cudaStreamWaitEvent(decode_stream.get(), lanes_fork.get()), "cudaStreamWaitEvent (lanes fork)");
    }
    const int lead = lanes_lead.value_or(0);
    for (int t = std::min(0, lead); t < end + std::max(0, lead); ++t) {
      const int p = t - lead;
      if (t >= 0 && t < end && plan[size_t(t)].rows != Rows::Prompt)
        execute(plan[size_t(t)], geo, f, ops[size_t(t)], decode);
      if (p >= 0 && p < end && plan[size_t(p)].rows != Rows::Decode)
        execute(plan[size_t(p)], geo, f, ops[size_t(p)], prompt);
    }
    if (forked) {
      check(cudaEventRecord(lanes_join.get(), decode_stream.get()), "cudaEventRecord (lanes join)");
      check(cudaStreamWaitEvent(stream.get(), lanes_join.get()), "cudaStreamWaitEvent (lanes join)");
    }
    for (size_t i = size_t(end); i < plan.size(); ++i) execute(plan[i], geo, f, ops[i], serial());
  }

  OperandImage image_written(const LaunchOperands& ops) const { return {wgmma_operand.get(), ops.writes}; }

  void execute(const Launch& l, const Geometry& geo, const Fusions& f, const LaunchOperands& ops, const Lane& lane) {
    const Node& node = graph.nodes[size_t(std::max(l.node, 0))];
    auto [row0, count] = rows_of(l, geo);
    if (l.rows == Rows::All && lane.beside) row0 = lane.row0, count = lane.rows;
    if (count == 0) return;
    KernelStream s{lane.stream, !lane.beside && f.pdl && geo.n <= kPdlMaxRows, f.pdl};
    s.release_early = f.early_dependents && geo.n <= kEarlyReleaseMaxRows;
    const int64_t w_out = l.out >= 0 ? width(l.out) : 0, w_in = l.in >= 0 ? width(l.in) : 0;
    // The q8 plane's rows (decode rows) among the launch's, from its first row.
    const int q8_rows = l.writes_q8 ? std::clamp(geo.decode - row0, 0, count) : 0;
    const OperandImage image_out = q8_rows > 0 ? image_written(ops) : OperandImage{};
    // The bf16 planes hold prompt rows for the GEMMs, which read them from the first prompt row; a
    // launch over decode rows only (the decode lane's share of one over all rows) writes none. A
    // plane is one buffer laid out by each writer's width: the decode rows of a wider slot (the
    // swiglu's) would land on prompt rows of a narrower one that the other lane has yet to read.
    uint16_t* const bf16_out = l.writes_bf16 && row0 + count > geo.decode ? bf16[l.bf16_out].get() + row0 * w_out
                                                                          : nullptr;
    switch (l.kind) {
      case LaunchKind::Embed:
        launch_embed(weights.mat(node.weight), d_tokens() + row0, slot(l.out) + row0 * w_out, count, s);
        return;
      case LaunchKind::RmsNorm:
        launch_rms_norm(slot(l.in) + row0 * w_in, int(w_in), weights.vec(node.weight), slot(l.out) + row0 * w_out,
                        int(w_out), count, int(w_out), node.group, hp.rms_eps, plane(w_out), q8_rows, s,
                        bf16_out, image_out);
        return;
      case LaunchKind::Quantize:
        launch_quantize_q8(slot(l.in), int(w_in), plane(w_in), count, int(w_in), s);
        return;
      case LaunchKind::ConvertBf16:
        launch_prefill_activation_bf16(slot(l.in) + row0 * w_in, bf16[l.bf16_out].get() + row0 * w_in,
                                       int64_t(count) * w_in, s.stream);
        return;
      case LaunchKind::DecodeMatmul:
        if (l.swiglu) return decode_swiglu_matmul(l, count, ops, q8_rows, image_out, s);
        decode_matmul(l, count, ops.reads, ops.reads_swiglu_plane ? swiglu_plane() : plane(w_in), s);
        return;
      case LaunchKind::PromptMatmul:
        prompt_matmul(l, row0, count, f, s);
        return;
      case LaunchKind::Rope:
        launch_rope(slot(l.out) + row0 * w_out, int(w_out), count, node.n_heads, rope(), d_positions() + row0, s);
        return;
      case LaunchKind::RopeKv: {
        const int64_t w_kv = width(l.in);
        launch_rope_kv(slot(l.out) + row0 * w_out, int(w_out), slot(l.in) + row0 * w_kv, slot(l.in2) + row0 * w_kv,
                       int(w_kv), count, hp.n_head, rope(), kv_layer(node.layer), d_positions() + row0,
                       d_slots() + row0, s);
        return;
      }
      case LaunchKind::KvAppend:
        launch_kv_append(slot(l.in) + row0 * w_in, slot(l.in2) + row0 * w_in, count, kv_layer(node.layer),
                         d_slots() + row0, s);
        return;
      case LaunchKind::DecodeAttention:
        decode_attention(l, node, geo, row0, count, s);
        return;
      case LaunchKind::PromptAttention:
        if (hp.head_dim == 64 || hp.head_dim == 128) {
          PrefillAttention pa;
          pa.q = slot(l.in);
          pa.ldq = w_in;
          pa.k_cache = kv_layer(node.layer).k;
          pa.v_cache = kv_layer(node.layer).v;
          pa.ld_kv = kv_width();
          pa.out = slot(l.out);
          pa.out_bf16 = l.writes_bf16 ? bf16[l.bf16_out].get() : nullptr;
          pa.ldo = w_out;
          pa.chunks = d_prefill_chunks();
          pa.tiles = d_prefill_tiles();
          pa.n_tiles = geo.n_tiles;
          pa.head_groups = d_head_groups.get();
          pa.n_head_groups = int(io.head_groups.size());
          pa.head_group_items = io.head_group_items;
          pa.head_groups_of = hp.n_head / hp.n_head_kv;
          pa.tables = d_tables();
          pa.block_size = block_size;
          pa.n_head = node.n_heads;
          pa.n_kv_head = hp.n_head_kv;
          pa.head_dim = hp.head_dim;
          pa.scale = 1.0f / std::sqrt(float(hp.head_dim));
          launch_prefill_attention(pa, s.stream);
        } else {  // other head sizes: the split-K kernel, one query row at a time
          decode_attention(l, node, geo, row0, count, s);
          if (bf16_out)
            launch_prefill_activation_bf16(slot(l.out) + row0 * w_out, bf16_out, int64_t(count) * w_out, s.stream);
        }
        return;
      case LaunchKind::SwiGLU:
        launch_swiglu(slot(l.in) + row0 * w_in, slot(l.in2) + row0 * w_in, slot(l.out) + row0 * w_out, count,
                      int(w_out), plane(w_out), q8_rows, s, bf16_out, image_out);
        return;
      case LaunchKind::Add:
        launch_add(slot(l.in) + row0 * w_in, slot(l.in2) + row0 * w_in, slot(l.out) + row0 * w_out,
                   int64_t(count) * w_out, s);
        return;
      case LaunchKind::GatherOutputRows:
        launch_gather_rows(slot(l.in), int(w_in), d_output_rows(), count, int(w_in), slot(l.out), s);
        return;
      case LaunchKind::Argmax:
        launch_argmax_rows(slot(l.in), int(w_in), count, int(w_in), argmax_candidates.get(), d_argmax(), d_next_tokens(),
                           s);
        return;
    }
  }

  void decode_attention(const Launch& l, const Node& node, const Geometry& geo, int row0, int count,
                        const KernelStream& s) {
    const int64_t w = width(l.in);
    AttnParams p;
    p.q = slot(l.in) + row0 * w;
    p.out = slot(l.out) + row0 * width(l.out);
    p.kv = kv_layer(node.layer);
    p.n_head = node.n_heads;
    p.n_tokens = count;
    p.positions = d_positions() + row0;
    p.tables = d_tables();
    p.table_offsets = d_table_offsets() + row0;
    p.block_size = block_size;
    p.n_splits = decode_splits;
    p.head_chunks = geo.attention_head_chunks;
    p.tensor_cores = attention_tensor_cores;
    p.combine_spread = combine_spread;
    p.combine_staging = combine_staging;
    p.kv_evict_first = l2_evict_first;
    p.early_reads = early_attention_reads;
    p.part = attn_part.get();
    p.sm_count = ctx.sm_count;
    if (l.writes_q8) p.q8 = plane(width(l.out)), p.q8_rows = count;  // decode rows start at row 0
    launch_attention(p, s);
  }

  struct DecodeMatmulArgs {
    MatSeg segs[kMaxMatSegs];
    MatVecExtra extra;
  };
  DecodeMatmulArgs decode_matmul_args(const Launch& l) const {
    DecodeMatmulArgs a;
    for (int i = 0; i < l.n_segs; ++i) {
      const Node& n = graph.nodes[size_t(l.seg_node[size_t(i)])];
      const int out = l.n_segs == 1 ? l.out : n.out;
      MatSeg& seg = a.segs[i];
      seg.w = weights.mat(n.weight);
      seg.bias = weights.vec(n.bias);
      seg.residual = l.residual >= 0 ? slot(l.residual) : nullptr;
      seg.out = slot(out);
      seg.ld_out = int(width(out));
      seg.epi = Epilogue(int(l.epi[size_t(i)]));
    }
    MatVecExtra& extra = a.extra;
    extra.rope = rope();
    extra.positions = d_positions();
    extra.slots = d_slots();
    extra.kv = kv_layer(graph.nodes[size_t(l.node)].layer >= 0 ? graph.nodes[size_t(l.node)].layer : 0);
    extra.sm_count = ctx.sm_count;
    extra.decode_ctas = persistent_decode_matmul ? 0 : -1;
    extra.launch_per_type = !two_type_decode_matmul;
    extra.two_type_register_kernel = !two_type_weight_ring;
    extra.types_side_by_side = types_side_by_side;
    extra.one_group_in_flight = !two_groups_in_flight;
    extra.weights_in_registers = !weight_ring;
    extra.activations_from_global = !shared_activations;
    extra.every_token_column = !one_token_column;
    extra.ring_row_copies = !ring_tensor_copies;
    extra.weights_l2_unchanged = !l2_evict_first;
    int64_t weights_in_launch = 0;
    bool q6k = false;
    for (int i = 0; i < l.n_segs; ++i) {
      weights_in_launch += int64_t(a.segs[i].w.rows) * a.segs[i].w.cols;
      q6k = q6k || a.segs[i].w.type == GgmlType::Q6_K;
    }
    if (decode_wgmma && weights_in_launch >= wgmma_min_weights && (decode_wgmma_q6k || !q6k)) {
      extra.wgmma_operand = wgmma_operand.get();
      extra.wgmma_operand_bytes = int64_t(wgmma_operand.size());
    }
    return a;
  }

  void decode_matmul(const Launch& l, int count, OperandFormat image_ready, const Q8Plane& in, const KernelStream& s) {
    DecodeMatmulArgs a = decode_matmul_args(l);
    a.extra.wgmma_operand_ready = image_ready;
    if (use_mma(l, count))
      launch_matmul_mma(a.segs, l.n_segs, in, count, a.extra, s);
    else
      launch_matvec(a.segs, l.n_segs, in, slot(l.in), int(width(l.in)), count, a.extra, s);
  }

  // gate and up (the launch's segments) with the swiglu into l.out in the matmul's epilogue where
  // launch_operands put it there (its q8 rows into swiglu_plane), else the matmul, then the
  // swiglu kernel.
  void decode_swiglu_matmul(const Launch& l, int count, const LaunchOperands& ops, int q8_rows,
                            const OperandImage& image_out, const KernelStream& s) {
    const DecodeMatmulArgs a = decode_matmul_args(l);
    const int64_t w_out = width(l.out);
    if (ops.swiglu_epilogue) {
      MatVecExtra e = a.extra;
      e.swiglu_out = slot(l.out);
      e.swiglu_ld = int(w_out);
      e.swiglu_q8 = swiglu_plane();
      e.swiglu_q8_rows = q8_rows;
      e.swiglu_counts = swiglu_counts.get();
      return launch_matmul_mma_swiglu({a.segs[0], a.segs[1]}, plane(width(l.in)), count, e, s);
    }
    decode_matmul(l, count, ops.reads, plane(width(l.in)), s);
    launch_swiglu(a.segs[0].out, a.segs[1].out, slot(l.out), count, int(w_out), plane(w_out), q8_rows, s, nullptr,
                  image_out);
  }

  void prompt_matmul(const Launch& l, int row0, int count, const Fusions& f, const KernelStream& s) {
    if (l.swiglu) {
      prompt_swiglu(l, row0, count, f, s);
    } else if (l.n_segs > 1) {
      prompt_stacked(l, row0, count, f, s);
    } else {
      prompt_gemm(l.seg_node[0], l.in, l.out, l.residual, l.bf16_in, row0, count, f, s);
    }
  }

  // The arguments of the prompt GEMM of matrix node `node` over prompt rows [row0, row0 + count)
  // of slot `in` (its bf16 plane `plane_in`) into slot `out`.
  PrefillGemm gemm_args(int node, int in, int out, int plane_in, int row0, int count, const Fusions& f) {
    const Node& n = graph.nodes[size_t(node)];
    const DevMat& m = weights.mat(n.weight);
    const int64_t w_in = width(in), w_out = width(out);
    PrefillGemm g;
    g.w_type = m.type;
    g.w = m.data;
    g.n = m.rows;
    g.k = m.cols;
    g.x = bf16[plane_in].get() + row0 * w_in;
    g.ldx = w_in;
    g.m = count;
    g.y = slot(out) + row0 * w_out;
    g.ldy = w_out;
    g.bias = weights.vec(n.bias);
    g.m_plan = f.batch_invariant ? kGemmPlanTokens : 0;
    g.n_plan = group_rows(size_t(node));
    g.sm_count = ctx.sm_count;
    g.workspace = gemm_workspace.get();
    g.workspace_bytes = gemm_workspace.bytes();
    g.weight_image_buffer = gemm_weight_image.get();
    g.weight_image_buffer_bytes = gemm_weight_image.size();
    return g;
  }
  bool gemm_takes(const DevMat& m, int in, int out) const {
    return prefill_gemm_supports(m.type) && m.rows % 2 == 0 && width(out) % 2 == 0 && width(in) % 8 == 0 &&
           m.cols % (type_traits(m.type).block_size == 256 ? 256 : 64) == 0;
  }

  void prompt_gemm(int node, int in, int out, int residual_slot, int plane_in, int row0, int count, const Fusions& f,
                   const KernelStream& s) {
    const Node& n = graph.nodes[size_t(node)];
    const DevMat& m = weights.mat(n.weight);
    const int64_t w_in = width(in), w_out = width(out);
    const float* residual = residual_slot >= 0 ? slot(residual_slot) + row0 * w_out : nullptr;
    if (gemm_takes(m, in, out)) {
      PrefillGemm g = gemm_args(node, in, out, plane_in, row0, count, f);
      g.residual = residual;
      launch_prefill_gemm(g, s.stream);
      return;
    }
    // Weight types without a GEMM: the decode matmul over the prompt rows (their own plane rows).
    const float* x = slot(in) + row0 * w_in;
    const Q8Plane rows = plane(w_in).from_token(row0);
    if (type_traits(m.type).quantized) launch_quantize_q8(x, int(w_in), rows, count, int(w_in), s);
    MatSeg seg;
    seg.w = m;
    seg.bias = weights.vec(n.bias);
    seg.residual = residual;
    seg.out = slot(out) + row0 * w_out;
    seg.ld_out = int(w_out);
    MatVecExtra extra;
    extra.positions = d_positions() + row0;
    extra.slots = d_slots() + row0;
    launch_matvec(&seg, 1, rows, x, int(w_in), count, extra, s);
  }

  // q, k and v over the prompt rows: runs of matrices of one type and width stacked in one GEMM
  // (each matrix but a run's last a multiple of 128 rows); the others alone.
  // Runs after the first run on the side stream (concurrent_gemms), each with its own part of the
  // split-K workspace; matrices without a GEMM run on the main stream in their place.
  void prompt_stacked(const Launch& l, int row0, int count, const Fusions& f, const KernelStream& s) {
    std::vector<PrefillGemm> runs;
    for (int first = 0; first < l.n_segs;) {
      const Node& head = graph.nodes[size_t(l.seg_node[size_t(first)])];
      const DevMat& hm = weights.mat(head.weight);
      int next = first + 1;
      if (gemm_takes(hm, l.in, head.out)) {
        PrefillGemm g = gemm_args(l.seg_node[size_t(first)], l.in, head.out, l.bf16_in, row0, count, f);
        for (int64_t rows = hm.rows; next < l.n_segs && g.n_stacked < int(g.stacked.size()); ++next) {
          const Node& n = graph.nodes[size_t(l.seg_node[size_t(next)])];
          const DevMat& m = weights.mat(n.weight);
          if (rows % 128 != 0 || !gemm_takes(m, l.in, n.out) || m.type != hm.type || m.cols != hm.cols) break;
          g.stacked[size_t(g.n_stacked++)] = {m.data, m.rows, slot(n.out) + row0 * width(n.out), width(n.out),
                                               weights.vec(n.bias)};
          rows = m.rows;
        }
        runs.push_back(g);
      } else {
        prompt_gemm(l.seg_node[size_t(first)], l.in, head.out, -1, l.bf16_in, row0, count, f, s);
      }
      first = next;
    }
    if (runs.empty()) return;
    const bool beside = f.concurrent_gemms && runs.size() > 1;
    if (beside) {
      check(cudaEventRecord(fork_event.get(), s.stream), "cudaEventRecord (fork)");
      check(cudaStreamWaitEvent(side_stream.get(), fork_event.get()), "cudaStreamWaitEvent (fork)");
    }
    // Of the split-K workspace and the weight image: the group's total covers every run at once.
    size_t used = 0, image_used = 0;
    for (size_t i = 0; i < runs.size(); ++i) {
      PrefillGemm& g = runs[i];
      g.workspace = gemm_workspace.get() + used / sizeof(float);
      g.workspace_bytes = gemm_workspace.bytes() - used;
      if (g.weight_image_buffer) {
        g.weight_image_buffer += image_used;
        g.weight_image_buffer_bytes -= image_used;
      }
      if (beside) {
        used += (prefill_gemm_workspace_bytes(g) + 255) / 256 * 256;
        image_used += prefill_gemm_weight_image_bytes(g);
      }
      launch_prefill_gemm(g, beside && i > 0 ? side_stream.get() : s.stream);
    }
    if (beside) {
      check(cudaEventRecord(join_event.get(), side_stream.get()), "cudaEventRecord (join)");
      check(cudaStreamWaitEvent(s.stream, join_event.get()), "cudaStreamWaitEvent (join)");
    }
  }

  // Gate, up and silu(gate) * up over the prompt rows: one GEMM where both matrices have the GEMM's
  // type and shape and their own GEMMs would run in one pass (then the fused result has their
  // bits); otherwise the two GEMMs into their slots and the swiglu kernel.
  void prompt_swiglu(const Launch& l, int row0, int count, const Fusions& f, const KernelStream& s) {
    const Node &gate = graph.nodes[size_t(l.seg_node[0])], &up = graph.nodes[size_t(l.seg_node[1])];
    const DevMat &mg = weights.mat(gate.weight), &mu = weights.mat(up.weight);
    const int64_t w_out = width(l.out);
    uint16_t* out_bf16 = l.writes_bf16 ? bf16[l.bf16_out].get() + row0 * w_out : nullptr;
    PrefillGemm g = gemm_args(l.seg_node[0], l.in, l.out, l.bf16_in, row0, count, f);
    bool fused = gemm_takes(mg, l.in, l.out) && mu.type == mg.type && mu.rows == mg.rows && mu.cols == mg.cols &&
                 !g.bias && !weights.vec(up.bias);
    if (fused) fused = prefill_gemm_plan(g).k_splits == 1;
    if (fused) {
      g.w_up = mu.data;
      g.y_bf16 = out_bf16;
      launch_prefill_gemm(g, s.stream);
      return;
    }
    prompt_gemm(l.seg_node[0], l.in, gate.out, -1, l.bf16_in, row0, count, f, s);
    prompt_gemm(l.seg_node[1], l.in, up.out, -1, l.bf16_in, row0, count, f, s);
    launch_swiglu(slot(gate.out) + row0 * w_out, slot(up.out) + row0 * w_out, slot(l.out) + row0 * w_out, count,
                  int(w_out), Q8Plane{}, 0, s, out_bf16);
  }
};

CudaBackend::CudaBackend(const Model& model, Fusions fusions, int device)
    : impl_(std::make_unique<Impl>(model, fusions, device)) {}

CudaBackend::~CudaBackend() = default;

int64_t CudaBackend::kv_block_bytes(int block_size) const {
  return int64_t(impl_->hp.n_layer) * 2 * block_size * impl_->kv_width() * 2;
}
int64_t CudaBackend::workspace_bytes(int max_tokens, int max_outputs) const {
  return impl_->workspace_bytes(max_tokens, max_outputs);
}
int64_t CudaBackend::memory_available() const {
  impl_->ctx.make_current();
  size_t free_bytes = 0, total_bytes = 0;
  check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  return int64_t(free_bytes);
}
void CudaBackend::reserve(int n_blocks, int block_size, int max_tokens, int max_outputs) {
  impl_->reserve(n_blocks, block_size, max_tokens, max_outputs);
}
int CudaBackend::max_tokens() const { return impl_->max_tokens; }
int CudaBackend::max_outputs() const { return impl_->max_outputs; }
void CudaBackend::copy_blocks(std::span<const BlockCopy> copies) { impl_->copy_blocks(copies); }
void CudaBackend::submit(const StepBatch& batch) { impl_->submit(batch); }
void CudaBackend::collect(StepOutput& out) { impl_->collect(out); }
void CudaBackend::census_next_step() { impl_->census_next = true; }
void CudaBackend::interleave_lanes(std::optional<int> decode_lead) { impl_->lanes_lead = decode_lead; }
void CudaBackend::timeline_next_step() {
  if (!kTimelineBuilt) fail("the timeline needs a build configured with -DMINFER_TIMELINE=ON");
  impl_->timeline_next = true;
}
const TimelineSummary& CudaBackend::timeline_result() const { return impl_->last_timeline; }
const std::vector<Launch>& CudaBackend::last_launches() const { return *impl_->launches; }
const LoadStats& CudaBackend::load_stats() const { return impl_->stats; }
const StepTimes& CudaBackend::step_times() const { return impl_->step_times; }
void CudaBackend::reset_step_times() {
  impl_->step_times = {};
  impl_->previous_collected = -1;
}
void CudaBackend::split_step_times(bool on) { impl_->split_steps = on; }
const Fusions& CudaBackend::fusions() const { return impl_->fusions; }

std::vector<KernelTime> CudaBackend::census_result() const {
  std::vector<KernelTime> out;
  for (const auto& mark : impl_->marks) {
    float ms = 0;
    check(cudaEventElapsedTime(&ms, mark.begin.get(), mark.end.get()), "cudaEventElapsedTime");
    auto it = std::find_if(out.begin(), out.end(), [&](const KernelTime& k) { return k.name == mark.name; });
    if (it == out.end()) it = out.insert(out.end(), KernelTime{mark.name});
    it->launches += 1;
    it->microseconds += 1000.0 * ms;
    it->bytes += mark.bytes;
  }
  return out;
}

double measure_copy_bandwidth() {
  const size_t bytes = size_t(1) << 30;
  DeviceArray<uint8_t> a(bytes), b(bytes);
  check(cudaMemset(a.get(), 1, bytes), "cudaMemset");
  Event e0, e1;
  std::vector<float> times;
  for (int r = 0; r < 8; ++r) {
    check(cudaEventRecord(e0.get()), "cudaEventRecord");
    check(cudaMemcpy(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy");
    check(cudaEventRecord(e1.get()), "cudaEventRecord");
    check(cudaEventSynchronize(e1.get()), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, e0.get(), e1.get()), "cudaEventElapsedTime");
    if (r >= 2) times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  return 2.0 * double(bytes) / (double(times[times.size() / 2]) * 1e-3);
}

std::string device_name() {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return "none";
  return prop.name;
}

}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(const Model& model) { return std::make_unique<cuda::CudaBackend>(model); }

bool cuda_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

}  // namespace minfer
