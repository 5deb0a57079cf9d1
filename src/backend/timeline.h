// The in-graph timeline of one step: what thread 0 of every CTA of every kernel recorded (in a
// CUDA build configured with -DMINFER_TIMELINE=ON: backend/cuda/timeline.cuh), matched to the
// kernel launches the host made, and summarized. A launch's cost inside a CUDA graph is how much
// later the step's chain of launches ends because of it: its last CTA's exit minus the previous
// launch's (the census times launches one by one, serialized, which no graph step does).
// Plain C++: the matching and the summary are tested on the CPU (tests/test_timeline.cpp).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace minfer {

// One CTA, as its thread 0 saw it: %gridid of its launch, its SM, and %globaltimer (ns) at the
// kernel's first statement, when its wait for the stream's previous kernel returned, at the kernel's
// own mark (the weight ring: its first stage landed) and at thread 0's exit; 0 where a kernel has
// no such point; and its SM's %clock64 at the same four points (where the global timer ticks coarsely,
// each SM's cycle count against it places the events finer). A plain aggregate: the device writes it
// as it is.
struct TimelineCtaRecord {
  uint64_t grid;
  uint64_t enter, wait, mark, exit;
  uint64_t clock_enter, clock_wait, clock_mark, clock_exit;
  uint32_t block;  // linear block index
  uint32_t sm;
};

// A kernel launch as the host made it, in stream order: the plan launch it belongs to (the census
// label), the launcher's kernel name, its CTAs.
struct TimelineLaunch {
  std::string label;
  std::string kernel;
  int64_t ctas = 0;
};

// One launch of the step; times in µs from the step's first CTA entry.
struct TimelineRow {
  std::string label, kernel;
  int64_t ctas = 0;
  int64_t recorded = 0;  // 0: no CTA of it recorded (a kernel without the probe)
  int64_t waited = 0;    // CTAs that recorded their wait for the previous kernel
  double first_enter = 0, last_enter = 0;
  double first_wait = 0, median_wait = 0;  // its predecessor complete (PDL)
  double median_mark = 0;                  // 0: the kernel has no mark
  double median_exit = 0, last_exit = 0;
  // last_exit minus the previous recorded launch's last_exit: the launch's share of the step.
  double increment = 0;
  // first_wait minus the previous recorded launch's last_exit: from the predecessor's end to
  // this launch's release.
  double release = 0;
  // first_enter minus the last_exit of the recorded launch two back: how early its first CTA
  // started against the launch its predecessor follows (negative: while that launch still ran, as
  // where the predecessor releases its dependents at its start). has_lead: two recorded launches
  // precede it.
  double lead = 0;
  bool has_lead = false;
  int sms = 0;  // SMs that held at least one of its CTAs
  // Of those SMs: the fewest and the most of its CTAs one held, and the median of their last exits
  // (a launch ends with its busiest SM: last_exit - median_sm_exit is how far that one trails).
  int fewest_ctas_an_sm = 0, most_ctas_an_sm = 0;
  double median_sm_exit = 0;
  // Each of those SMs: the CTAs it held and its last exit minus median_sm_exit (µs).
  std::vector<std::pair<int, double>> sm_offsets{};
};

// The SMs that held the same number of a class's CTAs, over the class's launches, and how much later
// than their launch's median SM they left: where each CTA is one unit of work (a one-tile matmul's
// row tile), what a busy SM costs against a light one. Offsets, not times, so that the launches of
// one label that differ in length pool (the 14B's q/k/v in its q4_K-v and q6_K-v layers).
struct TimelineSmLoad {
  int ctas_an_sm = 0;
  int sm_launches = 0;         // such SMs, summed over the launches
  double median_offset = 0;    // the median of their last exits minus their launch's median_sm_exit (µs)
};

// The launches of one label (a class of launch) added up.
struct TimelineClass {
  std::string label;
  int launches = 0;
  int64_t ctas = 0;
  double increment = 0, release = 0;
  double after_release = 0;  // sum of last_exit - first_wait
  double tail = 0;           // sum of last_exit - median_exit
  double sm_spread = 0;      // sum of last_exit - median_sm_exit
  double median_lead = 0;    // over its launches with a lead (TimelineRow::lead)
  bool has_lead = false;
  std::vector<TimelineSmLoad> sm_loads{};  // by CTAs an SM, fewest first
};

struct TimelineSummary {
  std::vector<TimelineRow> launches;
  std::vector<TimelineClass> classes;  // in order of first appearance
  double step_us = 0;                  // first entry to last exit
  int sms = 0;                         // SMs seen (highest %smid + 1)
  double sm_busy = 0;                  // share of SM time with a CTA of any kernel resident
  int unmatched_launches = 0;          // launches no record group matched
  int unmatched_grids = 0;             // record groups left over after the matching
  double tick_ns = 0;                  // the smallest nonzero step between two timer values
  bool placed_by_clock = false;        // the times are place_by_clock's (the timer ticked coarsely)
  uint64_t origin = 0;                 // the step's first entry (ns)
  std::vector<TimelineCtaRecord> ctas;     // the records summarized (placed by clock where it says so)
  std::map<uint64_t, int> launch_of_grid;  // each record group's launch (index), -1 unmatched
};

// The smallest nonzero step between two of the records' timer values (ns; 0 if there is none).
double timer_tick_ns(const std::vector<TimelineCtaRecord>& ctas);
// Where the timer's tick is at least this, summarize_timeline places events by their SMs' clocks.
constexpr double kCoarseTimerTickNs = 200;
// The records with every event's timer value replaced by its SM's clock reading mapped onto the
// timer: a least-squares line a SM from clock to timer over all its events (each timer value taken
// at the middle of its tick), so that events a coarse tick apart are ordered and spaced by their
// cycles. SMs with fewer than two distinct clock readings keep their timer values.
std::vector<TimelineCtaRecord> place_by_clock(const std::vector<TimelineCtaRecord>& ctas, double tick_ns);

// Groups the records by launch (%gridid), orders the groups by first entry and pairs them with the
// launches in stream order: a group goes to the next launch of its CTA count; a launch whose count
// the next group does not have recorded nothing. Where the timer ticks coarsely
// (kCoarseTimerTickNs), the events are placed by clock first.
TimelineSummary summarize_timeline(const std::vector<TimelineLaunch>& launches,
                                   const std::vector<TimelineCtaRecord>& ctas);
// The per-class table and the step's totals (markdown); then, for each class whose SMs held unlike
// numbers of its CTAs, its SMs by that number (TimelineSmLoad).
std::string timeline_table(const TimelineSummary& s);
// One line per launch (the rows above).
std::string timeline_csv(const TimelineSummary& s);
// One line per CTA of s.ctas: its launch (index into s.launches, -1 unmatched), block, SM, times in
// µs from the step's first entry (empty where it has none) and the four clock readings.
std::string timeline_cta_csv(const TimelineSummary& s);

}  // namespace minfer
