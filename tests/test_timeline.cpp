// The timeline's matching of CTA records to launches and its sums (backend/timeline.h), on records
// written by hand: the probes themselves run only in a build configured with -DMINFER_TIMELINE=ON.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>

#include "backend/timeline.h"

namespace minfer {
namespace {

// A CTA of launch `grid` on SM `sm`, times in ns after an origin like %globaltimer's (it may count ns since 1970,
// beyond what a double holds to the ns), 0 meaning "none".
TimelineCtaRecord cta(uint64_t grid, uint32_t sm, uint64_t enter, uint64_t wait, uint64_t exit, uint64_t mark = 0) {
  const uint64_t origin = 1'796'450'000'000'000'123;
  return {grid, origin + enter, wait ? origin + wait : 0, mark ? origin + mark : 0, origin + exit, 2 * enter, 2 * wait,
          2 * mark, 2 * exit, 0, sm};
}

TEST(Timeline, GroupsGoToLaunchesInOrderOfFirstEntrySkippingLaunchesWithoutRecords) {
  // Grid ids do not follow time: the later launch has the smaller id.
  const std::vector<TimelineLaunch> launches = {
      {"rms_norm", "rms_norm", 2}, {"embed", "embed", 3}, {"matvec_qkv", "matmul_mma", 2}};
  const std::vector<TimelineCtaRecord> ctas = {
      cta(900, 0, 0, 1000, 3000), cta(900, 1, 500, 1200, 4000),            // rms_norm
      cta(7, 1, 3500, 4500, 9000, 6000), cta(7, 2, 3600, 4600, 8000, 7000),  // matvec_qkv
  };
  const TimelineSummary s = summarize_timeline(launches, ctas);
  ASSERT_EQ(s.launches.size(), 3u);
  EXPECT_EQ(s.unmatched_launches, 1);
  EXPECT_EQ(s.unmatched_grids, 0);
  const TimelineRow& norm = s.launches[0];
  EXPECT_EQ(norm.recorded, 2);
  EXPECT_EQ(norm.waited, 2);
  EXPECT_EQ(norm.sms, 2);
  EXPECT_DOUBLE_EQ(norm.first_enter, 0.0);
  EXPECT_DOUBLE_EQ(norm.last_enter, 0.5);
  EXPECT_DOUBLE_EQ(norm.first_wait, 1.0);
  EXPECT_DOUBLE_EQ(norm.median_wait, 1.1);
  EXPECT_DOUBLE_EQ(norm.median_exit, 3.5);
  EXPECT_DOUBLE_EQ(norm.last_exit, 4.0);
  EXPECT_DOUBLE_EQ(norm.increment, 4.0);
  EXPECT_DOUBLE_EQ(norm.median_mark, 0.0);
  EXPECT_EQ(s.launches[1].recorded, 0);
  const TimelineRow& qkv = s.launches[2];
  EXPECT_EQ(qkv.recorded, 2);
  EXPECT_DOUBLE_EQ(qkv.increment, 5.0);  // 9.0 - 4.0
  EXPECT_DOUBLE_EQ(qkv.release, 0.5);    // its first wait 4.5 after the norm's last exit 4.0
  EXPECT_DOUBLE_EQ(qkv.median_mark, 6.5);
  EXPECT_DOUBLE_EQ(s.step_us, 9.0);
  EXPECT_EQ(s.sms, 3);
  const std::string cta_csv = timeline_cta_csv(s);
  EXPECT_EQ(cta_csv.rfind("launch,block,sm,enter_us,wait_us,mark_us,exit_us,"
                          "clock_enter,clock_wait,clock_mark,clock_exit\n",
                          0),
            0u);
  EXPECT_NE(cta_csv.find("\n2,0,1,3.500,4.500,6.000,9.000,7000,9000,12000,18000\n"), std::string::npos) << cta_csv;
  EXPECT_EQ(std::count(cta_csv.begin(), cta_csv.end(), '\n'), 5);  // the header and the 4 CTAs
}

TEST(Timeline, SmBusyCountsOverlappingCtasOfAnSmOnce) {
  const std::vector<TimelineLaunch> launches = {{"a", "k", 2}, {"b", "k", 1}};
  // SM 0: [0, 10] and [5, 15] -> 15 ns; SM 1: [20, 30] -> 10 ns; the step is 30 ns on 2 SMs.
  const std::vector<TimelineCtaRecord> ctas = {cta(1, 0, 0, 0, 10), cta(1, 0, 5, 0, 15), cta(2, 1, 20, 0, 30)};
  const TimelineSummary s = summarize_timeline(launches, ctas);
  EXPECT_EQ(s.sms, 2);
  EXPECT_DOUBLE_EQ(s.sm_busy, 25.0 / 60.0);
  EXPECT_DOUBLE_EQ(s.tick_ns, 5.0);  // distinct stamps 0, 5, 10, 15, 20, 30
  EXPECT_DOUBLE_EQ(s.launches[1].release, 0.0);  // no wait recorded
}

TEST(Timeline, ClassesAddTheirLaunchesAndLeftoverGroupsAreCounted) {
  const std::vector<TimelineLaunch> launches = {{"gate_up", "matmul_mma", 1}, {"swiglu", "swiglu", 1},
                                                {"gate_up", "matmul_mma", 1}};
  const std::vector<TimelineCtaRecord> ctas = {
      cta(1, 0, 0, 100, 2000),    cta(2, 0, 2100, 2200, 3000), cta(3, 0, 3100, 3300, 6000),
      cta(4, 0, 6100, 6200, 6500),  // a kernel the launches do not list (a draw after the graph)
  };
  const TimelineSummary s = summarize_timeline(launches, ctas);
  EXPECT_EQ(s.unmatched_launches, 0);
  EXPECT_EQ(s.unmatched_grids, 1);
  EXPECT_EQ(s.launch_of_grid.at(4), -1);
  EXPECT_EQ(s.launch_of_grid.at(3), 2);
  ASSERT_EQ(s.classes.size(), 2u);
  EXPECT_EQ(s.classes[0].label, "gate_up");
  EXPECT_EQ(s.classes[0].launches, 2);
  EXPECT_DOUBLE_EQ(s.classes[0].increment, 2.0 + 3.0);
  EXPECT_DOUBLE_EQ(s.classes[0].release, 0.1 + 0.3);
  EXPECT_DOUBLE_EQ(s.classes[0].after_release, 1.9 + 2.7);
  EXPECT_EQ(s.classes[1].label, "swiglu");
  EXPECT_DOUBLE_EQ(s.classes[1].increment, 1.0);
  const std::string table = timeline_table(s);
  EXPECT_NE(table.find("| gate_up | 2 | 2 | 5.0 |"), std::string::npos) << table;
  EXPECT_NE(timeline_csv(s).find("2,gate_up,matmul_mma,1,1,1,"), std::string::npos);
}

// A launch ends with its busiest SM: the CTAs an SM held and each SM's last exit, against the median SM.
TEST(Timeline, EachLaunchCountsItsCtasAnSmAndHowFarItsLastSmTrails) {
  const std::vector<TimelineLaunch> launches = {{"down", "matmul_mma", 4}};
  // SM 0 holds two CTAs (its last exit 9 µs), SM 1 one (4 µs), SM 3 one (6 µs); SM 2 none.
  const std::vector<TimelineCtaRecord> ctas = {cta(5, 0, 0, 100, 5000), cta(5, 0, 10, 100, 9000),
                                               cta(5, 1, 20, 100, 4000), cta(5, 3, 30, 100, 6000)};
  const TimelineSummary s = summarize_timeline(launches, ctas);
  const TimelineRow& r = s.launches[0];
  EXPECT_EQ(r.sms, 3);
  EXPECT_EQ(r.fewest_ctas_an_sm, 1);
  EXPECT_EQ(r.most_ctas_an_sm, 2);
  EXPECT_DOUBLE_EQ(r.median_sm_exit, 6.0);  // of 9, 4 and 6; the CTAs' median exit is 5.5
  EXPECT_DOUBLE_EQ(r.median_exit, 5.5);
  ASSERT_EQ(s.classes.size(), 1u);
  EXPECT_DOUBLE_EQ(s.classes[0].sm_spread, 3.0);
  // tail, SM spread, and no lead (one launch)
  EXPECT_NE(timeline_table(s).find("| 3.5 | 3.0 |  |\n"), std::string::npos) << timeline_table(s);
  EXPECT_NE(timeline_csv(s).find(",1,2,6.000,\n"), std::string::npos) << timeline_csv(s);  // no lead: the first launch
}

// An SM's last exit against its launch's median SM, by the CTAs it held, pooled over a class's
// launches of unlike lengths: where each CTA is a row tile, what a busy SM costs against a light one.
TEST(Timeline, ClassesCountTheirSmsByCtasAnSmWithHowLateTheyLeave) {
  const std::vector<TimelineLaunch> launches = {{"o", "matmul_mma", 4}, {"norm", "rms_norm", 1}, {"o", "matmul_mma", 4}};
  const std::vector<TimelineCtaRecord> ctas = {
      // first o: SM 0 two CTAs (last exit 5 µs), SMs 1 and 2 one each (3 and 4 µs): median SM 4 µs
      cta(1, 0, 0, 1000, 4000), cta(1, 0, 10, 1100, 5000), cta(1, 1, 20, 1200, 3000), cta(1, 2, 30, 1200, 4000),
      cta(2, 0, 5100, 5200, 5500),  // norm: one SM, one CTA
      // second o, twice as long: SM 1 two CTAs (13 µs), SMs 2 and 3 one each (8 and 10 µs): median 10 µs
      cta(3, 1, 5600, 6000, 12000), cta(3, 1, 5700, 6100, 13000), cta(3, 2, 5800, 6200, 8000),
      cta(3, 3, 5900, 6200, 10000)};
  const TimelineSummary s = summarize_timeline(launches, ctas);
  ASSERT_EQ(s.classes.size(), 2u);
  const TimelineClass& o = s.classes[0];
  ASSERT_EQ(o.sm_loads.size(), 2u);
  EXPECT_EQ(o.sm_loads[0].ctas_an_sm, 1);
  EXPECT_EQ(o.sm_loads[0].sm_launches, 4);
  EXPECT_DOUBLE_EQ(o.sm_loads[0].median_offset, 0.5 * (-1.0 + 0.0));  // of -1, 0, -2, 0
  EXPECT_EQ(o.sm_loads[1].ctas_an_sm, 2);
  EXPECT_EQ(o.sm_loads[1].sm_launches, 2);
  EXPECT_DOUBLE_EQ(o.sm_loads[1].median_offset, 0.5 * (1.0 + 3.0));
  EXPECT_EQ(s.classes[1].sm_loads.size(), 1u);
  const std::string table = timeline_table(s);
  EXPECT_NE(table.find("| o | 1 | 2.0 | -0.50 |\n| o | 2 | 1.0 | +2.00 |\n"), std::string::npos) << table;
  const size_t loads_at = table.find("| CTAs an SM |");
  ASSERT_NE(loads_at, std::string::npos) << table;
  EXPECT_EQ(table.find("| norm |", loads_at), std::string::npos) << table;  // one load only: no rows
}

// A launch's lead: its first entry against the last exit of the recorded launch two back (the one
// its predecessor follows), negative where it started while that one still ran; a launch without
// records is skipped, as in the increments.
TEST(Timeline, EachLaunchLeadsFromTheLastExitOfTheRecordedLaunchTwoBack) {
  const std::vector<TimelineLaunch> launches = {{"o", "matmul_mma", 1},      {"norm", "rms_norm", 1},
                                                {"gate_up", "matmul_mma", 1}, {"swiglu", "swiglu", 2},
                                                {"down", "matmul_mma", 1},    {"norm", "rms_norm", 1},
                                                {"gate_up", "matmul_mma", 1}};
  const std::vector<TimelineCtaRecord> ctas = {
      cta(1, 0, 0, 100, 10000),       // o: exits at 10 µs
      cta(2, 1, 9000, 10200, 12000),  // norm
      cta(3, 2, 9500, 12300, 20000),  // gate_up enters 0.5 µs before o's exit
      // swiglu: no records
      cta(4, 0, 20500, 20600, 25000),  // down: enters 8.5 µs after the norm's exit (12 µs)
      cta(5, 1, 24000, 25100, 26000),  // norm
      cta(6, 2, 26000, 26200, 30000),  // gate_up enters 1 µs after down's exit
  };
  const TimelineSummary s = summarize_timeline(launches, ctas);
  ASSERT_EQ(s.launches.size(), 7u);
  EXPECT_FALSE(s.launches[0].has_lead);
  EXPECT_FALSE(s.launches[1].has_lead);
  ASSERT_TRUE(s.launches[2].has_lead);
  EXPECT_DOUBLE_EQ(s.launches[2].lead, -0.5);
  EXPECT_FALSE(s.launches[3].has_lead);  // nothing recorded
  EXPECT_DOUBLE_EQ(s.launches[4].lead, 20.5 - 12.0);
  EXPECT_DOUBLE_EQ(s.launches[6].lead, 1.0);
  ASSERT_EQ(s.classes.size(), 4u);
  EXPECT_EQ(s.classes[0].label, "o");
  EXPECT_FALSE(s.classes[0].has_lead);
  EXPECT_EQ(s.classes[2].label, "gate_up");
  EXPECT_DOUBLE_EQ(s.classes[2].median_lead, 0.5 * (-0.5 + 1.0));
  EXPECT_EQ(s.classes[1].label, "norm");
  EXPECT_DOUBLE_EQ(s.classes[1].median_lead, 24.0 - 20.0);  // the second norm's: the first has one launch before it
  const std::string table = timeline_table(s);
  EXPECT_NE(table.find("| o | 1 | 1 | 10.0 | 33.3% | 0.1 | 9.9 | 0.0 | 0.0 |  |\n"), std::string::npos) << table;
  EXPECT_NE(table.find("| +0.25 |\n"), std::string::npos) << table;
  EXPECT_NE(timeline_csv(s).find(",-0.500\n"), std::string::npos) << timeline_csv(s);
}

// A timer of 1 µs ticks (what the summary sees when %globaltimer updates coarsely): the events are
// placed by each SM's cycle count, within a small part of a tick of their true times.
TEST(Timeline, ACoarseTimerIsRefinedByEachSmsClock) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> when(0.0, 20000.0);  // ns into the step
  const uint64_t origin = 1'796'450'000'000'000'000;
  const double ghz = 1.98;
  std::vector<TimelineCtaRecord> ctas;
  std::vector<std::array<double, 2>> truth;  // enter, exit in ns
  for (uint32_t sm = 0; sm < 4; ++sm) {
    const uint64_t clock_offset = 1'000'000'000ull * (sm + 1) + 12345 * sm;
    for (int i = 0; i < 60; ++i) {
      const double enter = when(rng), exit = enter + 500 + when(rng) / 10;
      const auto timer = [&](double t) { return origin + uint64_t(t) / 1000 * 1000; };  // ticks of 1 µs
      const auto clock = [&](double t) { return clock_offset + uint64_t(std::llround(t * ghz)); };
      ctas.push_back({1, timer(enter), 0, 0, timer(exit), clock(enter), 0, 0, clock(exit), uint32_t(i), sm});
      truth.push_back({enter, exit});
    }
  }
  EXPECT_DOUBLE_EQ(timer_tick_ns(ctas), 1000.0);
  const std::vector<TimelineCtaRecord> placed = place_by_clock(ctas, 1000.0);
  double worst = 0;
  for (size_t i = 0; i < placed.size(); ++i) {
    worst = std::max(worst, std::abs(double(placed[i].enter - origin) - truth[i][0]));
    worst = std::max(worst, std::abs(double(placed[i].exit - origin) - truth[i][1]));
    EXPECT_EQ(placed[i].wait, 0u);  // events not recorded stay absent
  }
  EXPECT_LT(worst, 150.0);  // against 1,000 ns for the raw timer
  const TimelineSummary s = summarize_timeline({{"a", "k", int64_t(ctas.size())}}, ctas);
  EXPECT_TRUE(s.placed_by_clock);
  EXPECT_EQ(s.launches[0].recorded, int64_t(ctas.size()));
}

TEST(Timeline, NoRecordsLeaveEveryLaunchUnmatched) {
  const TimelineSummary s = summarize_timeline({{"a", "k", 4}}, {});
  EXPECT_EQ(s.unmatched_launches, 1);
  EXPECT_EQ(s.launches.size(), 1u);
  EXPECT_DOUBLE_EQ(s.step_us, 0.0);
}

}  // namespace
}  // namespace minfer
