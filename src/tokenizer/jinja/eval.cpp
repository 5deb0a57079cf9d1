// Evaluation: expressions with Python semantics, statements with Jinja2 scoping, plus the
// globals (range, dict, namespace, raise_exception, strftime_now) and object methods.
#include <algorithm>
#include <cmath>
#include <ctime>
#include <limits>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/budget.h"
#include "tokenizer/jinja/pystr.h"

namespace minfer::jinja {
namespace detail {

namespace {

[[noreturn]] void type_fail(const std::string& message) { throw TemplateError(message); }

bool nests_deeper_than(const Value& v, int levels) {
  if (!v.is_array() && !v.is_object()) return false;
  if (levels == 0) return true;
  charge(1);
  if (v.is_array()) {
    for (const Value& item : v.array())
      if (nests_deeper_than(item, levels - 1)) return true;
  } else {
    for (const auto& [_, item] : v.object().entries)
      if (nests_deeper_than(item, levels - 1)) return true;
  }
  return false;
}

// Checked wherever a value is stored (set, a namespace attribute, a macro argument), because only
// stored values can be wrapped again and again: {% set ns.x = [ns.x] %} in a loop would build a
// value deep enough to overflow the stack when it is printed, compared or destroyed, and
// {% set ns.self = ns %} one that contains itself.
void check_nesting(const Value& v) {
  if (nests_deeper_than(v, kMaxValueNesting))
    type_fail(str_cat("value nested deeper than ", kMaxValueNesting, " levels (or containing itself)"));
}

// Python ints are unbounded; ours are 64-bit, so a result that does not fit is an error, never
// a wrapped value (or undefined behaviour).
[[noreturn]] void overflow_fail() { type_fail("integer result does not fit in 64 bits"); }

[[noreturn]] void undefined_fail(const Value& v) {
  const auto& u = std::get<Undefined>(v.v);
  type_fail(u.name.empty() ? "value is undefined" : u.name);
}

int64_t to_int(const Value& v, const char* what) {
  if (v.is_int()) return std::get<int64_t>(v.v);
  if (v.is_bool()) return std::get<bool>(v.v);
  type_fail(str_cat(what, " must be an integer, not ", type_name(v)));
}

const Value* arg(CallArgs& a, size_t index, std::string_view name) {
  if (index < a.positional.size()) return &a.positional[index];
  for (auto& [k, v] : a.keyword)
    if (k == name) return &v;
  return nullptr;
}

Value arg_or(CallArgs& a, size_t index, std::string_view name, Value fallback) {
  const Value* v = arg(a, index, name);
  return v ? *v : std::move(fallback);
}

std::optional<std::string> opt_string(CallArgs& a, size_t index, std::string_view name) {
  const Value* v = arg(a, index, name);
  if (!v || v->is_none()) return std::nullopt;
  if (!v->is_string()) type_fail(str_cat("argument '", name, "' must be a string, not ", type_name(*v)));
  return v->str();
}

std::string need_string(const Value& v, const char* what) {
  if (!v.is_string()) type_fail(str_cat(what, " must be a string, not ", type_name(v)));
  return v.str();
}

Value make_function(std::string name, std::function<Value(CallArgs&)> fn) {
  return Value(std::make_shared<Function>(Function{std::move(name), std::move(fn)}));
}

Array string_chars(const std::string& s) {
  Array out;
  const std::u32string chars = pystr::decode(s);
  charge(chars.size());
  for (char32_t c : chars) out.emplace_back(pystr::encode(std::u32string_view(&c, 1)));
  return out;
}

// What `for x in v` iterates: a snapshot, as Python would see it.
Array iterate(const Value& v) {
  if (v.is_undefined()) return {};
  if (v.is_array()) {
    charge(v.array().size());
    return v.array();
  }
  if (v.is_string()) return string_chars(v.str());
  if (v.is_dict()) {
    charge(v.object().entries.size());
    Array keys;
    for (auto& [k, _] : v.object().entries) keys.emplace_back(k);
    return keys;
  }
  type_fail("'" + type_name(v) + "' object is not iterable");
}

bool equals(const Value& a, const Value& b) {
  charge(1);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return to_int(a, "") == to_int(b, "");
  }
  if (a.v.index() != b.v.index()) return false;
  if (a.is_undefined() || a.is_none()) return true;
  if (a.is_string()) {
    charge_bytes(std::min(a.str().size(), b.str().size()));
    return a.str() == b.str();
  }
  if (a.is_array()) {
    const Array &x = a.array(), &y = b.array();
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (!equals(x[i], y[i])) return false;
    return true;
  }
  if (a.is_object()) {
    const Object &x = a.object(), &y = b.object();
    if (&x == &y) return true;
    if (x.kind != Object::Kind::Dict || y.kind != Object::Kind::Dict) return false;
    if (x.entries.size() != y.entries.size()) return false;
    for (auto& [k, v] : x.entries) {
      const Value* other = y.find(k);
      if (!other || !equals(v, *other)) return false;
    }
    return true;
  }
  return &a.function() == &b.function();
}

bool less(const Value& a, const Value& b) {
  charge(1);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    return to_int(a, "") < to_int(b, "");
  }
  if (a.is_string() && b.is_string()) {
    charge_bytes(std::min(a.str().size(), b.str().size()));
    return a.str() < b.str();
  }
  if (a.is_array() && b.is_array()) {
    const Array &x = a.array(), &y = b.array();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equals(x[i], y[i])) return less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  type_fail("'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
}

bool contains(const Value& container, const Value& needle) {
  if (container.is_string()) {
    if (!needle.is_string())
      type_fail("'in <string>' requires string as left operand, not " + type_name(needle));
    charge_bytes(container.str().size());
    return container.str().find(needle.str()) != std::string::npos;
  }
  if (container.is_dict()) return needle.is_string() && container.object().find(needle.str());
  if (container.is_object()) type_fail("argument of type '" + type_name(container) + "' is not iterable");
  for (auto& item : iterate(container))
    if (equals(item, needle)) return true;
  return false;
}

Value call_method(const Value& self, const std::string& name, CallArgs& a);

bool is_dict_method(const std::string& name) {
  static const char* names[] = {"items", "keys", "values", "get", "copy", "pop", "update",
                                "setdefault", "clear", "popitem", "fromkeys"};
  return std::any_of(std::begin(names), std::end(names), [&](const char* n) { return name == n; });
}

bool is_str_method(const std::string& name) {
  static const char* names[] = {"startswith", "endswith", "strip", "lstrip", "rstrip", "split",
                                "rsplit", "replace", "upper", "lower", "title", "capitalize",
                                "find", "rfind", "count", "index", "join", "isdigit", "isalpha",
                                "isalnum", "isspace", "islower", "isupper", "splitlines",
                                "removeprefix", "removesuffix", "format"};
  return std::any_of(std::begin(names), std::end(names), [&](const char* n) { return name == n; });
}

Value bound_method(const Value& self, const std::string& name) {
  return make_function(name, [self, name](CallArgs& a) { return call_method(self, name, a); });
}

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) undefined_fail(obj);
  if (obj.is_dict()) {
    if (is_dict_method(name)) return bound_method(obj, name);
    if (const Value* v = obj.object().find(name)) return *v;
    return Undefined{"'dict object' has no attribute '" + name + "'"};
  }
  if (obj.is_object()) {
    if (const Value* v = obj.object().find(name)) return *v;
    return Undefined{"'" + type_name(obj) + "' object has no attribute '" + name + "'"};
  }
  if ((obj.is_string() && is_str_method(name)) || (obj.is_array() && (name == "index" || name == "count")))
    return bound_method(obj, name);
  return Undefined{"'" + type_name(obj) + " object' has no attribute '" + name + "'"};
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) undefined_fail(obj);
  if (obj.is_object()) {
    if (key.is_string()) {
      if (const Value* v = obj.object().find(key.str())) return *v;
      if (obj.is_dict() && is_dict_method(key.str())) return bound_method(obj, key.str());
    }
    return Undefined{"'" + type_name(obj) + " object' has no attribute " + repr(key)};
  }
  if ((obj.is_array() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = to_int(key, "index");
    if (obj.is_array()) {
      int64_t n = static_cast<int64_t>(obj.array().size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Undefined{"list object has no element " + to_str(key)};
      return obj.array()[static_cast<size_t>(i)];
    }
    std::u32string u = pystr::decode(obj.str());
    int64_t n = static_cast<int64_t>(u.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Undefined{"str object has no element " + to_str(key)};
    return pystr::encode(std::u32string(1, u[static_cast<size_t>(i)]));
  }
  if (key.is_string()) return get_attr(obj, key.str());
  return Undefined{"'" + type_name(obj) + " object' has no element " + repr(key)};
}

// Follows "a.b.c" the way map(attribute=) and selectattr do.
Value get_dotted(const Value& obj, const std::string& path) {
  Value cur = obj;
  for (auto& part : pystr::split(path, std::string("."), -1)) {
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    cur = numeric ? get_item(cur, Value(static_cast<int64_t>(std::stoll(part)))) : get_item(cur, part);
    if (cur.is_undefined()) return cur;
  }
  return cur;
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) undefined_fail(a);
  if (b.is_undefined()) undefined_fail(b);
  auto bad = [&]() -> Value {
    type_fail("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
  };
  if (a.is_number() && b.is_number()) {
    bool ints = !a.is_float() && !b.is_float();
    if (ints) {
      int64_t x = to_int(a, ""), y = to_int(b, ""), r;
      const bool add = op == "+", sub = op == "-", mul = op == "*";
      if (add || sub || mul) {
        if (add ? __builtin_add_overflow(x, y, &r) : sub ? __builtin_sub_overflow(x, y, &r)
                                                         : __builtin_mul_overflow(x, y, &r))
          overflow_fail();
        return r;
      }
      if (op == "//" || op == "%") {
        if (y == 0) type_fail("integer division or modulo by zero");
        if (x == std::numeric_limits<int64_t>::min() && y == -1) overflow_fail();
        int64_t q = x / y;
        r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) {
          --q;
          r += y;
        }
        return op == "//" ? q : r;
      }
      if (op == "**" && y >= 0) {  // by squaring: y may be huge, and the result must fit
        int64_t base = x;
        r = 1;
        for (; y > 0; y >>= 1) {
          if ((y & 1) && __builtin_mul_overflow(r, base, &r)) overflow_fail();
          if (y > 1 && __builtin_mul_overflow(base, base, &base)) overflow_fail();
        }
        return r;
      }
    }
    double x = a.as_double(), y = b.as_double();
    if (op == "+") return x + y;
    if (op == "-") return x - y;
    if (op == "*") return x * y;
    if (op == "**") return std::pow(x, y);
    if (y == 0) type_fail("float division by zero");
    if (op == "/") return x / y;
    if (op == "//") return std::floor(x / y);
    if (op == "%") {
      double r = std::fmod(x, y);
      if (r != 0 && ((r < 0) != (y < 0))) r += y;
      return r;
    }
    return bad();
  }
  if (op == "+" && a.is_string() && b.is_string()) {
    check_string_size(a.str().size() + b.str().size(), "string concatenation");
    charge_bytes(a.str().size() + b.str().size());
    return a.str() + b.str();
  }
  if (op == "+" && a.is_array() && b.is_array()) {
    check_list_size(a.array().size() + b.array().size(), "list concatenation");
    charge(a.array().size() + b.array().size());
    Array out = a.array();
    out.insert(out.end(), b.array().begin(), b.array().end());
    return out;
  }
  if (op == "*" && ((a.is_string() || a.is_array()) && (b.is_int() || b.is_bool()))) {
    const size_t unit = a.is_string() ? a.str().size() : a.array().size();
    const int64_t n = unit == 0 ? 0 : std::max<int64_t>(0, to_int(b, ""));  // '' * 10**18 is ''; no loop
    uint64_t total;
    if (__builtin_mul_overflow(uint64_t(unit), uint64_t(n), &total)) total = UINT64_MAX;
    if (a.is_string()) check_string_size(total, "repetition result");
    else check_list_size(total, "repetition result");
    charge(1 + total / (a.is_string() ? kBytesPerStep : 1));
    if (a.is_string()) {
      std::string out;
      out.reserve(size_t(total));
      for (int64_t i = 0; i < n; ++i) out += a.str();
      return out;
    }
    Array out;
    out.reserve(size_t(total));
    for (int64_t i = 0; i < n; ++i) out.insert(out.end(), a.array().begin(), a.array().end());
    return out;
  }
  if (op == "*" && (a.is_int() || a.is_bool()) && (b.is_string() || b.is_array())) return arithmetic(op, b, a);
  return bad();
}

// Python's slice.indices: clamps start/stop for the given length and step sign.
std::vector<size_t> slice_indices(int64_t n, const Value& start, const Value& stop, const Value& step) {
  int64_t st = step.is_none() ? 1 : to_int(step, "slice step");
  if (st == 0) type_fail("slice step cannot be zero");
  auto adjust = [&](const Value& v, int64_t dflt) {
    if (v.is_none()) return dflt;
    int64_t i = to_int(v, "slice index");
    if (i < 0) i += n;
    if (st > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  int64_t b = adjust(start, st > 0 ? 0 : n - 1), e = adjust(stop, st > 0 ? n : -1);
  std::vector<size_t> out;
  for (int64_t i = b; st > 0 ? i < e : i > e;) {
    out.push_back(static_cast<size_t>(i));
    if (__builtin_add_overflow(i, st, &i)) break;  // a step past the end of int64 is past the end
  }
  charge(out.size());
  return out;
}

Value call_method(const Value& self, const std::string& name, CallArgs& a) {
  if (self.is_dict()) {
    const Object& o = self.object();
    charge(o.entries.size());
    if (name == "items") {
      Array out;
      for (auto& [k, v] : o.entries) {
        Array pair{Value(k), v};
        pair.is_tuple = true;
        out.emplace_back(std::move(pair));
      }
      return out;
    }
    if (name == "keys" || name == "values") {
      Array out;
      for (auto& [k, v] : o.entries) out.push_back(name == "keys" ? Value(k) : v);
      return out;
    }
    if (name == "get") {
      const Value* key = arg(a, 0, "key");
      if (!key) type_fail("get expected at least 1 argument, got 0");
      const Value* found = key->is_string() ? o.find(key->str()) : nullptr;
      return found ? *found : arg_or(a, 1, "default", None{});
    }
    if (name == "copy") return Value(std::make_shared<Object>(o));
    type_fail("dict." + name + "() is not allowed: templates cannot modify their inputs");
  }
  if (self.is_array()) {
    const Value* x = arg(a, 0, "value");
    if (!x) type_fail("list." + name + "() takes exactly one argument");
    const Array& arr = self.array();
    int64_t n = 0;
    for (size_t i = 0; i < arr.size(); ++i) {
      if (!equals(arr[i], *x)) continue;
      if (name == "index") return static_cast<int64_t>(i);
      ++n;
    }
    if (name == "index") type_fail(repr(*x) + " is not in list");
    return n;
  }
  const std::string& s = self.str();
  auto affix = [&](bool prefix) -> Value {
    const Value* p = arg(a, 0, prefix ? "prefix" : "suffix");
    if (!p) type_fail(name + "() takes at least 1 argument");
    Array options = p->is_array() ? p->array() : Array{*p};
    for (auto& opt : options) {
      std::string o = need_string(opt, "startswith/endswith argument");
      charge_bytes(o.size());
      if (o.size() <= s.size() && s.compare(prefix ? 0 : s.size() - o.size(), o.size(), o) == 0) return true;
    }
    return false;
  };
  if (name == "startswith") return affix(true);
  if (name == "endswith") return affix(false);
  if (name == "strip" || name == "lstrip" || name == "rstrip")
    return pystr::strip(s, opt_string(a, 0, "chars"), name != "rstrip", name != "lstrip");
  if (name == "split" || name == "rsplit") {
    int64_t maxsplit = to_int(arg_or(a, 1, "maxsplit", int64_t{-1}), "maxsplit");
    if (name == "rsplit" && maxsplit >= 0) type_fail("rsplit with maxsplit is not supported");
    if (opt_string(a, 0, "sep") == "") type_fail("empty separator");
    Array out;
    for (auto& piece : pystr::split(s, opt_string(a, 0, "sep"), maxsplit)) out.emplace_back(piece);
    return out;
  }
  if (name == "splitlines") {
    Array out;
    for (auto& piece : pystr::split(pystr::replace(s, "\r\n", "\n", -1), std::string("\n"), -1)) out.emplace_back(piece);
    if (!out.empty() && out.back().str().empty()) out.pop_back();
    return out;
  }
  if (name == "replace") {
    const Value *o = arg(a, 0, "old"), *n = arg(a, 1, "new");
    if (!o || !n) type_fail("replace() takes at least 2 arguments");
    return pystr::replace(s, need_string(*o, "replace old"), need_string(*n, "replace new"),
                          to_int(arg_or(a, 2, "count", int64_t{-1}), "count"));
  }
  if (name == "upper") return pystr::upper(s);
  if (name == "lower") return pystr::lower(s);
  if (name == "title") return pystr::title(s);
  if (name == "capitalize") return pystr::capitalize(s);
  if (name == "find" || name == "rfind" || name == "index" || name == "count") {
    const Value* sub = arg(a, 0, "sub");
    if (!sub) type_fail(name + "() takes at least 1 argument");
    std::string needle = need_string(*sub, "substring");
    if (name == "count") return pystr::count(s, needle);
    int64_t at = pystr::find(s, needle, name == "rfind");
    if (name == "index" && at < 0) type_fail("substring not found");
    return at;
  }
  if (name == "join") {
    const Value* items = arg(a, 0, "iterable");
    if (!items) type_fail("join() takes exactly one argument");
    std::string out;
    bool first = true;
    for (auto& item : iterate(*items)) {
      const std::string piece = need_string(item, "join item");
      check_string_size(out.size() + s.size() + piece.size(), "join result");
      charge_bytes(s.size() + piece.size());
      if (!first) out += s;
      first = false;
      out += piece;
    }
    return out;
  }
  if (name == "removeprefix" || name == "removesuffix") {
    std::string affix_str = need_string(arg_or(a, 0, "affix", ""), "affix");
    charge_bytes(s.size());
    bool pre = name == "removeprefix";
    if (affix_str.size() <= s.size() && s.compare(pre ? 0 : s.size() - affix_str.size(), affix_str.size(), affix_str) == 0)
      return pre ? s.substr(affix_str.size()) : s.substr(0, s.size() - affix_str.size());
    return s;
  }
  if (name == "format") {
    charge_bytes(s.size());
    std::string out;
    size_t next_auto = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '{' && i + 1 < s.size() && s[i + 1] == '{') { out += '{'; ++i; continue; }
      if (s[i] == '}' && i + 1 < s.size() && s[i + 1] == '}') { out += '}'; ++i; continue; }
      if (s[i] != '{') { out += s[i]; continue; }
      size_t close = s.find('}', i);
      if (close == std::string::npos) type_fail("format(): single '{' encountered");
      std::string field = s.substr(i + 1, close - i - 1);
      const Value* v = nullptr;
      if (field.empty()) v = arg(a, next_auto++, "\x01");
      else if (field.size() < 10 && std::all_of(field.begin(), field.end(), ::isdigit)) v = arg(a, std::stoul(field), "\x01");
      else v = arg(a, SIZE_MAX, field);
      if (!v) type_fail("format(): no argument for field {" + field + "}");
      const std::string text = to_str(*v);
      check_string_size(out.size() + text.size(), "format() result");
      charge_bytes(text.size());
      out += text;
      i = close;
    }
    return out;
  }
  // is* predicates: every code point must qualify (ASCII classes), and the string be non-empty.
  std::u32string u = pystr::decode(s);
  auto all = [&](auto pred) { return !u.empty() && std::all_of(u.begin(), u.end(), pred); };
  auto ascii = [](char32_t c, int (*f)(int)) { return c < 0x80 && f(static_cast<int>(c)); };
  if (name == "isdigit") return all([&](char32_t c) { return ascii(c, ::isdigit); });
  if (name == "isalpha") return all([&](char32_t c) { return ascii(c, ::isalpha); });
  if (name == "isalnum") return all([&](char32_t c) { return ascii(c, ::isalnum); });
  if (name == "isspace") return all([](char32_t c) { return pystr::is_space(c); });
  charge_bytes(s.size());
  bool has_lower = s.find_first_of("abcdefghijklmnopqrstuvwxyz") != std::string::npos;
  bool has_upper = s.find_first_of("ABCDEFGHIJKLMNOPQRSTUVWXYZ") != std::string::npos;
  if (name == "islower") return has_lower && !has_upper;
  if (name == "isupper") return has_upper && !has_lower;
  type_fail("str has no method '" + name + "'");
}

bool run_test(const std::string& name, const Value& v, CallArgs& a) {
  auto other = [&]() -> const Value& {
    const Value* o = arg(a, 0, "other");
    if (!o) type_fail("test '" + name + "' needs an argument");
    return *o;
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && std::get<bool>(v.v);
  if (name == "false") return v.is_bool() && !std::get<bool>(v.v);
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_string() || v.is_array() || v.is_dict() || v.is_undefined();
  if (name == "sequence") return v.is_string() || v.is_array() || v.is_dict();
  if (name == "callable") return v.is_function();
  if (name == "lower") return v.is_string() && pystr::lower(v.str()) == v.str();
  if (name == "upper") return v.is_string() && pystr::upper(v.str()) == v.str();
  if (name == "odd" || name == "even") return (to_int(v, "value") % 2 != 0) == (name == "odd");
  if (name == "divisibleby") {
    int64_t d = to_int(other(), "divisor");
    if (d == 0) type_fail("divisibleby 0");
    return to_int(v, "value") % d == 0;
  }
  if (name == "equalto" || name == "eq" || name == "==") return equals(v, other());
  if (name == "ne" || name == "!=") return !equals(v, other());
  if (name == "lt" || name == "lessthan" || name == "<") return less(v, other());
  if (name == "gt" || name == "greaterthan" || name == ">") return less(other(), v);
  if (name == "le" || name == "<=") return !less(other(), v);
  if (name == "ge" || name == ">=") return !less(v, other());
  if (name == "in") return contains(other(), v);
  if (name == "sameas") {
    const Value& o = other();
    if (v.is_array() && o.is_array()) return &v.array() == &o.array();
    if (v.is_object() && o.is_object()) return &v.object() == &o.object();
    return v.v.index() == o.v.index() && equals(v, o);
  }
  type_fail("unknown test '" + name + "'");
}

Value round_value(const Value& v, CallArgs& a) {
  int64_t precision = to_int(arg_or(a, 0, "precision", int64_t{0}), "precision");
  std::string method = need_string(arg_or(a, 1, "method", "common"), "round method");
  if (!v.is_number()) type_fail("round: " + type_name(v) + " is not a number");
  if (method == "common" && !v.is_float()) return to_int(v, "");
  double scale = std::pow(10.0, static_cast<double>(precision));
  double x = v.as_double() * scale;
  double r = method == "common" ? std::nearbyint(x)  // half to even, as Python's round()
             : method == "ceil" ? std::ceil(x)
             : method == "floor" ? std::floor(x)
             : (type_fail("round method must be common, ceil or floor"), 0.0);
  return r / scale;
}

std::string html_escape(const std::string& s) {
  charge_bytes(s.size());
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// Jinja2's title filter: capitalise after "-", whitespace and opening brackets.
std::string title_filter(const std::string& s) {
  std::u32string u = pystr::decode(s);
  bool word_start = true;
  for (char32_t& c : u) {
    bool delim = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || pystr::is_space(c);
    if (!delim) c = word_start ? pystr::to_upper(c) : pystr::to_lower(c);
    word_start = delim;
  }
  return pystr::encode(u);
}

std::string indent_filter(const std::string& s, CallArgs& a) {
  Value width = arg_or(a, 0, "width", int64_t{4});
  const int64_t n_spaces = width.is_string() ? 0 : std::max<int64_t>(0, to_int(width, "width"));
  check_string_size(uint64_t(n_spaces), "indent");
  std::string pad = width.is_string() ? width.str() : std::string(static_cast<size_t>(n_spaces), ' ');
  bool first = truthy(arg_or(a, 1, "first", false)), blank = truthy(arg_or(a, 2, "blank", false));
  std::vector<std::string> lines = pystr::split(pystr::replace(s, "\r\n", "\n", -1), std::string("\n"), -1);
  if (!lines.empty() && lines.back().empty() && lines.size() > 1) lines.pop_back();  // s + "\n" quirk
  std::string out = lines.empty() ? "" : lines[0];
  for (size_t i = 1; i < lines.size(); ++i) {
    check_string_size(out.size() + 1 + pad.size() + lines[i].size(), "indent result");
    charge_bytes(pad.size() + lines[i].size());
    out += "\n";
    if (blank || !lines[i].empty()) out += pad;
    out += lines[i];
  }
  return first ? pad + out : out;
}

}  // namespace

[[noreturn]] void runtime_fail(int line, const std::string& message) {
  throw TemplateError(str_cat("chat template error at line ", line, ": ", message));
}

const Value* Frame::lookup(const std::string& name) const {
  for (const Frame* f = this; f; f = f->parent.get()) {
    auto it = f->vars.find(name);
    if (it != f->vars.end()) return &it->second;
  }
  return nullptr;
}

Value apply_filter(const std::string& name, const Value& v, CallArgs& a, Runtime& rt, int line) {
  auto seq = [&]() { return iterate(v); };
  auto str_arg = [&](size_t i, const char* key) { return need_string(arg_or(a, i, key, ""), key); };
  if (name == "default" || name == "d") {
    bool use_default = v.is_undefined() || (truthy(arg_or(a, 1, "boolean", false)) && !truthy(v));
    return use_default ? arg_or(a, 0, "default_value", "") : v;
  }
  if (name == "safe") return v;
  if (name == "string") return to_str(v);
  if (name == "tojson") {
    Value indent = arg_or(a, 0, "indent", None{});
    for (auto& [k, val] : a.keyword) {
      bool harmless = (k == "ensure_ascii" || k == "sort_keys") && !truthy(val);
      if (k != "indent" && !harmless) type_fail("tojson: option '" + k + "' is not supported");
    }
    return to_json(v, indent.is_none() ? -1 : static_cast<int>(to_int(indent, "indent")));
  }
  if (name == "length" || name == "count") {
    if (v.is_string()) return static_cast<int64_t>(pystr::length(v.str()));
    if (v.is_array()) return static_cast<int64_t>(v.array().size());
    if (v.is_object()) return static_cast<int64_t>(v.object().entries.size());
    if (v.is_undefined()) return int64_t{0};
    type_fail("object of type '" + type_name(v) + "' has no len()");
  }
  if (v.is_undefined() && name != "list" && name != "items" && name != "join") undefined_fail(v);
  if (name == "trim") return pystr::strip(to_str(v), opt_string(a, 0, "chars"), true, true);
  if (name == "lower") return pystr::lower(to_str(v));
  if (name == "upper") return pystr::upper(to_str(v));
  if (name == "capitalize") return pystr::capitalize(to_str(v));
  if (name == "title") return title_filter(to_str(v));
  if (name == "escape" || name == "e") return html_escape(to_str(v));
  if (name == "indent") return indent_filter(to_str(v), a);
  if (name == "wordcount") {
    int64_t n = 0;
    bool in_word = false;
    for (char32_t c : pystr::decode(to_str(v))) {
      bool word = pystr::is_word_char(c);
      if (word && !in_word) ++n;
      in_word = word;
    }
    return n;
  }
  if (name == "replace") {
    return pystr::replace(to_str(v), str_arg(0, "old"), str_arg(1, "new"),
                          to_int(arg_or(a, 2, "count", int64_t{-1}), "count"));
  }
  if (name == "join") {
    std::string sep = str_arg(0, "d");
    const Value* attribute = arg(a, 1, "attribute");
    std::string out;
    bool first = true;
    for (auto& item : seq()) {
      const std::string piece = to_str(attribute ? get_dotted(item, to_str(*attribute)) : item);
      check_string_size(out.size() + sep.size() + piece.size(), "join result");
      charge_bytes(sep.size() + piece.size());
      if (!first) out += sep;
      first = false;
      out += piece;
    }
    return out;
  }
  if (name == "first" || name == "last") {
    Array items = seq();
    if (items.empty()) return Undefined{"no " + name + " item, sequence was empty"};
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return seq();
  if (name == "reverse") {
    if (v.is_string()) {
      std::u32string u = pystr::decode(v.str());
      return pystr::encode(std::u32string(u.rbegin(), u.rend()));
    }
    Array items = seq();
    std::reverse(items.begin(), items.end());
    return items;
  }
  if (name == "items") {
    if (v.is_undefined()) return Array{};
    if (!v.is_dict()) type_fail("items: " + type_name(v) + " is not a mapping");
    CallArgs none;
    return call_method(v, "items", none);
  }
  if (name == "abs") {
    if (v.is_float()) return std::fabs(std::get<double>(v.v));
    int64_t i = to_int(v, "abs argument");
    if (i == std::numeric_limits<int64_t>::min()) overflow_fail();
    return i < 0 ? -i : i;
  }
  if (name == "int" || name == "float") {
    Value fallback = arg_or(a, 0, "default", name == "int" ? Value(int64_t{0}) : Value(0.0));
    double d;
    if (v.is_number()) {
      d = v.as_double();
      if (name == "int" && !v.is_float()) return to_int(v, "");
    } else if (v.is_string()) {
      std::string t = pystr::strip(v.str(), std::nullopt, true, true);
      char* end = nullptr;
      d = std::strtod(t.c_str(), &end);
      if (t.empty() || *end != '\0') return fallback;
    } else {
      return fallback;
    }
    if (name == "float") return d;
    // Python's int() of a huge float is a huge int; ours must fit 64 bits (2^63 itself does not).
    if (!std::isfinite(d) || std::fabs(d) >= 0x1p63) return fallback;
    return static_cast<int64_t>(std::trunc(d));
  }
  if (name == "round") return round_value(v, a);
  if (name == "sum") {
    const Value* attribute = arg(a, 0, "attribute");
    Value total = arg_or(a, 1, "start", int64_t{0});
    for (auto& item : seq()) total = arithmetic("+", total, attribute ? get_dotted(item, to_str(*attribute)) : item);
    return total;
  }
  if (name == "unique" || name == "sort" || name == "min" || name == "max") {
    bool reverse_order = name == "sort" && truthy(arg_or(a, 0, "reverse", false));
    bool case_sensitive = truthy(arg_or(a, name == "sort" ? 1 : 0, "case_sensitive", false));
    const Value* attribute = arg(a, name == "sort" ? 2 : 1, "attribute");
    auto key = [&](const Value& item) {
      Value k = attribute ? get_dotted(item, to_str(*attribute)) : item;
      return (!case_sensitive && k.is_string()) ? Value(pystr::lower(k.str())) : k;
    };
    Array items = seq(), out;
    if (name == "unique") {
      std::vector<Value> seen;
      for (auto& item : items) {
        Value k = key(item);
        if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, k); })) {
          seen.push_back(k);
          out.push_back(item);
        }
      }
      return out;
    }
    if (name == "sort") {
      std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
        return reverse_order ? less(key(y), key(x)) : less(key(x), key(y));
      });
      return items;
    }
    if (items.empty()) return Undefined{"no " + name + " item, sequence was empty"};
    auto best = items.begin();
    for (auto it = items.begin() + 1; it != items.end(); ++it)
      if (name == "min" ? less(key(*it), key(*best)) : less(key(*best), key(*it))) best = it;
    return *best;
  }
  if (name == "map") {
    Array out;
    const Value* attribute = nullptr;
    for (auto& [k, val] : a.keyword)
      if (k == "attribute") attribute = &val;
    if (attribute) {
      Value fallback = arg_or(a, SIZE_MAX, "default", Undefined{});
      for (auto& item : seq()) {
        Value got = get_dotted(item, to_str(*attribute));
        out.push_back(got.is_undefined() && !fallback.is_undefined() ? fallback : got);
      }
      return out;
    }
    if (a.positional.empty()) type_fail("map needs a filter name or attribute=");
    std::string filter = need_string(a.positional[0], "map filter name");
    CallArgs rest{std::vector<Value>(a.positional.begin() + 1, a.positional.end()), a.keyword};
    for (auto& item : seq()) out.push_back(apply_filter(filter, item, rest, rt, line));
    return out;
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    bool by_attr = name.size() > 6;
    bool keep_when = name[0] == 's';
    size_t first_test = by_attr ? 1 : 0;
    std::string attribute = by_attr ? need_string(arg_or(a, 0, "attribute", ""), "attribute") : "";
    Array out;
    for (auto& item : seq()) {
      Value subject = by_attr ? get_dotted(item, attribute) : item;
      bool ok;
      if (a.positional.size() <= first_test) {
        ok = truthy(subject);
      } else {
        std::string test = need_string(a.positional[first_test], "test name");
        CallArgs test_args{std::vector<Value>(a.positional.begin() + first_test + 1, a.positional.end()), {}};
        ok = run_test(test, subject, test_args);
      }
      if (ok == keep_when) out.push_back(item);
    }
    return out;
  }
  type_fail("unknown filter '" + name + "'");
}

Runtime::~Runtime() {
  for (const auto& weak : namespaces)
    if (auto ns = weak.lock()) ns->entries.clear();
}

FramePtr make_globals(Runtime& rt) {
  auto g = std::make_shared<Frame>();
  g->vars["raise_exception"] = make_function("raise_exception", [](CallArgs& a) -> Value {
    throw TemplateRaised(to_str(arg_or(a, 0, "message", "")));
  });
  g->vars["range"] = make_function("range", [](CallArgs& a) -> Value {
    if (a.positional.empty() || a.positional.size() > 3) type_fail("range expects 1 to 3 arguments");
    int64_t start = 0, stop, step = 1;
    if (a.positional.size() == 1) {
      stop = to_int(a.positional[0], "range argument");
    } else {
      start = to_int(a.positional[0], "range argument");
      stop = to_int(a.positional[1], "range argument");
      if (a.positional.size() == 3) step = to_int(a.positional[2], "range step");
    }
    if (step == 0) type_fail("range() arg 3 must not be zero");
    // In 128 bits: start, stop and step may each be any int64, and the span or -step may not fit.
    const __int128 span = step > 0 ? __int128(stop) - start : __int128(start) - stop;
    const __int128 count = span <= 0 ? 0 : (span - 1) / (step > 0 ? __int128(step) : -__int128(step)) + 1;
    check_list_size(uint64_t(std::min<__int128>(count, UINT64_MAX)), "range() result");
    charge(uint64_t(count));
    Array out;
    out.reserve(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) out.emplace_back(int64_t(__int128(start) + __int128(i) * step));
    return out;
  });
  auto record = [&rt](Object::Kind kind) {
    return [kind, &rt](CallArgs& a) -> Value {
      auto o = std::make_shared<Object>(kind);
      if (kind == Object::Kind::Namespace) rt.namespaces.push_back(o);
      for (auto& p : a.positional) {
        if (!p.is_dict()) type_fail("dict()/namespace() positional argument must be a mapping");
        for (auto& [k, v] : p.object().entries) o->set(k, v);
      }
      for (auto& [k, v] : a.keyword) o->set(k, v);
      return Value(o);
    };
  };
  g->vars["dict"] = make_function("dict", record(Object::Kind::Dict));
  g->vars["namespace"] = make_function("namespace", record(Object::Kind::Namespace));
  g->vars["strftime_now"] = make_function("strftime_now", [](CallArgs& a) -> Value {
    std::string format = need_string(arg_or(a, 0, "format", ""), "strftime_now format");
    std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buf[512];
    size_t n = std::strftime(buf, sizeof buf, format.c_str(), &local);
    return std::string(buf, n);
  });
  return g;
}

// ---- expressions ---------------------------------------------------------------------------

CallArgs Args::eval(Runtime& rt, const FramePtr& frame) const {
  CallArgs out;
  for (auto& p : positional) out.positional.push_back(p->eval(rt, frame));
  for (auto& [k, e] : keyword) out.keyword.emplace_back(k, e->eval(rt, frame));
  return out;
}

Value ListExpr::eval(Runtime& rt, const FramePtr& frame) const {
  Array out;
  out.is_tuple = is_tuple;
  for (auto& item : items) out.push_back(item->eval(rt, frame));
  return out;
}

Value DictExpr::eval(Runtime& rt, const FramePtr& frame) const {
  auto o = std::make_shared<Object>();
  for (auto& [k, v] : items) {
    Value key = k->eval(rt, frame);
    if (!key.is_string()) runtime_fail(line, "dict keys must be strings, not " + type_name(key));
    o->set(key.str(), v->eval(rt, frame));
  }
  return Value(o);
}

Value NameExpr::eval(Runtime&, const FramePtr& frame) const {
  if (const Value* v = frame->lookup(name)) return *v;
  return Undefined{"'" + name + "' is undefined"};
}

Value AttrExpr::eval(Runtime& rt, const FramePtr& frame) const {
  return get_attr(object->eval(rt, frame), name);
}

Value ItemExpr::eval(Runtime& rt, const FramePtr& frame) const {
  return get_item(object->eval(rt, frame), index->eval(rt, frame));
}

Value SliceExpr::eval(Runtime& rt, const FramePtr& frame) const {
  Value obj = object->eval(rt, frame);
  auto part = [&](const ExprPtr& e) { return e ? e->eval(rt, frame) : Value(None{}); };
  Value b = part(start), e = part(stop), s = part(step);
  if (obj.is_array()) {
    Array out;
    for (size_t i : slice_indices(static_cast<int64_t>(obj.array().size()), b, e, s)) out.push_back(obj.array()[i]);
    return out;
  }
  if (obj.is_string()) {
    std::u32string u = pystr::decode(obj.str()), out;
    for (size_t i : slice_indices(static_cast<int64_t>(u.size()), b, e, s)) out += u[i];
    return pystr::encode(out);
  }
  if (obj.is_undefined()) undefined_fail(obj);
  runtime_fail(line, "'" + type_name(obj) + "' object is not subscriptable");
}

Value CallExpr::eval(Runtime& rt, const FramePtr& frame) const {
  Value fn = callee->eval(rt, frame);
  if (fn.is_undefined()) undefined_fail(fn);
  if (!fn.is_function()) runtime_fail(line, "'" + type_name(fn) + "' object is not callable");
  CallArgs a = args.eval(rt, frame);
  return fn.function().call(a);
}

Value FilterExpr::eval(Runtime& rt, const FramePtr& frame) const {
  Value v = operand->eval(rt, frame);
  CallArgs a = args.eval(rt, frame);
  return apply_filter(name, v, a, rt, line);
}

Value TestExpr::eval(Runtime& rt, const FramePtr& frame) const {
  Value v = operand->eval(rt, frame);
  CallArgs a = args.eval(rt, frame);
  return run_test(name, v, a) != negated;
}

Value UnaryExpr::eval(Runtime& rt, const FramePtr& frame) const {
  Value v = operand->eval(rt, frame);
  if (op == "not") return !truthy(v);
  if (v.is_undefined()) undefined_fail(v);
  if (!v.is_number()) runtime_fail(line, "bad operand type for unary " + op + ": '" + type_name(v) + "'");
  if (op == "+") return v.is_bool() ? Value(to_int(v, "")) : v;
  if (v.is_float()) return -std::get<double>(v.v);
  const int64_t i = to_int(v, "");
  if (i == std::numeric_limits<int64_t>::min()) overflow_fail();
  return -i;
}

Value BinaryExpr::eval(Runtime& rt, const FramePtr& frame) const {
  Value l = left->eval(rt, frame);
  if (op == "and") return truthy(l) ? right->eval(rt, frame) : l;
  if (op == "or") return truthy(l) ? l : right->eval(rt, frame);
  Value r = right->eval(rt, frame);
  if (op == "~") {
    std::string text = to_str(l);
    const std::string right_text = to_str(r);
    check_string_size(text.size() + right_text.size(), "~ result");
    charge_bytes(text.size() + right_text.size());
    return text + right_text;
  }
  return arithmetic(op, l, r);
}

Value CompareExpr::eval(Runtime& rt, const FramePtr& frame) const {
  Value l = first->eval(rt, frame);
  for (auto& [op, expr] : rest) {
    Value r = expr->eval(rt, frame);
    bool ok = op == "==" ? equals(l, r)
              : op == "!=" ? !equals(l, r)
              : op == "<" ? less(l, r)
              : op == ">" ? less(r, l)
              : op == "<=" ? !less(r, l)
              : op == ">=" ? !less(l, r)
              : op == "in" ? contains(r, l)
              : !contains(r, l);
    if (!ok) return false;
    l = std::move(r);
  }
  return true;
}

Value CondExpr::eval(Runtime& rt, const FramePtr& frame) const {
  if (truthy(cond->eval(rt, frame))) return then->eval(rt, frame);
  return otherwise ? otherwise->eval(rt, frame) : Value(Undefined{"conditional expression had no else"});
}

// ---- statements ----------------------------------------------------------------------------

Flow exec_body(const Body& body, Runtime& rt, const FramePtr& frame, std::string& out) {
  for (auto& stmt : body) {
    Flow f;
    try {
      charge(1);
      f = stmt->exec(rt, frame, out);
      // Every output buffer (the render's, a set block's, a macro's) passes through here.
      check_string_size(out.size(), "output");
    } catch (const TemplateRaised&) {
      throw;
    } catch (const TemplateError& e) {
      if (std::string_view(e.what()).starts_with("chat template")) throw;
      runtime_fail(stmt->line, e.what());
    }
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

Flow EmitStmt::exec(Runtime& rt, const FramePtr& frame, std::string& out) const {
  Value v = expr->eval(rt, frame);
  out += to_str(v);
  return Flow::Normal;
}

Flow IfStmt::exec(Runtime& rt, const FramePtr& frame, std::string& out) const {
  for (auto& [cond, body] : branches)
    if (truthy(cond->eval(rt, frame))) return exec_body(body, rt, frame, out);
  return exec_body(otherwise, rt, frame, out);
}

namespace {
void bind_targets(Frame& f, const std::vector<std::string>& targets, const Value& v, int line) {
  if (targets.size() == 1) {
    f.vars[targets[0]] = v;
    return;
  }
  Array items = v.is_array() || v.is_string() ? iterate(v) : Array{};
  if (items.size() != targets.size())
    runtime_fail(line, str_cat("cannot unpack ", type_name(v), " into ", targets.size(), " variables"));
  for (size_t i = 0; i < targets.size(); ++i) f.vars[targets[i]] = items[i];
}
}  // namespace

Flow ForStmt::exec(Runtime& rt, const FramePtr& frame, std::string& out) const {
  Array items = iterate(iterable->eval(rt, frame));
  if (filter) {
    Array kept;
    for (auto& item : items) {
      charge(1);
      auto scope = std::make_shared<Frame>();
      scope->parent = frame;
      bind_targets(*scope, targets, item, line);
      if (truthy(filter->eval(rt, scope))) kept.push_back(item);
    }
    items = std::move(kept);
  }
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    charge(1);
    auto scope = std::make_shared<Frame>();
    scope->parent = frame;
    bind_targets(*scope, targets, items[static_cast<size_t>(i)], line);
    auto loop = std::make_shared<Object>(Object::Kind::Attributes);
    loop->set("index", i + 1);
    loop->set("index0", i);
    loop->set("revindex", n - i);
    loop->set("revindex0", n - i - 1);
    loop->set("first", i == 0);
    loop->set("last", i == n - 1);
    loop->set("length", n);
    loop->set("depth", int64_t{1});
    loop->set("depth0", int64_t{0});
    if (i > 0) loop->set("previtem", items[static_cast<size_t>(i - 1)]);
    if (i + 1 < n) loop->set("nextitem", items[static_cast<size_t>(i + 1)]);
    loop->set("cycle", make_function("cycle", [i](CallArgs& a) -> Value {
      if (a.positional.empty()) type_fail("loop.cycle needs at least one argument");
      return a.positional[static_cast<size_t>(i) % a.positional.size()];
    }));
    scope->vars["loop"] = Value(loop);
    if (exec_body(body, rt, scope, out) == Flow::Break) break;
  }
  if (n == 0) {
    auto scope = std::make_shared<Frame>();
    scope->parent = frame;
    exec_body(otherwise, rt, scope, out);
  }
  return Flow::Normal;
}

Flow SetStmt::exec(Runtime& rt, const FramePtr& frame, std::string& out) const {
  Value v = value->eval(rt, frame);
  if (!attribute.empty()) {
    const Value* ns = frame->lookup(targets[0]);
    if (!ns || !ns->is_object() || ns->object().kind != Object::Kind::Namespace)
      runtime_fail(line, "cannot assign attribute on non-namespace object '" + targets[0] + "'");
    ns->object().set(attribute, std::move(v));
    check_nesting(*ns);  // after the assignment: the value may contain the namespace itself
    return Flow::Normal;
  }
  check_nesting(v);
  bind_targets(*frame, targets, v, line);
  return Flow::Normal;
}

Flow SetBlockStmt::exec(Runtime& rt, const FramePtr& frame, std::string& out) const {
  std::string captured;
  exec_body(body, rt, frame, captured);
  Value v = std::move(captured);
  for (auto& [name, args] : filters) {
    CallArgs a = args.eval(rt, frame);
    v = apply_filter(name, v, a, rt, line);
  }
  frame->vars[target] = std::move(v);
  return Flow::Normal;
}

Flow MacroStmt::exec(Runtime& rt, const FramePtr& frame, std::string& out) const {
  std::weak_ptr<Frame> defined_in = frame;
  Runtime* runtime = &rt;
  frame->vars[name] = make_function(name, [this, defined_in, runtime](CallArgs& a) -> Value {
    FramePtr parent = defined_in.lock();
    if (!parent) type_fail("macro '" + name + "' called after its scope ended");
    if (a.positional.size() > params.size())
      type_fail(str_cat("macro '", name, "' takes ", params.size(), " arguments, got ", a.positional.size()));
    auto scope = std::make_shared<Frame>();
    scope->parent = parent;
    for (const auto& keyword : a.keyword) {
      const std::string& k = keyword.first;  // clang 14 cannot capture a structured binding
      if (std::none_of(params.begin(), params.end(), [&](auto& p) { return p.first == k; }))
        type_fail("macro '" + name + "' takes no keyword argument '" + k + "'");
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const Value* given = arg(a, i, params[i].first);
      if (given) {
        check_nesting(*given);
        scope->vars[params[i].first] = *given;
      } else if (params[i].second) {
        scope->vars[params[i].first] = params[i].second->eval(*runtime, scope);
      } else {
        scope->vars[params[i].first] = Undefined{"parameter '" + params[i].first + "' was not provided"};
      }
    }
    if (++runtime->macro_depth > kMaxMacroDepth) {
      type_fail("macro recursion deeper than " + std::to_string(kMaxMacroDepth));
    }
    std::string result;
    exec_body(body, *runtime, scope, result);
    --runtime->macro_depth;
    return result;
  });
  return Flow::Normal;
}

}  // namespace detail

std::string Template::render(const Context& context, uint64_t max_steps) const {
  detail::Runtime rt;
  detail::RenderBudget budget(max_steps);
  auto root = std::make_shared<detail::Frame>();
  root->parent = detail::make_globals(rt);
  for (auto& [k, v] : context) root->vars[k] = v;
  std::string out;
  detail::exec_body(impl_->body, rt, root, out);
  return out;
}

}  // namespace minfer::jinja
