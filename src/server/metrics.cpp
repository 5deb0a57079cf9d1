#include "server/metrics.h"

#include <charconv>

namespace minfer::server {

namespace {

// The shortest text that reads back as the same double ("0.025", not "0.025000000000000001").
std::string number(double v) {
  char buf[32];
  return std::string(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
}

void header(std::string& out, const std::string& name, const char* type, const std::string& help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void sample(std::string& out, const std::string& name, const char* type, const std::string& help, double value) {
  header(out, name, type, help);
  out += name + " " + number(value) + "\n";
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  size_t b = 0;
  while (b < bounds_.size() && value > bounds_[b]) ++b;
  ++counts_[b];
  sum_ += value;
  ++count_;
}

void Histogram::write(std::string& out, const std::string& name, const std::string& help) const {
  header(out, name, "histogram", help);
  uint64_t cumulative = 0;
  for (size_t b = 0; b <= bounds_.size(); ++b) {
    cumulative += counts_[b];
    const std::string le = b < bounds_.size() ? number(bounds_[b]) : "+Inf";
    out += name + "_bucket{le=\"" + le + "\"} " + std::to_string(cumulative) + "\n";
  }
  out += name + "_sum " + number(sum_) + "\n";
  out += name + "_count " + std::to_string(count_) + "\n";
}

// vLLM's buckets, so dashboards made for it read these too.
ServerMetrics::ServerMetrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0}),
      tpot_({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5}) {}

void ServerMetrics::observe_first_token(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.observe(seconds);
}

void ServerMetrics::observe_time_per_output_token(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  tpot_.observe(seconds);
}

std::string ServerMetrics::prometheus_text(const SchedulerCounts& c) const {
  std::string out;
  sample(out, "minfer_requests_running", "gauge", "Sequences generating (one per choice).", c.running);
  sample(out, "minfer_requests_waiting", "gauge", "Sequences waiting to start or to resume after a preemption.", c.waiting);
  sample(out, "minfer_kv_blocks_used", "gauge", "KV blocks held by live requests.", c.kv_used);
  sample(out, "minfer_kv_blocks_cached", "gauge", "KV blocks holding cached prompt prefixes that no request holds (reusable, evicted when needed).", c.kv_cached);
  sample(out, "minfer_kv_blocks_total", "gauge", "KV blocks in the pool.", c.kv_total);
  sample(out, "minfer_prompt_tokens_total", "counter", "Prompt tokens of requests that produced a first token.", double(c.prompt_tokens));
  sample(out, "minfer_generated_tokens_total", "counter", "Tokens generated.", double(c.generated_tokens));
  sample(out, "minfer_prefix_cache_hit_tokens_total", "counter", "Prompt positions taken from the prefix cache instead of computed.", double(c.prefix_hit_tokens));
  sample(out, "minfer_preemptions_total", "counter", "Sequences preempted when KV blocks ran out.", double(c.preemptions));
  const auto by_kind = [&](const std::string& name, const char* help, auto field) {
    header(out, name, "counter", help);
    out += name + "{kind=\"decode\"} " + number(double(c.decode_steps.*field)) + "\n";
    out += name + "{kind=\"prompt\"} " + number(double(c.prompt_steps.*field)) + "\n";
  };
  by_kind("minfer_steps_total", "Engine steps: decode tokens only, or carrying prompt tokens.", &StepTimes::steps);
  by_kind("minfer_step_seconds_total", "Wall time of the engine steps, host work included.", &StepTimes::seconds);
  by_kind("minfer_step_forward_seconds_total", "Time of the steps' forward passes (launches, device work, outputs' download).",
          &StepTimes::forward_seconds);
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.write(out, "minfer_time_to_first_token_seconds", "Time from a request's arrival to its first generated token.");
  tpot_.write(out, "minfer_time_per_output_token_seconds", "Time per generated token after the first, per request.");
  return out;
}

}  // namespace minfer::server
