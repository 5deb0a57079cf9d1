// The timeline probes (backend/timeline.h): in a build configured with -DMINFER_TIMELINE=ON,
// MINFER_TIMELINE_PROBE() at a kernel's first statement makes thread 0 of each CTA read %globaltimer
// (and its SM's %clock64) there, after the PDL wait (await_predecessor calls timeline_waited) and
// at the kernel's own timeline_mark(), and store one TimelineCtaRecord when it leaves the kernel,
// by whichever return.
// In every other build the probe is a statement that does nothing and the two calls are empty, so
// those kernels' machine code is what it is without them (scripts/sass).
// Thread 0's exit is the CTA's where thread 0 finishes last or with the rest (the matmuls' join, the
// row kernels); a kernel whose thread 0 leaves early records that.
#pragma once
#include <cstdint>

#ifdef MINFER_TIMELINE
#include <cuda_runtime.h>

#include <vector>

#include "backend/cuda/device.h"
#include "backend/cuda/device_timeline.h"
#include "util/error.h"
#endif

namespace minfer::cuda {

#ifdef MINFER_TIMELINE
namespace {

// This translation unit's records (one step of a 14B at one sequence is ≈ 80 k CTAs).
constexpr unsigned kTimelineCapacity = 1u << 18;
__device__ TimelineCtaRecord timeline_records[kTimelineCapacity];
__device__ unsigned int timeline_used;

void timeline_reset_unit(cudaStream_t stream) {
  static const unsigned zero = 0;
  check(cudaMemcpyToSymbolAsync(timeline_used, &zero, sizeof zero, 0, cudaMemcpyHostToDevice, stream),
        "timeline reset");
}
void timeline_collect_unit(std::vector<TimelineCtaRecord>& out) {
  unsigned used = 0;
  check(cudaMemcpyFromSymbol(&used, timeline_used, sizeof used), "timeline count");
  if (used > kTimelineCapacity)
    fail("timeline: ", used, " CTAs in one step, more than the ", kTimelineCapacity, " a unit holds");
  const size_t at = out.size();
  out.resize(at + used);
  if (used)
    check(cudaMemcpyFromSymbol(out.data() + at, timeline_records, used * sizeof(TimelineCtaRecord)), "timeline read");
}
[[maybe_unused]] const bool timeline_unit_registered = register_timeline_unit(timeline_reset_unit, timeline_collect_unit);

__device__ __forceinline__ uint64_t timeline_now() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint64_t timeline_clock() {
  uint64_t c;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(c));
  return c;
}
__device__ __forceinline__ bool timeline_thread0() { return threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0; }
struct TimelineMarks {
  uint64_t enter, wait, mark, clock_enter, clock_wait, clock_mark;
};
// Thread 0's times so far, in the CTA's shared memory (48 bytes; only thread 0 touches them).
__device__ __forceinline__ TimelineMarks& timeline_marks() {
  __shared__ TimelineMarks marks;
  return marks;
}

class TimelineProbe {
 public:
  __device__ TimelineProbe() {
    if (timeline_thread0()) timeline_marks() = {timeline_now(), 0, 0, timeline_clock(), 0, 0};
  }
  __device__ ~TimelineProbe() {
    if (!timeline_thread0()) return;
    const uint64_t exit = timeline_now(), clock_exit = timeline_clock();
    const TimelineMarks& m = timeline_marks();
    uint64_t grid;
    uint32_t sm;
    asm volatile("mov.u64 %0, %%gridid;" : "=l"(grid));
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    const unsigned slot = atomicAdd(&timeline_used, 1u);
    if (slot < kTimelineCapacity)
      timeline_records[slot] = {grid,          m.enter,      m.wait,       m.mark,     exit,
                                m.clock_enter, m.clock_wait, m.clock_mark, clock_exit,
                                blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z), sm};
  }
  TimelineProbe(const TimelineProbe&) = delete;
  TimelineProbe& operator=(const TimelineProbe&) = delete;
};

__device__ __forceinline__ void timeline_waited() {
  if (timeline_thread0()) timeline_marks().wait = timeline_now(), timeline_marks().clock_wait = timeline_clock();
}
__device__ __forceinline__ void timeline_mark() {
  if (timeline_thread0() && timeline_marks().mark == 0)
    timeline_marks().mark = timeline_now(), timeline_marks().clock_mark = timeline_clock();
}

}  // namespace
#define MINFER_TIMELINE_PROBE() const ::minfer::cuda::TimelineProbe minfer_timeline_probe
#else
#define MINFER_TIMELINE_PROBE() static_assert(true)
__device__ __forceinline__ void timeline_waited() {}
__device__ __forceinline__ void timeline_mark() {}
#endif

}  // namespace minfer::cuda
