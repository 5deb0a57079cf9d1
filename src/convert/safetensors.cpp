#include "convert/safetensors.h"

#include <cstring>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "tokenizer/hf_import.h"
#include "util/error.h"
#include "util/half.h"

namespace minfer::convert {

namespace fs = std::filesystem;
using nlohmann::json;

int64_t StTensor::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void StTensor::read_floats(int64_t first, int64_t n, float* dst) const {
  switch (dtype) {
    case StDtype::F32:
      std::memcpy(dst, data + first * 4, size_t(n) * 4);
      return;
    case StDtype::F16:
    case StDtype::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, data + (first + i) * 2, 2);
        dst[i] = dtype == StDtype::F16 ? f16_to_f32(h) : bf16_to_f32(h);
      }
      return;
  }
}

namespace {

StDtype parse_dtype(const std::string& s, const std::string& where) {
  if (s == "F32") return StDtype::F32;
  if (s == "F16") return StDtype::F16;
  if (s == "BF16") return StDtype::BF16;
  fail(where, ": unsupported dtype ", s, " (supported: F32, F16, BF16)");
}

int dtype_size(StDtype d) { return d == StDtype::F32 ? 4 : 2; }

}  // namespace

void Checkpoint::add_file(const std::string& path) {
  Mapping m = map_file(path);
  if (m.size < 8) fail(path, ": ", m.size, " bytes is too short for a safetensors file");
  uint64_t header_len;
  std::memcpy(&header_len, m.data, 8);
  if (header_len > m.size - 8)
    fail(path, ": header length ", header_len, " exceeds the file size ", m.size);
  json header;
  try {
    header = json::parse(m.data + 8, m.data + 8 + header_len);
  } catch (const json::exception& e) {
    fail(path, ": invalid JSON header: ", e.what());
  }
  if (!header.is_object()) fail(path, ": the header is not a JSON object");
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = m.size - data_start;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = path + ": tensor " + name;
    try {
      StTensor t;
      t.name = name;
      t.file = path;
      t.dtype = parse_dtype(info.at("dtype").get<std::string>(), where);
      t.shape = info.at("shape").get<std::vector<int64_t>>();
      const auto offsets = info.at("data_offsets").get<std::vector<uint64_t>>();
      if (offsets.size() != 2 || offsets[0] > offsets[1] || offsets[1] > data_size)
        fail(where, ": data_offsets out of the data section (", data_size, " bytes)");
      uint64_t n = 1;
      for (int64_t d : t.shape) {
        if (d < 0) fail(where, ": negative dimension ", d);
        n *= uint64_t(d);
      }
      t.nbytes = offsets[1] - offsets[0];
      if (t.nbytes != n * uint64_t(dtype_size(t.dtype)))
        fail(where, ": ", t.nbytes, " data bytes do not match its shape (", n, " elements)");
      t.data = m.data + data_start + offsets[0];
      if (tensors_.count(name)) fail(where, ": appears in more than one file");
      tensors_.emplace(name, std::move(t));
    } catch (const json::exception& e) {
      fail(where, ": malformed entry: ", e.what());
    }
  }
  mappings_.push_back(std::move(m));
  files_.push_back(path);
}

Checkpoint Checkpoint::open(const std::string& dir) {
  Checkpoint c;
  c.dir_ = dir;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    const json j = read_json_file(index.string());
    c.files_.push_back(index.string());
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      fail(index.string(), ": no weight_map object");
    std::set<std::string> shards;
    for (const auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string()) fail(index.string(), ": weight_map entry ", name, " is not a file name");
      shards.insert(file.get<std::string>());
    }
    for (const auto& s : shards) {
      if (s.find('/') != std::string::npos || s.find("..") != std::string::npos)
        fail(index.string(), ": shard name ", s, " must be a plain file name");
      c.add_file((fs::path(dir) / s).string());
    }
    for (const auto& [name, file] : j["weight_map"].items())
      if (!c.find(name)) fail(index.string(), ": tensor ", name, " is listed but not in shard ", file.get<std::string>());
  } else if (fs::exists(fs::path(dir) / "model.safetensors")) {
    c.add_file((fs::path(dir) / "model.safetensors").string());
  } else {
    fail(dir, ": no model.safetensors or model.safetensors.index.json");
  }
  return c;
}

const StTensor* Checkpoint::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const StTensor& Checkpoint::get(const std::string& name) const {
  if (const StTensor* t = find(name)) return *t;
  fail(dir_, ": the checkpoint has no tensor ", name);
}

}  // namespace minfer::convert
