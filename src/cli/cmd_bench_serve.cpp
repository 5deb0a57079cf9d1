// `minfer bench-serve`: a load generator for any OpenAI-compatible server (minfer serve,
// llama-server, vLLM), reporting as vLLM's benchmark_serving does. For each concurrency level, that
// many client threads (each with its own keep-alive connection, opened by a GET /v1/models) send
// streamed /v1/completions requests back to back until the level's request count is reached.
// TTFT: request sent -> first text chunk; TPOT: (latency - TTFT) / (output tokens - 1); ITL: every
// gap between text chunks, pooled; output throughput: generated tokens / the level's wall time.
#include <CLI/CLI.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cli/command.h"
#include "util/error.h"

namespace minfer::cli {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

struct Target {
  std::string origin;  // scheme://host:port
  std::string prefix;  // path before /v1, usually ""
  std::string api_key;
};

Target parse_url(std::string url, std::string api_key) {
  const size_t scheme_end = url.find("://");
  if (scheme_end == std::string::npos) fail("--url ", url, " needs a scheme (http://host:port)");
  const size_t path_start = url.find('/', scheme_end + 3);
  Target t{url.substr(0, path_start), path_start == std::string::npos ? "" : url.substr(path_start), std::move(api_key)};
  while (!t.prefix.empty() && t.prefix.back() == '/') t.prefix.pop_back();
  if (t.prefix.size() >= 3 && t.prefix.compare(t.prefix.size() - 3, 3, "/v1") == 0) t.prefix.resize(t.prefix.size() - 3);
  return t;
}

std::unique_ptr<httplib::Client> connect(const Target& t) {
  auto c = std::make_unique<httplib::Client>(t.origin);
  c->set_tcp_nodelay(true);
  c->set_keep_alive(true);
  c->set_connection_timeout(10);
  c->set_read_timeout(600);
  c->set_write_timeout(60);
  if (!t.api_key.empty()) c->set_bearer_token_auth(t.api_key);
  return c;
}

// Opens a client's keep-alive connection with a request that is safe to repeat (GET /v1/models),
// so that a generation request is only ever sent on a connection the server has accepted and
// answered. A server whose accept queue overflows answers with SYN cookies; when the first
// segment of a request is dropped there, the next fails the cookie check and the connection is
// reset: that costs a retry here instead of a failed request.
// Later requests reuse the connection; httplib checks it before sending and reconnects when the
// server has closed it (its keep-alive timeout), so a request is never sent on a closed one.
void open_connection(httplib::Client& c, const Target& t) {
  for (int attempt = 0; attempt < 3; ++attempt)
    if (c.Get(t.prefix + "/v1/models")) return;  // any HTTP answer: the connection is up
}

// Words that are one token each in common BPE vocabularies (with their leading space).
const char* const kWords[] = {
    "the", "of", "and", "to", "in", "is", "was", "he", "for", "it", "with", "as", "his", "on", "be", "at", "by",
    "had", "are", "but", "from", "or", "have", "an", "they", "which", "one", "you", "were", "her", "all", "she",
    "there", "would", "their", "we", "him", "been", "has", "when", "who", "will", "more", "no", "if", "out", "so",
    "said", "what", "up", "its", "about", "into", "than", "them", "can", "only", "other", "new", "some", "could",
    "time", "these", "two", "may", "then", "do", "first", "any", "my", "now", "such", "like", "our", "over", "man",
    "me", "even", "most", "made", "after", "also", "did", "many", "before", "must", "through", "back", "years",
    "where", "much", "your", "way", "well", "down", "should", "because", "each", "just", "those", "people", "how",
    "too", "little", "state", "good", "very", "make", "world", "still", "own", "see", "men", "work", "long", "get",
    "here", "between", "both", "life", "being", "under", "never", "day", "same", "another", "know", "while", "last",
    "might", "us", "great", "old", "year", "off", "come", "since", "against", "go", "came", "right", "used", "take",
    "three", "light", "water", "land", "house", "earth", "king", "city", "word", "heart", "hand", "name", "night"};

std::string random_prompt(int n_words, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s;
  for (int i = 0; i < n_words; ++i) {
    if (i) s += ' ';
    s += kWords[rng() % (sizeof kWords / sizeof kWords[0])];
  }
  return s;
}

struct Options {
  std::string model;
  int prompt_words = 0;
  int max_tokens = 128;
  bool ignore_eos = true;
  uint64_t seed = 0;
  double temperature = 0.0;  // > 0: the server samples (with its other defaults: OpenAI's)
};

struct RequestResult {
  bool ok = false;
  std::string error;
  int prompt_tokens = 0, output_tokens = 0;
  double ttft = 0, latency = 0;  // seconds
  std::vector<double> itl;       // seconds between text chunks
};

// Reads an SSE stream as it arrives: the time of every event that carries text, and the usage.
class SseReader {
 public:
  explicit SseReader(Clock::time_point sent) : sent_(sent) {}
  bool feed(const char* data, size_t n) {
    buffer_.append(data, n);
    size_t end;
    while ((end = buffer_.find("\n\n")) != std::string::npos) {
      event(std::string_view(buffer_).substr(0, end));
      buffer_.erase(0, end + 2);
    }
    return true;
  }
  void finish(RequestResult& r) const {
    r.ok = done_ && !chunk_times_.empty();
    if (!r.ok) r.error = done_ ? "no text in the stream" : "the stream ended before [DONE]";
    if (!chunk_times_.empty()) r.ttft = chunk_times_.front();
    for (size_t i = 1; i < chunk_times_.size(); ++i) r.itl.push_back(chunk_times_[i] - chunk_times_[i - 1]);
    r.output_tokens = output_tokens_ > 0 ? output_tokens_ : int(chunk_times_.size());
    r.prompt_tokens = prompt_tokens_;
  }

 private:
  // Only the usage chunk is parsed as JSON; a text chunk is recognised by a non-empty string value
  // of "text" (completions) or "content" (chat).
  void event(std::string_view e) {
    while (!e.empty() && (e.back() == '\r')) e.remove_suffix(1);
    if (e.substr(0, 6) != "data: ") return;
    const std::string_view data = e.substr(6);
    if (data == "[DONE]") {
      done_ = true;
      return;
    }
    if (has_text(data, "\"text\"") || has_text(data, "\"content\"")) {
      chunk_times_.push_back(std::chrono::duration<double>(Clock::now() - sent_).count());
    }
    if (data.find("\"usage\"") != std::string_view::npos) {
      const json j = json::parse(data, nullptr, false);
      if (j.is_object() && j.contains("usage") && j["usage"].is_object()) {
        output_tokens_ = j["usage"].value("completion_tokens", 0);
        prompt_tokens_ = j["usage"].value("prompt_tokens", 0);
      }
    }
  }
  static bool has_text(std::string_view data, std::string_view key) {
    const size_t at = data.find(key);
    if (at == std::string_view::npos) return false;
    size_t i = at + key.size();
    while (i < data.size() && (data[i] == ' ' || data[i] == ':')) ++i;
    return i + 1 < data.size() && data[i] == '"' && data[i + 1] != '"';
  }

  Clock::time_point sent_;
  std::string buffer_;
  std::vector<double> chunk_times_;
  int output_tokens_ = 0, prompt_tokens_ = 0;
  bool done_ = false;
};

RequestResult send_request(httplib::Client& client, const Target& t, const Options& o, const std::string& prompt,
                           int max_tokens) {
  json body = {{"model", o.model}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", o.temperature},
               {"stream", true}, {"stream_options", {{"include_usage", true}}}};
  if (o.ignore_eos) body["ignore_eos"] = true;
  httplib::Request req;
  req.method = "POST";
  req.path = t.prefix + "/v1/completions";
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  req.body = body.dump();
  RequestResult r;
  const auto sent = Clock::now();
  SseReader reader(sent);
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    return reader.feed(data, n);
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool sent_ok = client.send(req, res, err);
  r.latency = std::chrono::duration<double>(Clock::now() - sent).count();
  if (!sent_ok) {
    r.error = httplib::to_string(err);
    return r;
  }
  if (res.status != 200) {
    r.error = str_cat("HTTP ", res.status);
    return r;
  }
  reader.finish(r);
  return r;
}

std::string model_name(const Target& t) {
  auto client = connect(t);
  const auto res = client->Get(t.prefix + "/v1/models");
  if (!res) fail("cannot reach ", t.origin, ": ", httplib::to_string(res.error()));
  if (res->status != 200) fail(t.origin, t.prefix, "/v1/models answered HTTP ", res->status, ": ", res->body);
  const json j = json::parse(res->body, nullptr, false);
  if (!j.is_object() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() || !j["data"][0].contains("id"))
    fail(t.origin, t.prefix, "/v1/models did not list a model");
  return j["data"][0]["id"].get<std::string>();
}

struct Stats {
  double mean = 0, median = 0, p99 = 0;
};

Stats stats_ms(std::vector<double> v) {
  Stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  const auto pct = [&](double p) {  // linear interpolation, as numpy.percentile
    const double pos = p / 100.0 * double(v.size() - 1);
    const size_t lo = size_t(pos);
    const size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (pos - double(lo));
  };
  return {1000 * sum / double(v.size()), 1000 * pct(50), 1000 * pct(99)};
}

struct LevelResult {
  int concurrency = 0, requests = 0, failed = 0;
  double duration = 0;
  int64_t input_tokens = 0, output_tokens = 0;
  Stats ttft, tpot, itl, e2el;
  std::vector<std::string> errors;
};

// Request i of a level sends the prompt of seed first_seed + i; levels get disjoint seed ranges so
// that no prompt is answered from the prefix cache another level left behind.
LevelResult run_level(const Target& t, const Options& o, int concurrency, int n_requests, uint64_t first_seed) {
  std::vector<RequestResult> results(static_cast<size_t>(n_requests));
  std::atomic<int> next{0};
  const auto start = Clock::now();
  std::vector<std::thread> clients;
  for (int c = 0; c < concurrency; ++c)
    clients.emplace_back([&] {
      auto client = connect(t);
      open_connection(*client, t);
      for (int i; (i = next++) < n_requests;)
        results[size_t(i)] = send_request(*client, t, o, random_prompt(o.prompt_words, first_seed + uint64_t(i)), o.max_tokens);
    });
  for (auto& th : clients) th.join();
  LevelResult L;
  L.concurrency = concurrency;
  L.requests = n_requests;
  L.duration = std::chrono::duration<double>(Clock::now() - start).count();
  std::vector<double> ttft, tpot, itl, e2el;
  for (const RequestResult& r : results) {
    if (!r.ok) {
      ++L.failed;
      if (L.errors.size() < 5) L.errors.push_back(r.error);
      continue;
    }
    L.input_tokens += r.prompt_tokens;
    L.output_tokens += r.output_tokens;
    ttft.push_back(r.ttft);
    e2el.push_back(r.latency);
    if (r.output_tokens > 1) tpot.push_back((r.latency - r.ttft) / (r.output_tokens - 1));
    itl.insert(itl.end(), r.itl.begin(), r.itl.end());
  }
  L.ttft = stats_ms(ttft);
  L.tpot = stats_ms(tpot);
  L.itl = stats_ms(itl);
  L.e2el = stats_ms(e2el);
  return L;
}

void print_level(const LevelResult& L) {
  const auto row = [](const char* name, double v) { std::printf("%-40s %-10.2f\n", name, v); };
  const auto block = [&](const char* title, const char* abbr, const Stats& s) {
    std::printf("%s\n", title);
    row(str_cat("Mean ", abbr, " (ms):").c_str(), s.mean);
    row(str_cat("Median ", abbr, " (ms):").c_str(), s.median);
    row(str_cat("P99 ", abbr, " (ms):").c_str(), s.p99);
  };
  std::printf("============ Serving Benchmark Result (concurrency %d) ============\n", L.concurrency);
  std::printf("%-40s %-10d\n%-40s %-10d\n", "Successful requests:", L.requests - L.failed, "Failed requests:", L.failed);
  row("Benchmark duration (s):", L.duration);
  std::printf("%-40s %-10lld\n%-40s %-10lld\n", "Total input tokens:", (long long)L.input_tokens,
              "Total generated tokens:", (long long)L.output_tokens);
  row("Request throughput (req/s):", double(L.requests - L.failed) / L.duration);
  row("Output token throughput (tok/s):", double(L.output_tokens) / L.duration);
  block("---------------Time to First Token----------------", "TTFT", L.ttft);
  block("-----Time per Output Token (excl. 1st token)------", "TPOT", L.tpot);
  block("---------------Inter-token Latency----------------", "ITL", L.itl);
  block("----------------End-to-end Latency----------------", "E2EL", L.e2el);
  for (const std::string& e : L.errors) std::printf("failure: %s\n", e.c_str());
  std::printf("==================================================\n\n");
  std::fflush(stdout);
}

int run_bench_serve(int argc, char** argv) {
  CLI::App app{"Load generator for OpenAI-compatible servers (vLLM benchmark_serving style)", "minfer bench-serve"};
  std::string url, api_key, concurrency_list = "1,8,32,64", json_path;
  Options o;
  int prompt_tokens = 70, requests = 0;
  bool stop_at_eos = false;
  app.add_option("--url", url, "server, e.g. http://127.0.0.1:8080")->required();
  app.add_option("--api-key", api_key, "sent as Authorization: Bearer KEY");
  app.add_option("--model", o.model, "model name to send (default: the first of /v1/models)");
  app.add_option("--concurrency", concurrency_list, "client counts to run, comma separated")->capture_default_str();
  app.add_option("--prompt-tokens", prompt_tokens, "prompt length in tokens (random words)")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--max-tokens", o.max_tokens, "tokens to generate per request")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--requests", requests, "requests per concurrency level (default: 4 per client)")->check(CLI::PositiveNumber);
  app.add_option("--seed", o.seed, "seed of the random prompts")->capture_default_str();
  app.add_option("--temperature", o.temperature, "sampling temperature sent with every request (0: greedy)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 2.0));
  app.add_flag("--stop-at-eos", stop_at_eos, "let requests end at the end-of-generation token (default: ignore_eos)");
  app.add_option("--json", json_path, "also write the results as JSON to this file");
  CLI11_PARSE(app, argc, argv);
  o.ignore_eos = !stop_at_eos;

  std::vector<int> levels;
  for (size_t pos = 0; pos <= concurrency_list.size();) {
    const size_t comma = std::min(concurrency_list.find(',', pos), concurrency_list.size());
    const std::string item = concurrency_list.substr(pos, comma - pos);
    const int c = std::atoi(item.c_str());
    if (c <= 0 || c > 4096) fail("--concurrency: '", item, "' is not a client count (1 to 4096)");
    levels.push_back(c);
    pos = comma + 1;
  }

  const Target target = parse_url(url, api_key);
  if (o.model.empty()) o.model = model_name(target);
  // Random words are about one token each; one request measures the ratio on this server.
  o.prompt_words = prompt_tokens;
  {
    auto client = connect(target);
    const RequestResult probe = send_request(*client, target, o, random_prompt(o.prompt_words, o.seed), 1);
    if (!probe.ok) fail("the warm-up request failed: ", probe.error);
    if (probe.prompt_tokens > 0)
      o.prompt_words = std::max(1, int(std::lround(double(prompt_tokens) * prompt_tokens / probe.prompt_tokens)));
  }
  std::printf("bench-serve: %s, model %s, ~%d prompt tokens (%d words), %d generated tokens%s, temperature %g\n\n",
              url.c_str(), o.model.c_str(), prompt_tokens, o.prompt_words, o.max_tokens,
              o.ignore_eos ? " (ignore_eos)" : "", o.temperature);

  std::vector<LevelResult> all;
  uint64_t first_seed = o.seed + 1;  // o.seed was the warm-up's prompt
  for (const int c : levels) {
    const int n = requests > 0 ? requests : 4 * c;
    all.push_back(run_level(target, o, c, n, first_seed));
    first_seed += uint64_t(n);
    print_level(all.back());
  }
  std::printf("| clients | requests | failed | output tok/s | TTFT mean / p50 / p99 ms | TPOT mean / p50 / p99 ms | ITL mean / p50 / p99 ms |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (const LevelResult& L : all)
    std::printf("| %d | %d | %d | %.0f | %.1f / %.1f / %.1f | %.2f / %.2f / %.2f | %.2f / %.2f / %.2f |\n", L.concurrency,
                L.requests, L.failed, double(L.output_tokens) / L.duration, L.ttft.mean, L.ttft.median, L.ttft.p99,
                L.tpot.mean, L.tpot.median, L.tpot.p99, L.itl.mean, L.itl.median, L.itl.p99);
  if (!json_path.empty()) {
    json out = json::array();
    const auto s = [](const Stats& x) { return json{{"mean_ms", x.mean}, {"median_ms", x.median}, {"p99_ms", x.p99}}; };
    for (const LevelResult& L : all)
      out.push_back({{"concurrency", L.concurrency}, {"requests", L.requests}, {"failed", L.failed},
                     {"duration_s", L.duration}, {"input_tokens", L.input_tokens}, {"output_tokens", L.output_tokens},
                     {"output_throughput", double(L.output_tokens) / L.duration}, {"ttft", s(L.ttft)},
                     {"tpot", s(L.tpot)}, {"itl", s(L.itl)}, {"e2el", s(L.e2el)}});
    std::ofstream f(json_path);
    if (!(f << out.dump(2) << "\n")) fail("cannot write ", json_path);
  }
  int failed = 0;
  for (const LevelResult& L : all) failed += L.failed;
  return failed > 0 ? 1 : 0;
}

const Register registration("bench-serve", "load-test an OpenAI-compatible server (TTFT, TPOT, ITL, tok/s)", run_bench_serve);

}  // namespace
}  // namespace minfer::cli
