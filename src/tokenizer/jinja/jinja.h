// A Jinja2 subset interpreter for chat templates. It follows Python Jinja2 as transformers
// configures it (trim_blocks, lstrip_blocks, loopcontrols, no autoescape) so that rendered prompts
// are byte-identical: Python's str()/repr() for printed values, json.dumps for tojson, Python
// string methods, Jinja2's scoping (for-loops and macros get their own scope; namespace() objects
// are the way out).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "util/error.h"

namespace minfer::jinja {

// Limits that keep an untrusted template (it comes from a model file) from hanging the process or
// exhausting memory. Each one ends the parse or render with a TemplateError that names it.
// Real chat templates stay far below them: a 1,000-message conversation with tools renders in
// well under 1% of the step budget.
inline constexpr size_t kMaxTemplateBytes = size_t(1) << 20;  // template source
inline constexpr uint64_t kMaxRenderSteps = 10'000'000;      // work units of one render (budget.h)
inline constexpr size_t kMaxRenderBytes = size_t(16) << 20;   // the output, and any string built
inline constexpr size_t kMaxSequence = 1'000'000;             // range() and list lengths
inline constexpr int kMaxMacroDepth = 256;                    // nested macro calls
inline constexpr int kMaxValueNesting = 100;                  // lists/dicts in lists/dicts, when stored

// Parse errors ("line L, column C: ...") and runtime errors ("line L: ...").
class TemplateError : public Error {
 public:
  using Error::Error;
};

// raise_exception(msg) called by the template: message() is the template's own text.
class TemplateRaised : public TemplateError {
 public:
  explicit TemplateRaised(std::string message)
      : TemplateError("chat template raised an exception: " + message), message_(std::move(message)) {}
  const std::string& message() const { return message_; }

 private:
  std::string message_;
};

struct Value;
struct Object;
struct Function;
// A Python list, or a tuple (from items(), tuple literals): they differ only in how they print.
struct Array : std::vector<Value> {
  using std::vector<Value>::vector;
  bool is_tuple = false;
};

struct Undefined {
  std::string name;  // what was looked up, for error messages
};
struct None {};

// Strings are immutable and shared, as in Python: copying a value (a variable read, a loop
// binding, a list element) costs the same whatever its length, so that the step budget
// (budget.h) measures the work a template does.
using SharedString = std::shared_ptr<const std::string>;

struct Value {
  using Storage = std::variant<Undefined, None, bool, int64_t, double, SharedString,
                               std::shared_ptr<Array>, std::shared_ptr<Object>,
                               std::shared_ptr<Function>>;
  Storage v;

  Value() = default;
  Value(Undefined u) : v(std::move(u)) {}
  Value(None n) : v(n) {}
  Value(bool b) : v(b) {}
  Value(int i) : v(int64_t{i}) {}
  Value(int64_t i) : v(i) {}
  Value(double d) : v(d) {}
  Value(std::string s) : v(std::make_shared<const std::string>(std::move(s))) {}
  Value(const char* s) : Value(std::string(s)) {}
  Value(Array a) : v(std::make_shared<Array>(std::move(a))) {}
  Value(std::shared_ptr<Array> a) : v(std::move(a)) {}
  Value(std::shared_ptr<Object> o) : v(std::move(o)) {}
  Value(std::shared_ptr<Function> f) : v(std::move(f)) {}

  bool is_undefined() const { return std::holds_alternative<Undefined>(v); }
  bool is_none() const { return std::holds_alternative<None>(v); }
  bool is_bool() const { return std::holds_alternative<bool>(v); }
  bool is_int() const { return std::holds_alternative<int64_t>(v); }
  bool is_float() const { return std::holds_alternative<double>(v); }
  bool is_number() const { return is_int() || is_float() || is_bool(); }  // Python: bool is an int
  bool is_string() const { return std::holds_alternative<SharedString>(v); }
  bool is_array() const { return std::holds_alternative<std::shared_ptr<Array>>(v); }
  bool is_object() const { return std::holds_alternative<std::shared_ptr<Object>>(v); }
  bool is_dict() const;  // an object with dict semantics (not a namespace / loop)
  bool is_function() const { return std::holds_alternative<std::shared_ptr<Function>>(v); }

  const std::string& str() const { return *std::get<SharedString>(v); }
  Array& array() const { return *std::get<std::shared_ptr<Array>>(v); }
  Object& object() const { return *std::get<std::shared_ptr<Object>>(v); }
  Function& function() const { return *std::get<std::shared_ptr<Function>>(v); }
  double as_double() const;  // int, float or bool
};

struct Object {
  enum class Kind { Dict, Namespace, Attributes };  // Attributes: loop and other plain records
  Kind kind = Kind::Dict;
  std::vector<std::pair<std::string, Value>> entries;  // insertion order, like Python dicts

  explicit Object(Kind k = Kind::Dict) : kind(k) {}
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value value);
};

inline Value make_dict() { return Value(std::make_shared<Object>()); }

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

struct Function {
  std::string name;
  std::function<Value(CallArgs&)> call;
};

// Python semantics shared by the interpreter and its users.
bool truthy(const Value& v);
std::string to_str(const Value& v);  // str(): what {{ v }} prints
std::string repr(const Value& v);    // repr(): how values print inside lists and dicts
// json.dumps(v, ensure_ascii=False, indent=indent, sort_keys=False); indent < 0: one line.
std::string to_json(const Value& v, int indent = -1);
std::string type_name(const Value& v);  // Python's name: str, int, list, dict, NoneType, ...

using Context = std::vector<std::pair<std::string, Value>>;

class Template {
 public:
  // Throws TemplateError naming the line and column of the first syntax error.
  static Template parse(std::string_view source);
  // Globals range, dict, namespace, raise_exception and strftime_now are always present;
  // context entries override them. max_steps: the step budget (lower only to fail faster, as the
  // fuzzer does).
  std::string render(const Context& context, uint64_t max_steps = kMaxRenderSteps) const;

  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;
};

}  // namespace minfer::jinja
