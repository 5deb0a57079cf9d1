// Host side of the timeline probes (timeline.cuh, in builds configured with -DMINFER_TIMELINE=ON):
// each CUDA translation unit that has probes keeps its CTAs' records in its own device array and
// registers how to clear and read it; launch_kernel logs every launch under the label the backend
// sets, so that the records can be matched to launches (backend/timeline.h). Plain C++.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backend/timeline.h"

namespace minfer::cuda {

#ifdef MINFER_TIMELINE
constexpr bool kTimelineBuilt = true;
#else
constexpr bool kTimelineBuilt = false;
#endif

// A unit's device array: its clear, enqueued on the stream the step runs on, and its read (after
// that stream's step has ended), which appends the records and fails if the array overflowed.
using TimelineUnitReset = void (*)(cudaStream_t);
using TimelineUnitCollect = void (*)(std::vector<TimelineCtaRecord>&);
bool register_timeline_unit(TimelineUnitReset reset, TimelineUnitCollect collect);
void timeline_reset(cudaStream_t stream);
std::vector<TimelineCtaRecord> timeline_collect();

// While a log is armed, each launch is appended to it under the current label.
void timeline_arm(std::vector<TimelineLaunch>* log);
void timeline_label(const std::string& label);
void timeline_note_launch(const char* kernel, int64_t ctas);

}  // namespace minfer::cuda
