// /metrics in Prometheus' text format. The names are part of the server's interface: gauges and
// counters come from the scheduler's counts, the two latency histograms from the HTTP layer, which
// sees each request's first token and its end.
#pragma once
#include <mutex>
#include <string>
#include <vector>

#include "engine/scheduler.h"

namespace minfer::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  // Appends the _bucket (cumulative, then +Inf), _sum and _count lines.
  void write(std::string& out, const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, the last one is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class ServerMetrics {
 public:
  ServerMetrics();
  void observe_first_token(double seconds);
  void observe_time_per_output_token(double seconds);
  std::string prometheus_text(const SchedulerCounts& c) const;

 private:
  mutable std::mutex mu_;
  Histogram ttft_, tpot_;
};

}  // namespace minfer::server
