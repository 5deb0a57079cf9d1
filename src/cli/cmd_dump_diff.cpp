// `minfer dump-diff A B`: compares two MINFER_DUMP directories node by node.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "cli/command.h"
#include "util/error.h"

namespace {

namespace fs = std::filesystem;

struct NodeDump {
  int64_t rows = 0, cols = 0;
  std::vector<float> data;
};

NodeDump read_dump(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) minfer::fail(path.string(), ": cannot open");
  NodeDump d;
  int64_t header[2];
  if (!in.read(reinterpret_cast<char*>(header), sizeof header))
    minfer::fail(path.string(), ": truncated header");
  d.rows = header[0];
  d.cols = header[1];
  const uint64_t file_size = fs::file_size(path);
  if (d.rows < 0 || d.cols < 0 || (d.cols > 0 && uint64_t(d.rows) > (file_size / 4) / uint64_t(d.cols)) ||
      file_size != sizeof header + uint64_t(d.rows * d.cols) * 4)
    minfer::fail(path.string(), ": header says ", d.rows, " x ", d.cols, " floats but the file has ",
                 file_size, " bytes");
  d.data.resize(size_t(d.rows * d.cols));
  in.read(reinterpret_cast<char*>(d.data.data()), std::streamsize(d.data.size() * 4));
  return d;
}

// Relative paths "stepNNNN/NNNN_name.bin" of every dumped node, in execution order.
std::set<std::string> list_dumps(const fs::path& dir) {
  if (!fs::is_directory(dir)) minfer::fail(dir.string(), ": not a directory");
  std::set<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".bin")
      out.insert(fs::relative(e.path(), dir).string());
  return out;
}

int run_dump_diff(int argc, char** argv) {
  CLI::App app{"Compare two MINFER_DUMP directories node by node", "minfer dump-diff"};
  std::string dir_a, dir_b;
  double tolerance = 0;
  app.add_option("A", dir_a, "first dump directory")->required();
  app.add_option("B", dir_b, "second dump directory")->required();
  app.add_option("--tol", tolerance, "max abs error that still counts as equal")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const std::set<std::string> a = list_dumps(dir_a), b = list_dumps(dir_b);
  std::set<std::string> all = a;
  all.insert(b.begin(), b.end());
  if (all.empty()) minfer::fail("no node dumps (*.bin) in ", dir_a, " or ", dir_b);

  std::printf("%-44s %12s %12s %12s\n", "node", "shape", "max_abs", "max_rel");
  bool first_diff_seen = false;
  int n_differ = 0, n_missing = 0;
  for (const std::string& name : all) {
    if (!a.count(name) || !b.count(name)) {
      std::printf("%-44s only in %s\n", name.c_str(), a.count(name) ? "A" : "B");
      ++n_missing;
      continue;
    }
    const NodeDump x = read_dump(fs::path(dir_a) / name), y = read_dump(fs::path(dir_b) / name);
    const std::string shape = std::to_string(x.rows) + "x" + std::to_string(x.cols);
    if (x.rows != y.rows || x.cols != y.cols) {
      std::printf("%-44s %12s shape differs: B is %lldx%lld\n", name.c_str(), shape.c_str(),
                  (long long)y.rows, (long long)y.cols);
      ++n_differ;
      continue;
    }
    // max_rel: the largest difference relative to the node's largest magnitude in A, so that
    // values near zero do not blow it up.
    double max_abs = 0, max_mag = 0;
    for (size_t i = 0; i < x.data.size(); ++i) {
      const double diff = std::fabs(double(x.data[i]) - double(y.data[i]));
      max_abs = std::max(max_abs, std::isnan(diff) ? INFINITY : diff);
      max_mag = std::max(max_mag, std::fabs(double(x.data[i])));
    }
    const double max_rel = max_mag > 0 ? max_abs / max_mag : max_abs;
    const bool differs = max_abs > tolerance;
    const char* mark = differs && !first_diff_seen ? "  <== first difference" : "";
    first_diff_seen |= differs;
    n_differ += differs;
    std::printf("%-44s %12s %12.4g %12.4g%s\n", name.c_str(), shape.c_str(), max_abs, max_rel, mark);
  }
  std::printf("%zu nodes compared: %d differ beyond %g, %d present on one side only\n", all.size(),
              n_differ, tolerance, n_missing);
  return n_differ + n_missing == 0 ? 0 : 1;
}

const minfer::cli::Register registration("dump-diff", "compare two MINFER_DUMP directories node by node",
                                         run_dump_diff);

}  // namespace
