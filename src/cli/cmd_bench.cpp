// minfer bench -m FILE [-p 512] [-n 128] [-d 0,4096,16384] [--batch 1,8,32,64] [-r 5]
//              [-o md|json|csv] [--census] [--timeline FILE.csv] [--sweep FILE.csv]
// llama-bench's table (model, size, params, backend, test, t/s median ± sd of the reps) plus the share of the
// memory roofline: bytes one decode step reads (weights once, plus every sequence's KV) / the
// device-to-device copy rate measured here. --batch B runs B sequences decoding together
// ("tg128 x32": aggregate t/s of all B, and the time of one step).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <sstream>

#include "cli/command.h"
#include "cli/common.h"
#include "engine/engine.h"
#include "gguf/gguf.h"
#include "util/error.h"
#include "util/files.h"
#ifdef MINFER_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_timeline.h"
#endif

namespace minfer::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct Row {
  std::string test;
  int depth = 0;
  bool is_tg = false;
  int n = 0;
  int batch = 1;
  std::vector<double> tps;
  double mean() const {
    double s = 0;
    for (double v : tps) s += v;
    return s / double(tps.size());
  }
  double median() const {
    std::vector<double> v = tps;
    std::sort(v.begin(), v.end());
    const size_t h = v.size() / 2;
    return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
  }
  double sd() const {
    if (tps.size() < 2) return 0;
    const double m = mean();
    double s = 0;
    for (double v : tps) s += (v - m) * (v - m);
    return std::sqrt(s / double(tps.size() - 1));
  }
};

// "512,4096": token counts, each a decimal integer in [0, 2^30] (far above any context length).
std::vector<int> parse_counts(const std::string& list, const char* flag) {
  constexpr int kMaxCount = 1 << 30;
  std::vector<int> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    int n = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), n);
    if (ec != std::errc() || end != item.data() + item.size() || n < 0 || n > kMaxCount)
      fail(flag, " ", gguf::quoted(item, 40), ": token counts must be integers in [0, ", kMaxCount, "]");
    out.push_back(n);
  }
  return out;
}

std::string file_type_label(const Model& m) {
  switch (m.file.get_int("general.file_type", -1)) {
    case 0: return "F32";
    case 1: return "F16";
    case 7: return "Q8_0";
    case 15: return "Q4_K - Medium";
    case 17: return "Q5_K - Medium";
    case 18: return "Q6_K";
    case 32: return "BF16";
    default: return "?";
  }
}

std::string params_label(int64_t n) {
  char buf[32];
  if (n >= 1000000000)
    std::snprintf(buf, sizeof buf, "%.0fB", double(n) / 1e9);
  else
    std::snprintf(buf, sizeof buf, "%.0fM", double(n) / 1e6);
  return buf;
}

// Runs the tests on one engine: a base sequence filled to the depth once, forks of it for each
// repetition (the depth's blocks shared copy-on-write, as a prefix cache would share them).
class Bench {
 public:
  Bench(Engine& engine, uint64_t seed)
      : engine_(engine), base_(engine.kv()), step_(engine), fed_step_(engine), rng_(seed) {}

  std::vector<int32_t> tokens(int n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = int32_t(rng_() % uint64_t(engine_.model().hp.n_vocab));
    return t;
  }
  void fill_depth(int depth) {
    base_.release();
    if (depth > 0) prompt(base_, tokens(depth));
  }
  // Prompt processing of n tokens after the depth, in steps of max_tokens; returns seconds.
  double prompt(int n) {
    KvPool::Sequence seq = base_.fork(base_.n_tokens());
    const auto t = tokens(n);
    const auto t0 = Clock::now();
    prompt(seq, t);
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }
  // n greedy decode steps of `batch` sequences after the depth; returns seconds. Each step is
  // submitted fed by the one before (Step::submit_after), as greedy generation runs, unless
  // MINFER_NO_FED_STEPS=1: then each step's tokens come back to the host before the next is built.
  double generate(int n, int batch) {
    std::vector<KvPool::Sequence> seqs;
    for (int b = 0; b < batch; ++b) seqs.push_back(base_.fork(base_.n_tokens()));
    std::vector<int32_t> next = tokens(batch);
    int filled = 0, taken = 0;
    const auto add_tokens = [&](Step& step) {
      step.clear();
      for (int b = 0; b < batch; ++b)
        if (step.add(seqs[size_t(b)], std::span<const int32_t>(&next[size_t(b)], 1), true, Step::Output::Last, false) < 0)
          fail("no room for ", batch, " sequences at depth ", base_.n_tokens() + filled,
               " (KV pool of ", engine_.kv().n_blocks(), " blocks)");
      ++filled;
    };
    const auto take_tokens = [&](const Step& step) {
      for (int b = 0; b < batch; ++b) next[size_t(b)] = step.argmax(b)[0];
      return ++taken < n;
    };
    const auto t0 = Clock::now();
    if (fed_steps_ && n > 0) {
      run_fed_steps(engine_, step_, fed_step_, add_tokens, [&] { return filled < n; }, take_tokens);
    } else {
      for (int i = 0; i < n; ++i) {
        add_tokens(step_);
        step_.run();
        take_tokens(step_);
      }
    }
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }

 private:
  void prompt(KvPool::Sequence& seq, const std::vector<int32_t>& t) {
    const int chunk = engine_.max_tokens();
    for (size_t b = 0; b < t.size(); b += size_t(chunk)) {
      const size_t m = std::min(t.size() - b, size_t(chunk));
      step_.clear();
      const bool last = b + m == t.size();
      if (step_.add(seq, std::span<const int32_t>(t).subspan(b, m), false,
                    last ? Step::Output::Last : Step::Output::None, false) < 0)
        fail("the KV pool has no room for the prompt");
      step_.run();
    }
  }

  Engine& engine_;
  KvPool::Sequence base_;
  Step step_, fed_step_;
  const bool fed_steps_ = fed_steps_enabled();
  std::mt19937_64 rng_;
};

void write_sweep(const std::string& csv_path, const std::vector<Row>& rows, const std::string& title) {
  std::vector<const Row*> tg;
  for (const Row& r : rows)
    if (r.is_tg && r.batch == 1) tg.push_back(&r);
  std::ostringstream csv;
  csv << "depth,tg_tokens,tps_median,tps_sd\n";
  for (const Row* r : tg) csv << r->depth << "," << r->n << "," << r->median() << "," << r->sd() << "\n";
  std::string svg_path = csv_path;
  const size_t dot = svg_path.rfind('.');
  svg_path = (dot == std::string::npos ? svg_path : svg_path.substr(0, dot)) + ".svg";
  std::ostringstream svg;
  const double W = 640, H = 400, L = 60, R = 20, T = 40, B = 50;
  double max_d = 1, max_t = 1;
  for (const Row* r : tg) {
    max_d = std::max(max_d, double(r->depth));
    max_t = std::max(max_t, r->median() * 1.1);
  }
  auto X = [&](double d) { return L + (W - L - R) * d / max_d; };
  auto Y = [&](double t) { return H - B - (H - T - B) * t / max_t; };
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H
      << "' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' fill='white'/>\n"
      << "<text x='" << W / 2 << "' y='20' text-anchor='middle'>" << title << ": decode t/s vs depth</text>\n"
      << "<line x1='" << L << "' y1='" << H - B << "' x2='" << W - R << "' y2='" << H - B << "' stroke='black'/>\n"
      << "<line x1='" << L << "' y1='" << T << "' x2='" << L << "' y2='" << H - B << "' stroke='black'/>\n"
      << "<text x='" << W / 2 << "' y='" << H - 10 << "' text-anchor='middle'>depth (tokens in the KV cache)</text>\n"
      << "<text x='15' y='" << H / 2 << "' transform='rotate(-90 15 " << H / 2 << ")' text-anchor='middle'>tokens/s</text>\n";
  for (int i = 0; i <= 4; ++i) {
    const double t = max_t * i / 4, d = max_d * i / 4;
    svg << "<text x='" << L - 5 << "' y='" << Y(t) + 4 << "' text-anchor='end'>" << int(t) << "</text>\n"
        << "<text x='" << X(d) << "' y='" << H - B + 16 << "' text-anchor='middle'>" << int(d) << "</text>\n";
  }
  svg << "<polyline fill='none' stroke='steelblue' stroke-width='2' points='";
  for (const Row* r : tg) svg << X(r->depth) << "," << Y(r->median()) << " ";
  svg << "'/>\n";
  for (const Row* r : tg)
    svg << "<circle cx='" << X(r->depth) << "' cy='" << Y(r->median()) << "' r='3' fill='steelblue'/>\n";
  svg << "</svg>\n";
  for (const auto& [path, text] : {std::pair{csv_path, csv.str()}, std::pair{svg_path, svg.str()}}) {
    OutputFile out(path);
    out.write(text);
    out.commit();
  }
  std::fprintf(stderr, "bench: wrote %s and %s\n", csv_path.c_str(), svg_path.c_str());
}

int run_bench(int argc, char** argv) {
  CLI::App app{"Throughput of prompt processing (pp) and generation (tg), llama-bench style"};
  std::string model_path, p_list = "512", n_list = "128", d_list = "0", b_list = "1", output = "md", sweep,
              backend_name = "auto", timeline;
  int reps = 5, ubatch = 4096, block_size = kDefaultKvBlockSize;
  bool census = false, step_phases = false;
  app.add_option("-m,--model", model_path, "GGUF model (default: the embedded default model)");
  app.add_option("-p,--n-prompt", p_list, "prompt lengths, comma separated (0: none)");
  app.add_option("-n,--n-gen", n_list, "generation lengths, comma separated (0: none)");
  app.add_option("-d,--n-depth", d_list, "KV-cache depths to run each test at, comma separated");
  app.add_option("--batch", b_list, "sequences decoding together in the tg tests, comma separated");
  app.add_option("-r,--repetitions", reps, "repetitions of each test")->check(CLI::Range(1, 1000));
  app.add_option("-o,--output", output, "md | json | csv")->check(CLI::IsMember({"md", "json", "csv"}));
  app.add_option("-b,-u,--ubatch-size", ubatch, "prompt tokens per forward step")
      ->capture_default_str()
      ->check(CLI::Range(1, 65536));
  app.add_option("--kv-block-size", block_size, "KV positions per cache block")->check(CLI::Range(1, 4096));
  app.add_option("--backend", backend_name, "cuda | cpu | auto");
  app.add_flag("--step-phases", step_phases,
               "also split each tg row's device time a step into uploads, launches and copies back (CUDA; two "
               "more events a step)");
  app.add_flag("--census", census, "list the kernels of one decode step of the first batch size and one prompt step of the first -p length (CUDA)");
  app.add_option("--timeline", timeline,
                 "time every CTA of one decode step of the first batch size inside its CUDA graph; a table per "
                 "launch class, one line per launch into this CSV and one per CTA into FILE.ctas.csv (a build "
                 "configured with -DMINFER_TIMELINE=ON)");
  app.add_option("--sweep", sweep, "write tg t/s against depth to this CSV and an SVG beside it");
  CLI11_PARSE(app, argc, argv);
  const std::vector<int> ps = parse_counts(p_list, "-p"), ns = parse_counts(n_list, "-n"),
                         ds = parse_counts(d_list, "-d"), bs = parse_counts(b_list, "--batch");
  if (ds.empty()) fail("-d needs at least one depth");
  if (bs.empty()) fail("--batch needs at least one batch size");
#ifdef MINFER_HAVE_CUDA
  if (!timeline.empty() && !cuda::kTimelineBuilt)
    fail("--timeline needs a build configured with -DMINFER_TIMELINE=ON (its kernels carry the probes)");
#else
  if (step_phases) fail("--step-phases needs a build with CUDA");
  if (!timeline.empty()) fail("--timeline needs a build with CUDA");
  if (census) fail("--census needs a build with CUDA");
#endif
  for (int b : bs)
    if (b <= 0) fail("--batch ", b, ": a batch size must be positive");

  const auto t_load = Clock::now();
  const Model model = Model::load(resolve_model_path(model_path));
  // Every test runs at its depth: the deepest one needs that many positions plus its own tokens.
  const int64_t max_depth = *std::max_element(ds.begin(), ds.end());
  int64_t longest_test = 0;
  for (const std::vector<int>* tests : {&ps, &ns})
    for (int n : *tests) longest_test = std::max<int64_t>(longest_test, n);
  if (max_depth + longest_test > model.hp.n_ctx_train)
    fail("depth ", max_depth, " + a test of ", longest_test, " tokens = ", max_depth + longest_test,
         " positions, more than this model's context length ", model.hp.n_ctx_train, "; lower -d, -p or -n");
  int max_p = 0, max_n = 1, max_d = 0, max_b = 1;
  for (int p : ps) max_p = std::max(max_p, p);
  for (int n : ns) max_n = std::max(max_n, n);
  for (int d : ds) max_d = std::max(max_d, d);
  for (int b : bs) max_b = std::max(max_b, b);
  // Blocks for the depth (shared), and for every test's own positions past it.
  const auto blocks = [&](int n) { return (n + block_size - 1) / block_size + 1; };
  EngineOptions eo;
  eo.backend = parse_backend_kind(backend_name);
  // Steps as long as the longest prompt or depth needs (up to -b), or the widest batch; each
  // sequence of a step has one output row.
  eo.max_tokens = std::max(std::min(ubatch, std::max({max_p, max_d, 1})), max_b);
  eo.max_outputs = max_b;
  eo.block_size = block_size;
  eo.n_blocks = blocks(max_d) + std::max(blocks(max_p), max_b * blocks(max_n));
  eo.memory_hint = "lower -d, -p, -n or --batch";
  Engine engine(model, eo);
  const double ready_s = std::chrono::duration<double>(Clock::now() - t_load).count();
  const bool use_cuda = engine.backend_name() == "cuda";
  // Before the measurements, which another backend would run to their end first.
  if (!timeline.empty() && !use_cuda) fail("--timeline needs the CUDA backend");
  if (census && !use_cuda) fail("--census needs the CUDA backend");
  if (step_phases && !use_cuda) fail("--step-phases needs the CUDA backend");

  double copy_rate = 0;
  std::string device = "cpu";
#ifdef MINFER_HAVE_CUDA
  if (use_cuda) {
    copy_rate = cuda::measure_copy_bandwidth();
    device = cuda::device_name();
    static_cast<cuda::CudaBackend&>(engine.backend()).split_step_times(step_phases);
    const auto& st = static_cast<cuda::CudaBackend&>(engine.backend()).load_stats();
    std::fprintf(stderr,
                 "bench: %s ready in %.2f s (weights %.2f GB uploaded in %.2f s = %.1f GB/s; KV %.2f GB; "
                 "workspace %.2f GB); copy rate %.0f GB/s\n",
                 device.c_str(), ready_s, double(st.weight_bytes) / 1e9, st.upload_seconds,
                 double(st.weight_bytes) / 1e9 / std::max(st.upload_seconds, 1e-9), double(st.kv_bytes) / 1e9,
                 double(st.workspace_bytes) / 1e9, copy_rate / 1e9);
  }
#endif
  const double weight_bytes = double(model.bytes_read_per_token());
  // K and V of one position, every layer, as the GPU stores them (f16).
  const double kv_bytes_per_position = 2.0 * 2.0 * model.hp.n_layer * model.hp.n_head_kv * model.hp.head_dim;

  Bench bench(engine, 1234);
  std::vector<Row> rows;
  for (int d : ds) {
    bench.fill_depth(d);
    const std::string at = d > 0 ? " @ d" + std::to_string(d) : "";
    for (int p : ps) {
      if (p <= 0) continue;
      Row r{"pp" + std::to_string(p) + at, d, false, p, 1, {}};
      bench.prompt(p);  // warm-up
      for (int i = 0; i < reps; ++i) r.tps.push_back(p / bench.prompt(p));
      rows.push_back(r);
      std::fprintf(stderr, "bench: %-20s %10.2f t/s\n", r.test.c_str(), r.median());
    }
    for (int n : ns) {
      if (n <= 0) continue;
      for (int b : bs) {
        Row r{"tg" + std::to_string(n) + (b > 1 ? " x" + std::to_string(b) : "") + at, d, true, n, b, {}};
        bench.generate(std::min(n, 8), b);  // warm-up (captures the decode graph)
#ifdef MINFER_HAVE_CUDA
        if (use_cuda) static_cast<cuda::CudaBackend&>(engine.backend()).reset_step_times();
#endif
        for (int i = 0; i < reps; ++i) r.tps.push_back(double(n) * b / bench.generate(n, b));
        rows.push_back(r);
        std::fprintf(stderr, "bench: %-20s %10.2f t/s", r.test.c_str(), r.median());
#ifdef MINFER_HAVE_CUDA
        // How much of the wall time the device computes: the rest is the host between steps.
        if (use_cuda) {
          const cuda::StepTimes& st = static_cast<cuda::CudaBackend&>(engine.backend()).step_times();
          const int counted = std::max(st.steps, 1);
          std::fprintf(stderr, " (a step: device %.3f ms, idle before it %.1f us)",
                       1e3 * st.device_seconds / counted, 1e6 * st.idle_seconds / std::max(st.steps - 1, 1));
          if (st.split_steps > 0)
            std::fprintf(stderr, " (device: uploads %.1f us, launches %.3f ms, copies back %.1f us)",
                         1e6 * st.upload_seconds / st.split_steps, 1e3 * st.launch_seconds / st.split_steps,
                         1e6 * st.copy_back_seconds / st.split_steps);
        }
#endif
        std::fprintf(stderr, "\n");
      }
    }
  }

  const std::string model_label =
      model.hp.arch_name + " " + params_label(model.n_params()) + " " + file_type_label(model);
  char size_label[32], params_buf[32];
  std::snprintf(size_label, sizeof size_label, "%.2f GiB", double(model.file.file_size()) / (1 << 30));
  std::snprintf(params_buf, sizeof params_buf, "%.2f B", double(model.n_params()) / 1e9);
  const std::string backend_label = use_cuda ? "CUDA" : "CPU";
  // Seconds one decode step takes, and the share of the copy rate its bytes would need.
  const auto step_ms = [](const Row& r) { return 1e3 * r.batch / r.median(); };
  const auto roofline_share = [&](const Row& r) {
    const double kv = r.batch * kv_bytes_per_position * (r.depth + r.n / 2.0);
    return (weight_bytes + kv) / copy_rate / (step_ms(r) * 1e-3);
  };
  auto step_label = [&](const Row& r) -> std::string {
    if (!r.is_tg) return "";
    char b[32];
    std::snprintf(b, sizeof b, "%.3f", step_ms(r));
    return b;
  };
  auto roofline = [&](const Row& r) -> std::string {
    if (!r.is_tg || copy_rate <= 0) return "";
    char b[32];
    std::snprintf(b, sizeof b, "%.1f%%", 100.0 * roofline_share(r));
    return b;
  };
  if (output == "md") {
    std::printf("| model | size | params | backend | test | t/s (median ± sd) | step ms | roofline |\n");
    std::printf("| --- | ---: | ---: | --- | --- | ---: | ---: | ---: |\n");
    for (const Row& r : rows)
      std::printf("| %s | %s | %s | %s | %s | %.2f ± %.2f | %s | %s |\n", model_label.c_str(), size_label,
                  params_buf, backend_label.c_str(), r.test.c_str(), r.median(), r.sd(),
                  step_label(r).c_str(), roofline(r).c_str());
    if (copy_rate > 0)
      std::printf("\nroofline: %.3f GB of weights per step + %.0f KB of KV per position and sequence, "
                  "at the %.0f GB/s device copy rate (one sequence at depth 0: %.1f t/s); ready in %.2f s\n",
                  weight_bytes / 1e9, kv_bytes_per_position / 1e3, copy_rate / 1e9, copy_rate / weight_bytes, ready_s);
  } else if (output == "csv") {
    std::printf("model,size_bytes,params,backend,test,depth,batch,tps_median,tps_mean,tps_sd,roofline_share\n");
    for (const Row& r : rows)
      std::printf("\"%s\",%llu,%lld,%s,%s,%d,%d,%.3f,%.3f,%.3f,%s\n", model_label.c_str(),
                  (unsigned long long)model.file.file_size(), (long long)model.n_params(),
                  backend_label.c_str(), r.test.c_str(), r.depth, r.batch, r.median(), r.mean(), r.sd(),
                  r.is_tg && copy_rate > 0 ? std::to_string(roofline_share(r)).c_str() : "");
  } else {
    std::printf("[\n");
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::printf("  {\"model\": \"%s\", \"size\": %llu, \"params\": %lld, \"backend\": \"%s\", "
                  "\"test\": \"%s\", \"depth\": %d, \"batch\": %d, \"median_ts\": %.3f, \"avg_ts\": %.3f, \"stddev_ts\": %.3f, "
                  "\"roofline_share\": %s, \"copy_rate_bytes_per_s\": %.0f}%s\n",
                  model_label.c_str(), (unsigned long long)model.file.file_size(),
                  (long long)model.n_params(), backend_label.c_str(), r.test.c_str(), r.depth, r.batch,
                  r.median(), r.mean(), r.sd(),
                  r.is_tg && copy_rate > 0 ? std::to_string(roofline_share(r)).c_str() : "null",
                  copy_rate, i + 1 < rows.size() ? "," : "");
    }
    std::printf("]\n");
  }
  if (!sweep.empty()) write_sweep(sweep, rows, model_label);

#ifdef MINFER_HAVE_CUDA
  if (!timeline.empty()) {
    auto& cb = static_cast<cuda::CudaBackend&>(engine.backend());
    bench.fill_depth(ds.front());
    bench.generate(2, bs.front());  // captures both step buffers' graphs (fed steps alternate) and warms up
    cb.timeline_next_step();
    bench.generate(1, bs.front());
    const TimelineSummary& t = cb.timeline_result();
    std::printf("\n### decode step x%d @ d%d inside its graph (the probes' build)\n\n%s", bs.front(), ds.front(),
                timeline_table(t).c_str());
    for (const auto& [path, text] : {std::pair{timeline, timeline_csv(t)},
                                     std::pair{timeline + ".ctas.csv", timeline_cta_csv(t)}}) {
      OutputFile out(path);
      out.write(text);
      out.commit();
    }
  }

  if (census) {
    auto& cb = static_cast<cuda::CudaBackend&>(engine.backend());
    bench.fill_depth(ds.front());
    // Runs one step twice (the first warms up) and lists the kernels of the second.
    const auto list_kernels = [&](const std::string& title, const std::function<void()>& one_step) {
      for (int pass = 0; pass < 2; ++pass) {
        cb.census_next_step();
        one_step();
      }
      const auto kernels = cb.census_result();
      double total = 0;
      int launches = 0;
      for (const auto& k : kernels) total += k.microseconds, launches += k.launches;
      // What a kernel must move at least (weights; the attention's K and V) against the copy rate.
      const auto moved = [&](int64_t bytes, double us) -> std::string {
        if (bytes <= 0 || us <= 0 || copy_rate <= 0) return "| | ";
        char b[64];
        std::snprintf(b, sizeof b, "| %.1f | %.1f%% ", double(bytes) / 1e6, 100.0 * double(bytes) / (us * 1e-6) / copy_rate);
        return b;
      };
      int64_t total_bytes = 0;
      for (const auto& k : kernels) total_bytes += k.bytes;
      std::printf("\n| kernel (%s) | launches | µs | share | MB | of the copy rate |\n"
                  "| --- | ---: | ---: | ---: | ---: | ---: |\n",
                  title.c_str());
      for (const auto& k : kernels)
        std::printf("| %s | %d | %.1f | %.1f%% %s|\n", k.name.c_str(), k.launches, k.microseconds,
                    100.0 * k.microseconds / total, moved(k.bytes, k.microseconds).c_str());
      std::printf("| total | %d | %.1f | 100%% %s|\n", launches, total, moved(total_bytes, total).c_str());
    };
    const std::string at = " @ d" + std::to_string(ds.front());
    list_kernels("decode step x" + std::to_string(bs.front()) + at, [&] { bench.generate(1, bs.front()); });
    const auto first_p = std::find_if(ps.begin(), ps.end(), [](int p) { return p > 0; });
    if (first_p != ps.end()) {
      const int tokens = std::min(*first_p, engine.max_tokens());
      list_kernels("prompt step of " + std::to_string(tokens) + " tokens" + at, [&] { bench.prompt(tokens); });
    }
  }
#endif
  return 0;
}

const Register reg("bench", "prompt / generation throughput (llama-bench columns)", run_bench);

}  // namespace
}  // namespace minfer::cli
