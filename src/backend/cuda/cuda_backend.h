// The CUDA backend: the forward pass on one GPU for a step of many sequences. The lowering pass
// (backend/plan.h) turns the graph into launches; decode-only steps are captured into a CUDA graph
// per batch-size bucket and replayed; steps with prompt rows run their launches directly.
// docs/07-cuda-backend.md and docs/10-batching.md describe the design.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/plan.h"
#include "backend/timeline.h"

namespace minfer::cuda {

struct KernelTime {
  std::string name;
  int launches = 0;
  double microseconds = 0;
  // What its launches must move at least: the GGUF weights of matmuls, the K and V (f16) the
  // attention's rows attend to; 0 for the other kernels.
  int64_t bytes = 0;
};

// Where decode and prompt steps spend their wall time, summed over the forwards since
// reset_step_times(): the device time of each step (CUDA events from its first upload to its last
// copy back) and the time the device sat idle before it, waiting for the host to submit it
// (from the end of the previous step; not counted for the first step after a reset, none for a
// fed step, queued before the previous one ended: StepBatch::tokens_from_previous). With
// split_step_times(true), the device time of those steps also in its three parts: the uploads (to
// the first launch), the launches (to the last one's end), the copies back.
struct StepTimes {
  int steps = 0;
  double device_seconds = 0, idle_seconds = 0;
  int split_steps = 0;
  double upload_seconds = 0, launch_seconds = 0, copy_back_seconds = 0;
};

struct LoadStats {
  double upload_seconds = 0;  // mmap -> device, including the pinned staging
  int64_t weight_bytes = 0;
  int64_t kv_bytes = 0;
  int64_t workspace_bytes = 0;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(const Model& model, Fusions fusions = Fusions::from_env(), int device = 0);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override { return "cuda"; }
  int64_t kv_block_bytes(int block_size) const override;
  int64_t workspace_bytes(int max_tokens, int max_outputs) const override;
  int64_t memory_available() const override;
  void reserve(int n_blocks, int block_size, int max_tokens, int max_outputs) override;
  int max_tokens() const override;
  int max_outputs() const override;
  void copy_blocks(std::span<const BlockCopy> copies) override;
  void submit(const StepBatch& batch) override;
  void collect(StepOutput& out) override;

  // The next forward runs launch by launch, timing each with CUDA events; census_result() then
  // lists the launches by name.
  void census_next_step();
  std::vector<KernelTime> census_result() const;
  // The next forward records every CTA's times (a build configured with -DMINFER_TIMELINE=ON, else
  // it fails saying so); timeline_result() then holds them matched to the step's kernel launches.
  void timeline_next_step();
  const TimelineSummary& timeline_result() const;
  // For tests of the lanes' independence: mixed steps (decode and prompt rows) run their decode
  // lane and prompt lane on the main stream in one fixed interleaving, the decode lane's launches
  // `decode_lead` ahead of the prompt lane's (negative: behind); nullopt: on two streams again.
  // Every interleaving must give the bits of the plan's order.
  void interleave_lanes(std::optional<int> decode_lead);
  // The launches of the last forward (tests look at the fusions the plan chose).
  const std::vector<Launch>& last_launches() const;
  const LoadStats& load_stats() const;
  const StepTimes& step_times() const;
  void reset_step_times();
  // Two more events a step between its phases (off by default: a measurement's own cost).
  void split_step_times(bool on);
  const Fusions& fusions() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Decode matmuls of at least this many rows use the tensor-core kernel, the others the warp-per-row
// kernel (both give the same bits; a speed choice, measured: docs/10-batching.md — since the
// grouped order the tensor-core kernel is faster from one row, so the default is 1).
// MINFER_MMA_MIN_ROWS overrides it.
int mma_min_rows();

// Device-to-device copy rate in bytes per second (bytes read + bytes written), for rooflines.
double measure_copy_bandwidth();
std::string device_name();

}  // namespace minfer::cuda
