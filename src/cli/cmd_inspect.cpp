// `minfer inspect FILE`: metadata (long arrays summarised), tensor table, totals per type.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <map>
#include <string>

#include "cli/command.h"
#include "gguf/gguf.h"
#include "util/error.h"

namespace {

using minfer::gguf::Value;
using minfer::gguf::ValueType;
using minfer::gguf::quoted;

// Shortest text that reads back as the stored value, at the stored precision.
std::string shortest(const Value& v) {
  char buf[64];
  const auto res = v.type == ValueType::FLOAT32 ? std::to_chars(buf, buf + sizeof buf, float(v.f))
                                                : std::to_chars(buf, buf + sizeof buf, v.f);
  return std::string(buf, res.ptr);
}

std::string format_value(const Value& v, size_t max_items) {
  switch (v.type) {
    case ValueType::STRING: return quoted(v.s, 200);
    case ValueType::BOOL: return v.b ? "true" : "false";
    case ValueType::FLOAT32: case ValueType::FLOAT64: return shortest(v);
    case ValueType::UINT8: case ValueType::UINT16: case ValueType::UINT32: case ValueType::UINT64:
      return std::to_string(v.u);
    case ValueType::INT8: case ValueType::INT16: case ValueType::INT32: case ValueType::INT64:
      return std::to_string(v.i);
    case ValueType::ARRAY: break;
  }
  std::string out = "[";
  const bool summarised = v.array.size() > max_items;
  if (summarised) {
    const char* elem = v.array_type == ValueType::STRING ? "strings"
                       : v.array_type == ValueType::ARRAY ? "arrays" : minfer::gguf::value_type_name(v.array_type);
    out += minfer::str_cat(v.array.size(), " ", elem, ": ");
  }
  const size_t shown = std::min(v.array.size(), summarised ? std::min<size_t>(max_items, 3) : max_items);
  for (size_t k = 0; k < shown; ++k) {
    if (k) out += ", ";
    out += v.array[k].type == ValueType::STRING ? quoted(v.array[k].s, 40) : format_value(v.array[k], max_items);
  }
  if (summarised) out += ", ...";
  return out + "]";
}

std::string type_label(const Value& v) {
  if (v.type != ValueType::ARRAY) return minfer::gguf::value_type_name(v.type);
  return minfer::str_cat(minfer::gguf::value_type_name(v.array_type), "[]");
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t d = 0; d < shape.size(); ++d) out += (d ? ", " : "") + std::to_string(shape[d]);
  return out + "]";
}

int run_inspect(int argc, char** argv) {
  CLI::App app{"Print a GGUF file's metadata, tensor table and totals per tensor type", "minfer inspect"};
  std::string path;
  size_t max_items = 8;
  app.add_option("FILE", path, "GGUF file")->required();
  app.add_option("--array-items", max_items, "arrays longer than this are summarised")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const auto file = minfer::gguf::File::open(path);
  std::printf("%s: GGUF v%u, %llu bytes, alignment %llu, %zu metadata keys, %zu tensors\n", path.c_str(),
              file.version(), (unsigned long long)file.file_size(), (unsigned long long)file.alignment(),
              file.metadata().size(), file.tensors().size());

  size_t key_width = 0, type_width = 0;
  for (const auto& [key, value] : file.metadata()) {
    key_width = std::max(key_width, std::min<size_t>(key.size(), 48));
    type_width = std::max(type_width, type_label(value).size());
  }
  std::printf("\nmetadata:\n");
  for (const auto& [key, value] : file.metadata())
    std::printf("  %-*s  %-*s  %s\n", int(key_width), key.c_str(), int(type_width), type_label(value).c_str(),
                format_value(value, max_items).c_str());

  if (file.tensors().empty()) return 0;
  size_t name_width = 4, shape_width = 5;
  for (const auto& t : file.tensors()) {
    name_width = std::max(name_width, t.name.size());
    shape_width = std::max(shape_width, shape_text(t.shape).size());
  }
  struct Total { uint64_t count = 0, bytes = 0; };
  std::map<std::string, Total> per_type;
  Total all;
  uint64_t params = 0;
  std::printf("\ntensors:\n  %-*s  %-7s  %-*s  %14s\n", int(name_width), "name", "type", int(shape_width), "shape",
              "bytes");
  for (const auto& t : file.tensors()) {
    const char* type = minfer::type_traits(t.type).name;
    std::printf("  %-*s  %-7s  %-*s  %14llu\n", int(name_width), t.name.c_str(), type, int(shape_width),
                shape_text(t.shape).c_str(), (unsigned long long)t.nbytes);
    per_type[type].count++;
    per_type[type].bytes += t.nbytes;
    all.count++;
    all.bytes += t.nbytes;
    params += uint64_t(t.n_elements());
  }
  std::printf("\ntotals per type:\n");
  for (const auto& [type, total] : per_type)
    std::printf("  %-7s  %6llu tensors  %14llu bytes\n", type.c_str(), (unsigned long long)total.count,
                (unsigned long long)total.bytes);
  std::printf("\ntotal: %llu tensors, %llu parameters, %llu bytes (%.2f MiB, %.3f bits per parameter)\n",
              (unsigned long long)all.count, (unsigned long long)params, (unsigned long long)all.bytes,
              double(all.bytes) / (1024.0 * 1024.0), 8.0 * double(all.bytes) / double(params));
  return 0;
}

const minfer::cli::Register registration("inspect", "print a GGUF file's metadata and tensor table", run_inspect);

}  // namespace
