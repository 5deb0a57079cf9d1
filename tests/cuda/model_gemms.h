// The weight matrices a model multiplies, as one table for the GPU tests (test_prefill: each prompt
// GEMM against the float64 reference at its real shape) and the kernel micro-benches (bench_prefill
// and bench_decode: each timed).
// Taken from the synthesizer's tensor plan, so the types are those of llama.cpp's Q4_K_M mix.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "convert/synth.h"
#include "quant/types.h"

namespace minfer::test {

// One entry per (matrix, type) of a forward, with the number of layers that run it.
struct PromptGemm {
  std::string matrix;  // attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down
  GgmlType type;
  int64_t n, k;        // output rows, row length
  int per_forward;
  int64_t group_rows = 0;  // the rows of its q/k/v or gate/up group (the engine's K-split plan)
};

inline std::vector<PromptGemm> prompt_gemms(const synth::Preset& preset) {
  std::vector<PromptGemm> out;
  for (const synth::PlannedTensor& t : synth::plan_tensors(preset, synth::FileType::Q4_K_M)) {
    if (t.name.rfind("blk.", 0) != 0 || t.shape.size() != 2) continue;
    const size_t dot = t.name.find('.', 4), end = t.name.rfind(".weight");
    const std::string matrix = t.name.substr(dot + 1, end - dot - 1);
    auto it = std::find_if(out.begin(), out.end(), [&](const PromptGemm& g) { return g.matrix == matrix && g.type == t.type; });
    if (it == out.end()) it = out.insert(out.end(), PromptGemm{matrix, t.type, t.shape[1], t.shape[0], 0});
    ++it->per_forward;
  }
  const auto rows_of = [&](const char* matrix) {
    const auto it = std::find_if(out.begin(), out.end(), [&](const PromptGemm& g) { return g.matrix == matrix; });
    return it == out.end() ? int64_t(0) : it->n;
  };
  for (PromptGemm& g : out) {
    if (g.matrix == "attn_q" || g.matrix == "attn_k" || g.matrix == "attn_v")
      g.group_rows = rows_of("attn_q") + rows_of("attn_k") + rows_of("attn_v");
    else if (g.matrix == "ffn_gate" || g.matrix == "ffn_up")
      g.group_rows = rows_of("ffn_gate") + rows_of("ffn_up");
    else
      g.group_rows = g.n;
  }
  return out;
}

}  // namespace minfer::test
