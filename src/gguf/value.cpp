#include <cstdio>
#include <limits>

#include "gguf/format.h"
#include "gguf/gguf.h"
#include "util/error.h"

namespace minfer::gguf {

using format::is_float;
using format::is_signed;
using format::is_unsigned;

const char* value_type_name(ValueType t) {
  switch (t) {
    case ValueType::UINT8: return "uint8";
    case ValueType::INT8: return "int8";
    case ValueType::UINT16: return "uint16";
    case ValueType::INT16: return "int16";
    case ValueType::UINT32: return "uint32";
    case ValueType::INT32: return "int32";
    case ValueType::FLOAT32: return "float32";
    case ValueType::BOOL: return "bool";
    case ValueType::STRING: return "string";
    case ValueType::ARRAY: return "array";
    case ValueType::UINT64: return "uint64";
    case ValueType::INT64: return "int64";
    case ValueType::FLOAT64: return "float64";
  }
  return "unknown";
}

std::string quoted(std::string_view s, size_t max_chars) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i == max_chars) {
      out += str_cat("\"... (", s.size(), " bytes)");
      return out;
    }
    const unsigned char c = s[i];
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += char(c);  // UTF-8 passes through unchanged
    }
  }
  return out + "\"";
}

int64_t Value::as_int() const {
  if (is_unsigned(type)) {
    if (u > uint64_t(std::numeric_limits<int64_t>::max()))
      fail("uint64 value ", u, " does not fit in int64");
    return int64_t(u);
  }
  if (is_signed(type)) return i;
  if (type == ValueType::BOOL) return b ? 1 : 0;
  fail("expected an integer, found a value of type ", value_type_name(type));
}

double Value::as_float() const {
  if (is_float(type)) return f;
  if (is_unsigned(type)) return double(u);
  if (is_signed(type)) return double(i);
  fail("expected a number, found a value of type ", value_type_name(type));
}

bool Value::as_bool() const {
  if (type != ValueType::BOOL) fail("expected a bool, found a value of type ", value_type_name(type));
  return b;
}

const std::string& Value::as_string() const {
  if (type != ValueType::STRING) fail("expected a string, found a value of type ", value_type_name(type));
  return s;
}

namespace {
void require_array_of(const Value& v, const char* wanted, bool (*ok)(ValueType)) {
  if (v.type != ValueType::ARRAY) fail("expected an array of ", wanted, ", found a value of type ", value_type_name(v.type));
  if (!ok(v.array_type))
    fail("expected an array of ", wanted, ", found an array of ", value_type_name(v.array_type));
}
}  // namespace

std::vector<std::string> Value::as_strings() const {
  require_array_of(*this, "strings", [](ValueType t) { return t == ValueType::STRING; });
  std::vector<std::string> out;
  out.reserve(array.size());
  for (const Value& e : array) out.push_back(e.s);
  return out;
}

std::vector<int64_t> Value::as_ints() const {
  require_array_of(*this, "integers",
                   [](ValueType t) { return is_unsigned(t) || is_signed(t) || t == ValueType::BOOL; });
  std::vector<int64_t> out;
  out.reserve(array.size());
  for (const Value& e : array) out.push_back(e.as_int());
  return out;
}

std::vector<float> Value::as_floats() const {
  require_array_of(*this, "numbers", [](ValueType t) { return is_unsigned(t) || is_signed(t) || is_float(t); });
  std::vector<float> out;
  out.reserve(array.size());
  for (const Value& e : array) out.push_back(float(e.as_float()));
  return out;
}

Value Value::from_u32(uint32_t v) { Value r; r.type = ValueType::UINT32; r.u = v; return r; }
Value Value::from_i32(int32_t v) { Value r; r.type = ValueType::INT32; r.i = v; return r; }
Value Value::from_u64(uint64_t v) { Value r; r.type = ValueType::UINT64; r.u = v; return r; }
Value Value::from_i64(int64_t v) { Value r; r.type = ValueType::INT64; r.i = v; return r; }
Value Value::from_f32(float v) { Value r; r.type = ValueType::FLOAT32; r.f = v; return r; }
Value Value::from_f64(double v) { Value r; r.type = ValueType::FLOAT64; r.f = v; return r; }
Value Value::from_bool(bool v) { Value r; r.type = ValueType::BOOL; r.b = v; return r; }
Value Value::from_string(std::string v) { Value r; r.type = ValueType::STRING; r.s = std::move(v); return r; }

Value Value::from_array(ValueType elem_type, std::vector<Value> elems) {
  for (size_t k = 0; k < elems.size(); ++k)
    if (elems[k].type != elem_type)
      fail("array element ", k, " has type ", value_type_name(elems[k].type), " but the array holds ",
           value_type_name(elem_type));
  Value r;
  r.type = ValueType::ARRAY;
  r.array_type = elem_type;
  r.array = std::move(elems);
  return r;
}

template <typename T, typename Make>
static Value array_of(ValueType elem_type, const std::vector<T>& v, Make make) {
  std::vector<Value> elems;
  elems.reserve(v.size());
  for (const T& x : v) elems.push_back(make(x));
  return Value::from_array(elem_type, std::move(elems));
}

Value Value::from_strings(const std::vector<std::string>& v) { return array_of(ValueType::STRING, v, from_string); }
Value Value::from_i32s(const std::vector<int32_t>& v) { return array_of(ValueType::INT32, v, from_i32); }
Value Value::from_f32s(const std::vector<float>& v) { return array_of(ValueType::FLOAT32, v, from_f32); }

int64_t TensorInfo::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // the reader and writer reject shapes whose product overflows
  return n;
}

}  // namespace minfer::gguf
