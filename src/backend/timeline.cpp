#include "backend/timeline.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>

namespace minfer {
namespace {

template <typename T>
double median_of(std::vector<T> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? double(v[h]) : 0.5 * (double(v[h - 1]) + double(v[h]));
}

// Total length of the union of [begin, end] intervals.
uint64_t union_length(std::vector<std::pair<uint64_t, uint64_t>> spans) {
  std::sort(spans.begin(), spans.end());
  uint64_t total = 0, begin = 0, end = 0;
  bool open = false;
  for (const auto& [b, e] : spans) {
    if (open && b <= end) {
      end = std::max(end, e);
      continue;
    }
    if (open) total += end - begin;
    begin = b, end = e, open = true;
  }
  if (open) total += end - begin;
  return total;
}

}  // namespace

double timer_tick_ns(const std::vector<TimelineCtaRecord>& ctas) {
  std::vector<uint64_t> stamps;
  for (const TimelineCtaRecord& c : ctas)
    for (uint64_t t : {c.enter, c.wait, c.mark, c.exit})
      if (t) stamps.push_back(t);
  std::sort(stamps.begin(), stamps.end());
  stamps.erase(std::unique(stamps.begin(), stamps.end()), stamps.end());
  double tick = 0;
  for (size_t i = 1; i < stamps.size(); ++i) {
    const double d = double(stamps[i] - stamps[i - 1]);
    if (tick == 0 || d < tick) tick = d;
  }
  return tick;
}

std::vector<TimelineCtaRecord> place_by_clock(const std::vector<TimelineCtaRecord>& ctas, double tick_ns) {
  const auto events = [](TimelineCtaRecord& c) {
    return std::array<std::pair<uint64_t*, uint64_t>, 4>{
        {{&c.enter, c.clock_enter}, {&c.wait, c.clock_wait}, {&c.mark, c.clock_mark}, {&c.exit, c.clock_exit}}};
  };
  // Per SM: its events as (cycles, ns) relative to its first event, so that doubles hold them exactly.
  struct Fit {
    uint64_t clock0 = 0, time0 = 0;
    std::vector<std::pair<double, double>> points;
    double slope = 0, intercept = 0;
    bool ok = false;
  };
  std::map<uint32_t, Fit> fits;
  std::vector<TimelineCtaRecord> out = ctas;
  for (TimelineCtaRecord& c : out)
    for (const auto& [t, clock] : events(c)) {
      if (!*t) continue;
      Fit& f = fits[c.sm];
      if (f.points.empty()) f.clock0 = clock, f.time0 = *t;
      f.points.push_back({double(int64_t(clock - f.clock0)), double(int64_t(*t - f.time0)) + 0.5 * tick_ns});
    }
  for (auto& [sm, f] : fits) {
    double mx = 0, my = 0;
    for (const auto& [x, y] : f.points) mx += x, my += y;
    mx /= double(f.points.size()), my /= double(f.points.size());
    double sxx = 0, sxy = 0;
    for (const auto& [x, y] : f.points) sxx += (x - mx) * (x - mx), sxy += (x - mx) * (y - my);
    if (f.points.size() < 2 || sxx <= 0) continue;
    f.slope = sxy / sxx, f.intercept = my - f.slope * mx, f.ok = true;
  }
  for (TimelineCtaRecord& c : out) {
    const Fit& f = fits[c.sm];
    if (!f.ok) continue;
    for (const auto& [t, clock] : events(c))
      if (*t) *t = f.time0 + uint64_t(std::llround(f.slope * double(int64_t(clock - f.clock0)) + f.intercept));
  }
  return out;
}

TimelineSummary summarize_timeline(const std::vector<TimelineLaunch>& launches,
                                   const std::vector<TimelineCtaRecord>& recorded) {
  TimelineSummary s;
  s.tick_ns = timer_tick_ns(recorded);
  s.placed_by_clock = s.tick_ns >= kCoarseTimerTickNs;
  s.ctas = s.placed_by_clock ? place_by_clock(recorded, s.tick_ns) : recorded;
  const std::vector<TimelineCtaRecord>& ctas = s.ctas;
  if (ctas.empty()) {
    for (const TimelineLaunch& l : launches) s.launches.push_back({l.label, l.kernel, l.ctas});
    s.unmatched_launches = int(launches.size());
    return s;
  }
  std::map<uint64_t, std::vector<const TimelineCtaRecord*>> by_grid;
  uint64_t t0 = UINT64_MAX, t_end = 0;
  for (const TimelineCtaRecord& c : ctas) {
    by_grid[c.grid].push_back(&c);
    t0 = std::min(t0, c.enter);
    t_end = std::max(t_end, c.exit);
    s.sms = std::max(s.sms, int(c.sm) + 1);
  }
  s.step_us = 1e-3 * double(t_end - t0);
  s.origin = t0;

  // The groups by their first entry (each group's earliest enter computed once).
  std::vector<std::pair<uint64_t, std::vector<const TimelineCtaRecord*>>> entered;
  for (auto& [grid, g] : by_grid) {
    uint64_t first = UINT64_MAX;
    for (const TimelineCtaRecord* c : g) first = std::min(first, c->enter);
    entered.push_back({first, std::move(g)});
  }
  std::sort(entered.begin(), entered.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::vector<const TimelineCtaRecord*>> groups;
  for (auto& [first, g] : entered) groups.push_back(std::move(g));

  // Timer values may count ns since 1970 (~1.8e18): subtract in integers, then convert (a double holds
  // such a value only to 256 ns).
  const auto us = [](double since_t0) { return 1e-3 * since_t0; };
  size_t next = 0;
  double previous_exit = 0, exit_two_back = 0;
  int recorded_before = 0;
  for (const TimelineLaunch& l : launches) {
    TimelineRow row{l.label, l.kernel, l.ctas};
    if (next < groups.size() && int64_t(groups[next].size()) == l.ctas) {
      const auto& g = groups[next++];
      s.launch_of_grid[g.front()->grid] = int(s.launches.size());
      std::vector<uint64_t> enters, waits, marks, exits;
      std::vector<int> sm_ctas(size_t(s.sms), 0);
      std::vector<uint64_t> sm_exit(size_t(s.sms), 0);
      for (const TimelineCtaRecord* c : g) {
        enters.push_back(c->enter - t0);
        exits.push_back(c->exit - t0);
        if (c->wait) waits.push_back(c->wait - t0);
        if (c->mark) marks.push_back(c->mark - t0);
        sm_ctas[c->sm] += 1;
        sm_exit[c->sm] = std::max(sm_exit[c->sm], c->exit - t0);
      }
      std::vector<uint64_t> sm_exits;
      for (size_t sm = 0; sm < sm_ctas.size(); ++sm) {
        if (!sm_ctas[sm]) continue;
        row.fewest_ctas_an_sm = row.sms ? std::min(row.fewest_ctas_an_sm, sm_ctas[sm]) : sm_ctas[sm];
        row.most_ctas_an_sm = std::max(row.most_ctas_an_sm, sm_ctas[sm]);
        sm_exits.push_back(sm_exit[sm]);
        ++row.sms;
      }
      row.median_sm_exit = us(median_of(sm_exits));
      for (size_t sm = 0; sm < sm_ctas.size(); ++sm)
        if (sm_ctas[sm]) row.sm_offsets.push_back({sm_ctas[sm], us(double(sm_exit[sm])) - row.median_sm_exit});
      row.recorded = int64_t(g.size());
      row.waited = int64_t(waits.size());
      row.first_enter = us(double(*std::min_element(enters.begin(), enters.end())));
      row.last_enter = us(double(*std::max_element(enters.begin(), enters.end())));
      row.first_wait = waits.empty() ? 0 : us(double(*std::min_element(waits.begin(), waits.end())));
      row.median_wait = waits.empty() ? 0 : us(median_of(waits));
      row.median_mark = marks.empty() ? 0 : us(median_of(marks));
      row.median_exit = us(median_of(exits));
      row.last_exit = us(double(*std::max_element(exits.begin(), exits.end())));
      row.increment = row.last_exit - previous_exit;
      row.release = waits.empty() ? 0 : row.first_wait - previous_exit;
      row.has_lead = recorded_before >= 2;
      row.lead = row.has_lead ? row.first_enter - exit_two_back : 0;
      exit_two_back = previous_exit;
      previous_exit = row.last_exit;
      ++recorded_before;
    } else {
      ++s.unmatched_launches;
    }
    s.launches.push_back(row);
  }
  s.unmatched_grids = int(groups.size() - next);
  for (size_t i = next; i < groups.size(); ++i) s.launch_of_grid[groups[i].front()->grid] = -1;

  for (const TimelineRow& r : s.launches) {
    if (!r.recorded) continue;
    auto it = std::find_if(s.classes.begin(), s.classes.end(), [&](const TimelineClass& c) { return c.label == r.label; });
    if (it == s.classes.end()) it = s.classes.insert(s.classes.end(), TimelineClass{r.label});
    it->launches += 1;
    it->ctas += r.ctas;
    it->increment += r.increment;
    it->release += r.release;
    it->after_release += r.waited ? r.last_exit - r.first_wait : 0;
    it->tail += r.last_exit - r.median_exit;
    it->sm_spread += r.last_exit - r.median_sm_exit;
  }
  for (TimelineClass& c : s.classes) {
    std::map<int, std::vector<double>> offsets;  // by CTAs an SM
    std::vector<double> leads;
    for (const TimelineRow& r : s.launches) {
      if (!r.recorded || r.label != c.label) continue;
      for (const auto& [n, t] : r.sm_offsets) offsets[n].push_back(t);
      if (r.has_lead) leads.push_back(r.lead);
    }
    for (const auto& [n, v] : offsets) c.sm_loads.push_back({n, int(v.size()), median_of(v)});
    c.has_lead = !leads.empty();
    c.median_lead = median_of(leads);
  }

  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> per_sm(size_t(s.sms));
  for (const TimelineCtaRecord& c : ctas) per_sm[c.sm].push_back({c.enter, c.exit});
  double busy = 0;
  for (auto& spans : per_sm) busy += double(union_length(std::move(spans)));
  s.sm_busy = t_end > t0 ? busy / (double(s.sms) * double(t_end - t0)) : 0;
  return s;
}

std::string timeline_table(const TimelineSummary& s) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line,
                "| launch class | launches | CTAs | µs in the step | share | release µs | after release µs | tail µs | "
                "SM spread µs | lead µs (median) |\n"
                "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  out += line;
  for (const TimelineClass& c : s.classes) {
    char lead[32] = "";
    if (c.has_lead) std::snprintf(lead, sizeof lead, "%+.2f", c.median_lead);
    std::snprintf(line, sizeof line, "| %s | %d | %lld | %.1f | %.1f%% | %.1f | %.1f | %.1f | %.1f | %s |\n",
                  c.label.c_str(), c.launches, static_cast<long long>(c.ctas), c.increment,
                  s.step_us > 0 ? 100.0 * c.increment / s.step_us : 0.0, c.release, c.after_release, c.tail,
                  c.sm_spread, lead);
    out += line;
  }
  bool loads_header = false;
  for (const TimelineClass& c : s.classes) {
    if (c.sm_loads.size() < 2) continue;
    if (!loads_header) {
      out += "\n| launch class | CTAs an SM | SMs a launch | last exit against the launch's median SM µs (median) |\n"
             "| --- | ---: | ---: | ---: |\n";
      loads_header = true;
    }
    for (const TimelineSmLoad& l : c.sm_loads) {
      std::snprintf(line, sizeof line, "| %s | %d | %.1f | %+.2f |\n", c.label.c_str(), l.ctas_an_sm,
                    double(l.sm_launches) / double(c.launches), l.median_offset);
      out += line;
    }
  }
  std::snprintf(line, sizeof line,
                "\nstep %.1f µs over %d SMs, a CTA resident %.1f%% of the SM time; timer tick %.0f ns%s; %d "
                "launches without records, %d record groups unmatched\n",
                s.step_us, s.sms, 100.0 * s.sm_busy, s.tick_ns, s.placed_by_clock ? " (events placed by SM clocks)" : "",
                s.unmatched_launches, s.unmatched_grids);
  out += line;
  return out;
}

std::string timeline_csv(const TimelineSummary& s) {
  std::string out =
      "index,label,kernel,ctas,recorded,sms,first_enter_us,last_enter_us,first_wait_us,median_wait_us,"
      "median_mark_us,median_exit_us,last_exit_us,increment_us,release_us,fewest_ctas_an_sm,most_ctas_an_sm,"
      "median_sm_exit_us,lead_us\n";
  char line[512];
  for (size_t i = 0; i < s.launches.size(); ++i) {
    const TimelineRow& r = s.launches[i];
    char lead[32] = "";
    if (r.has_lead) std::snprintf(lead, sizeof lead, "%.3f", r.lead);
    std::snprintf(line, sizeof line,
                  "%zu,%s,%s,%lld,%lld,%d,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%d,%d,%.3f,%s\n", i,
                  r.label.c_str(), r.kernel.c_str(), static_cast<long long>(r.ctas), static_cast<long long>(r.recorded),
                  r.sms, r.first_enter, r.last_enter, r.first_wait, r.median_wait, r.median_mark, r.median_exit,
                  r.last_exit, r.increment, r.release, r.fewest_ctas_an_sm, r.most_ctas_an_sm, r.median_sm_exit, lead);
    out += line;
  }
  return out;
}

std::string timeline_cta_csv(const TimelineSummary& s) {
  std::string out = "launch,block,sm,enter_us,wait_us,mark_us,exit_us,clock_enter,clock_wait,clock_mark,clock_exit\n";
  const auto us = [&](uint64_t t) {
    if (!t) return std::string();
    char b[32];
    std::snprintf(b, sizeof b, "%.3f", 1e-3 * double(int64_t(t - s.origin)));
    return std::string(b);
  };
  for (const TimelineCtaRecord& c : s.ctas) {
    const auto it = s.launch_of_grid.find(c.grid);
    out += std::to_string(it == s.launch_of_grid.end() ? -1 : it->second) + "," + std::to_string(c.block) + "," +
           std::to_string(c.sm) + "," + us(c.enter) + "," + us(c.wait) + "," + us(c.mark) + "," + us(c.exit) + "," +
           std::to_string(c.clock_enter) + "," + std::to_string(c.clock_wait) + "," + std::to_string(c.clock_mark) + "," +
           std::to_string(c.clock_exit) + "\n";
  }
  return out;
}

}  // namespace minfer
