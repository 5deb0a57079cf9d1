// GGUF v2/v3 reader (mmap, fully validated) and writer.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "quant/types.h"

namespace minfer::gguf {

enum class ValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
const char* value_type_name(ValueType t);
// A string from an untrusted file made safe to print: quoted, escaped, cut after `max_chars` bytes.
std::string quoted(std::string_view s, size_t max_chars = 80);

// A metadata value. Scalars live in one of i/u/f/b/s by type; arrays keep their element type and
// the elements in `array` (strings arrays are common and large: tokens, merges).
struct Value {
  ValueType type = ValueType::UINT32;
  uint64_t u = 0;        // UINT8/16/32/64
  int64_t i = 0;         // INT8/16/32/64
  double f = 0;          // FLOAT32/64
  bool b = false;        // BOOL
  std::string s;         // STRING
  ValueType array_type = ValueType::UINT8;
  std::vector<Value> array;

  // Typed accessors: convert between numeric kinds, throw minfer::Error on a kind mismatch.
  int64_t as_int() const;
  double as_float() const;
  bool as_bool() const;
  const std::string& as_string() const;
  std::vector<std::string> as_strings() const;
  std::vector<int64_t> as_ints() const;
  std::vector<float> as_floats() const;

  static Value from_u32(uint32_t v);
  static Value from_i32(int32_t v);
  static Value from_u64(uint64_t v);
  static Value from_f32(float v);
  static Value from_bool(bool v);
  static Value from_string(std::string v);
  static Value from_strings(const std::vector<std::string>& v);
  static Value from_i32s(const std::vector<int32_t>& v);
  static Value from_f32s(const std::vector<float>& v);
  static Value from_i64(int64_t v);
  static Value from_f64(double v);
  // Any element type, including ARRAY for nested arrays; every element must have `elem_type`.
  static Value from_array(ValueType elem_type, std::vector<Value> elems);
};

struct TensorInfo {
  std::string name;
  GgmlType type = GgmlType::F32;
  std::vector<int64_t> shape;  // GGUF order: shape[0] is the contiguous (row) dimension
  uint64_t offset = 0;         // relative to the data section
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;  // into the mapping (reader only)

  int64_t n_elements() const;
  int64_t rows() const { return n_elements() / (shape.empty() ? 1 : shape[0]); }
};

// A mapped, validated GGUF file. Every failure throws minfer::Error naming the file, the item
// and the numbers involved.
class File {
 public:
  static File open(const std::string& path);
  // Parse from memory (the fuzzer and tests use this); `name` appears in error messages.
  static File parse(std::shared_ptr<const std::vector<uint8_t>> bytes, const std::string& name);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::vector<std::pair<std::string, Value>>& metadata() const { return kv_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }

  const Value* find(std::string_view key) const;
  const TensorInfo* find_tensor(std::string_view name) const;
  // Required lookups: throw "FILE: missing metadata key KEY".
  const Value& get(std::string_view key) const;
  int64_t get_int(std::string_view key, std::optional<int64_t> def = std::nullopt) const;
  double get_float(std::string_view key, std::optional<double> def = std::nullopt) const;
  std::string get_string(std::string_view key, std::optional<std::string> def = std::nullopt) const;

  const uint8_t* data_begin() const { return base_ + data_offset_; }
  uint64_t file_size() const { return size_; }

 private:
  void load();  // parses and validates base_[0, size_)

  std::string path_;
  uint32_t version_ = 3;
  uint64_t alignment_ = 32;
  std::vector<std::pair<std::string, Value>> kv_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> kv_index_, tensor_index_;
  std::shared_ptr<const void> storage_;  // the mapping or the byte vector
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  uint64_t data_offset_ = 0;
};

// Streaming writer: metadata and tensor infos first, then tensor data in declaration order, so a
// multi-GB model never has to be held in memory. The bytes go to a temporary file beside `path`
// that finish() renames over it (util/files.h OutputFile): until then `path` is untouched, and a
// writer destroyed unfinished leaves nothing behind. Usage:
//   Writer w(path); w.set(...); w.add_tensor(name, type, shape); ... w.begin_data();
//   for each tensor in order: w.write_tensor_data(name, bytes, n); w.finish();
class Writer {
 public:
  explicit Writer(std::string path, uint64_t alignment = 32);
  ~Writer();
  void set(const std::string& key, Value v);  // replaces an existing key, keeps order
  void add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> shape);
  void begin_data();  // creates the temporary file; writes header, metadata and tensor infos
  void write_tensor_data(const std::string& name, const void* data, uint64_t nbytes);
  void finish();      // checks every tensor was written, flushes, renames over `path`
  uint64_t total_bytes() const;  // file size once finished (valid after all add_tensor calls)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace minfer::gguf
