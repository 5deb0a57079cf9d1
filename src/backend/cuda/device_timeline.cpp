#include "backend/cuda/device_timeline.h"

namespace minfer::cuda {
namespace {

struct Unit {
  TimelineUnitReset reset;
  TimelineUnitCollect collect;
};
std::vector<Unit>& units() {
  static std::vector<Unit> u;
  return u;
}
struct Log {
  std::vector<TimelineLaunch>* launches = nullptr;
  std::string label;
};
Log& log() {
  static Log l;
  return l;
}

}  // namespace

bool register_timeline_unit(TimelineUnitReset reset, TimelineUnitCollect collect) {
  units().push_back({reset, collect});
  return true;
}

void timeline_reset(cudaStream_t stream) {
  for (const Unit& u : units()) u.reset(stream);
}

std::vector<TimelineCtaRecord> timeline_collect() {
  std::vector<TimelineCtaRecord> out;
  for (const Unit& u : units()) u.collect(out);
  return out;
}

void timeline_arm(std::vector<TimelineLaunch>* launches) {
  log().launches = launches;
  log().label.clear();
}
void timeline_label(const std::string& label) { log().label = label; }
void timeline_note_launch(const char* kernel, int64_t ctas) {
  if (log().launches) log().launches->push_back({log().label, kernel, ctas});
}

}  // namespace minfer::cuda
