// Values with Python's printing rules, and Python str helpers.
#include <charconv>
#include <cmath>
#include <cctype>
#include <cstdio>

#include "tokenizer/jinja/budget.h"
#include "tokenizer/jinja/jinja.h"
#include "tokenizer/jinja/pystr.h"

namespace minfer::jinja {

bool Value::is_dict() const { return is_object() && object().kind == Object::Kind::Dict; }

double Value::as_double() const {
  if (is_int()) return static_cast<double>(std::get<int64_t>(v));
  if (is_bool()) return std::get<bool>(v) ? 1.0 : 0.0;
  return std::get<double>(v);
}

// Entries are searched one by one (dicts are small and keep their order); a long search is work.
const Value* Object::find(std::string_view key) const {
  detail::charge(1 + entries.size() / 16);
  for (auto& [k, val] : entries)
    if (k == key) return &val;
  return nullptr;
}

void Object::set(const std::string& key, Value value) {
  detail::charge(1 + entries.size() / 16);
  for (auto& [k, val] : entries) {
    if (k == key) {
      val = std::move(value);
      return;
    }
  }
  entries.emplace_back(key, std::move(value));
}

bool truthy(const Value& v) {
  return std::visit(
      [](const auto& x) -> bool {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, Undefined> || std::is_same_v<T, None>) return false;
        else if constexpr (std::is_same_v<T, bool>) return x;
        else if constexpr (std::is_same_v<T, int64_t>) return x != 0;
        else if constexpr (std::is_same_v<T, double>) return x != 0.0;
        else if constexpr (std::is_same_v<T, SharedString>) return !x->empty();
        else if constexpr (std::is_same_v<T, std::shared_ptr<Array>>) return !x->empty();
        else if constexpr (std::is_same_v<T, std::shared_ptr<Object>>)
          return x->kind != Object::Kind::Dict || !x->entries.empty();
        else return true;
      },
      v.v);
}

std::string type_name(const Value& v) {
  static const char* names[] = {"undefined", "NoneType", "bool", "int", "float",
                                "str",       "list",     "dict", "function"};
  if (v.is_object() && v.object().kind == Object::Kind::Namespace) return "Namespace";
  return names[v.v.index()];
}

namespace {

// Python's float repr: the shortest round-tripping digits, positional for 1e-4 <= |x| < 1e16.
std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  size_t e = sci.find('e');
  int exp = std::stoi(sci.substr(e + 1));
  std::string mant = sci.substr(0, e);
  bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out = neg ? "-" : "";
  if (exp < -4 || exp >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + eb;
  }
  if (exp < 0) return out + "0." + std::string(-exp - 1, '0') + digits;
  if (static_cast<int>(digits.size()) <= exp + 1)
    return out + digits + std::string(exp + 1 - digits.size(), '0') + ".0";
  return out + digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
}

bool printable(char32_t c) {
  if (c < 0x20 || (c >= 0x7f && c <= 0xa0) || c == 0xad) return false;
  if ((c >= 0x2000 && c <= 0x200f) || (c >= 0x2028 && c <= 0x202f) ||
      (c >= 0x205f && c <= 0x206f) || c == 0x3000 || c == 0xfeff)
    return false;
  return true;
}

std::string string_repr(const std::string& s) {
  detail::check_string_size(s.size(), "repr() result");
  char quote = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : pystr::decode(s)) {
    if (c == '\\') out += "\\\\";
    else if (c == static_cast<char32_t>(quote)) out += std::string("\\") + quote;
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (!printable(c)) {
      char b[16];
      if (c < 0x100) std::snprintf(b, sizeof b, "\\x%02x", static_cast<unsigned>(c));
      else std::snprintf(b, sizeof b, "\\u%04x", static_cast<unsigned>(c));
      out += b;
    } else {
      out += pystr::encode(std::u32string_view(&c, 1));
    }
  }
  return out + quote;
}

std::string json_string(const std::string& s) {
  detail::charge_bytes(s.size());
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

void json_into(const Value& v, int indent, int level, std::string& out) {
  detail::charge(1);
  detail::check_string_size(out.size(), "tojson result");
  auto newline = [&](int lvl) {
    if (indent < 0) return;
    const uint64_t spaces = uint64_t(indent) * uint64_t(lvl);
    detail::check_string_size(out.size() + spaces, "tojson result");
    detail::charge_bytes(spaces);
    out += "\n" + std::string(size_t(spaces), ' ');
  };
  const char* item_sep = indent >= 0 ? "," : ", ";
  if (v.is_none()) out += "null";
  else if (v.is_bool()) out += std::get<bool>(v.v) ? "true" : "false";
  else if (v.is_int()) out += std::to_string(std::get<int64_t>(v.v));
  else if (v.is_float()) {
    double d = std::get<double>(v.v);
    out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d < 0 ? "-Infinity" : "Infinity") : float_repr(d);
  } else if (v.is_string()) {
    detail::check_string_size(out.size() + v.str().size(), "tojson result");
    out += json_string(v.str());
  }
  else if (v.is_array()) {
    if (v.array().empty()) {
      out += "[]";
      return;
    }
    out += "[";
    bool first = true;
    for (auto& item : v.array()) {
      if (!first) out += item_sep;
      first = false;
      newline(level + 1);
      json_into(item, indent, level + 1, out);
    }
    newline(level);
    out += "]";
  } else if (v.is_dict()) {
    if (v.object().entries.empty()) {
      out += "{}";
      return;
    }
    out += "{";
    bool first = true;
    for (auto& [k, item] : v.object().entries) {
      if (!first) out += item_sep;
      first = false;
      newline(level + 1);
      out += json_string(k) + ": ";
      json_into(item, indent, level + 1, out);
    }
    newline(level);
    out += "}";
  } else {
    throw TemplateError("tojson: Object of type " + type_name(v) + " is not JSON serializable");
  }
}

}  // namespace

std::string repr(const Value& v) {
  detail::charge(1);
  if (v.is_string()) return string_repr(v.str());
  if (v.is_array()) {
    const Array& a = v.array();
    std::string out = a.is_tuple ? "(" : "[";
    for (size_t i = 0; i < a.size(); ++i) {
      out += (i ? ", " : "") + repr(a[i]);
      detail::check_string_size(out.size(), "repr() result");
    }
    if (a.is_tuple) return out + (a.size() == 1 ? ",)" : ")");
    return out + "]";
  }
  if (v.is_object()) {
    std::string out = "{";
    bool first = true;
    for (auto& [k, item] : v.object().entries) {
      out += (first ? "" : ", ") + string_repr(k) + ": " + repr(item);
      detail::check_string_size(out.size(), "repr() result");
      first = false;
    }
    out += "}";
    if (v.object().kind == Object::Kind::Namespace) return "<Namespace " + out + ">";
    return out;
  }
  return to_str(v);
}

std::string to_str(const Value& v) {
  if (v.is_undefined()) return "";
  if (v.is_none()) return "None";
  if (v.is_bool()) return std::get<bool>(v.v) ? "True" : "False";
  if (v.is_int()) return std::to_string(std::get<int64_t>(v.v));
  if (v.is_float()) return float_repr(std::get<double>(v.v));
  if (v.is_string()) {
    detail::charge_bytes(v.str().size());
    return v.str();
  }
  if (v.is_function()) return "<function " + v.function().name + ">";
  return repr(v);
}

std::string to_json(const Value& v, int indent) {
  std::string out;
  json_into(v, indent, 0, out);
  return out;
}

// ---- pystr ---------------------------------------------------------------------------------

namespace pystr {

std::u32string decode(std::string_view s) {
  detail::charge_bytes(s.size());
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    unsigned char c = s[i];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    char32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
    bool ok = len > 0 && i + len <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      unsigned char cc = s[i + k];
      if ((cc & 0xc0) != 0x80) ok = false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (!ok) {
      out += U'\uFFFD';
      ++i;
      continue;
    }
    out += cp;
    i += len;
  }
  return out;
}

std::string encode(std::u32string_view s) {
  detail::charge_bytes(s.size());
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) {
    if (c < 0x80) {
      out += static_cast<char>(c);
    } else if (c < 0x800) {
      out += static_cast<char>(0xc0 | (c >> 6));
      out += static_cast<char>(0x80 | (c & 0x3f));
    } else if (c < 0x10000) {
      out += static_cast<char>(0xe0 | (c >> 12));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (c & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (c >> 18));
      out += static_cast<char>(0x80 | ((c >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (c & 0x3f));
    }
  }
  return out;
}

bool is_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
         c == 0x202f || c == 0x205f || c == 0x3000;
}

std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  std::u32string u = decode(s);
  std::u32string set = chars ? decode(*chars) : std::u32string();
  auto strippable = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : is_space(c); };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strippable(u[b])) ++b;
  if (right)
    while (e > b && strippable(u[e - 1])) --e;
  return encode(std::u32string_view(u).substr(b, e - b));
}

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  auto check_pieces = [&] { detail::check_list_size(out.size() + 1, "split() result"); };
  if (sep) {
    detail::charge_bytes(s.size());
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      size_t at = s.find(*sep, start);
      if (at == std::string_view::npos) break;
      check_pieces();
      out.emplace_back(s.substr(start, at - start));
      start = at + sep->size();
    }
    out.emplace_back(s.substr(start));
    return out;
  }
  std::u32string u = decode(s);
  size_t i = 0;
  while (i < u.size()) {
    while (i < u.size() && is_space(u[i])) ++i;
    if (i == u.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      size_t e = u.size();
      while (e > i && is_space(u[e - 1])) --e;
      out.push_back(encode(std::u32string_view(u).substr(i, e - i)));
      break;
    }
    size_t j = i;
    while (j < u.size() && !is_space(u[j])) ++j;
    check_pieces();
    out.push_back(encode(std::u32string_view(u).substr(i, j - i)));
    i = j;
  }
  return out;
}

std::string replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count) {
  std::string out;
  auto append_repl = [&] {
    detail::check_string_size(out.size() + repl.size(), "replace() result");
    detail::charge_bytes(repl.size());
    out.append(repl);
  };
  if (old.empty()) {  // Python inserts repl between every character
    std::u32string u = decode(s);
    int64_t done = 0;
    for (size_t i = 0; i <= u.size(); ++i) {
      if (count < 0 || done < count) {
        append_repl();
        ++done;
      }
      if (i < u.size()) out += encode(std::u32string(1, u[i]));
    }
    return out;
  }
  detail::charge_bytes(s.size());
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t at = s.find(old, start);
    if (at == std::string_view::npos) break;
    out.append(s.substr(start, at - start));
    append_repl();
    start = at + old.size();
    ++done;
  }
  out.append(s.substr(start));
  return out;
}

// Simple case mapping for ASCII, Latin-1, Latin Extended-A, Greek, Cyrillic and fullwidth
// Latin: the scripts chat content mostly uses (no special casing such as "ß" -> "SS").
char32_t to_upper(char32_t c) {
  if ((c >= 'a' && c <= 'z') || (c >= 0xe0 && c <= 0xfe && c != 0xf7) || (c >= 0x3b1 && c <= 0x3c9 && c != 0x3c2) ||
      (c >= 0x430 && c <= 0x44f))
    return c - 0x20;
  if (c == 0xff) return 0x178;
  if (c == 0x3c2) return 0x3a3;
  if (c >= 0x450 && c <= 0x45f) return c - 0x50;
  if (c >= 0xff41 && c <= 0xff5a) return c - 0x20;
  if (c == 0x3ac) return 0x386;
  if (c >= 0x3ad && c <= 0x3af) return c - 0x25;
  if (c == 0x3cc) return 0x38c;
  if (c == 0x3cd || c == 0x3ce) return c - 0x3f;
  if (((c >= 0x100 && c <= 0x137) || (c >= 0x14a && c <= 0x177)) && (c & 1)) return c - 1;
  if (((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e)) && !(c & 1)) return c - 1;
  return c;
}

char32_t to_lower(char32_t c) {
  if ((c >= 'A' && c <= 'Z') || (c >= 0xc0 && c <= 0xde && c != 0xd7) || (c >= 0x391 && c <= 0x3a9 && c != 0x3a2) ||
      (c >= 0x410 && c <= 0x42f))
    return c + 0x20;
  if (c == 0x178) return 0xff;
  if (c >= 0x400 && c <= 0x40f) return c + 0x50;
  if (c >= 0xff21 && c <= 0xff3a) return c + 0x20;
  if (c == 0x386) return 0x3ac;
  if (c >= 0x388 && c <= 0x38a) return c + 0x25;
  if (c == 0x38c) return 0x3cc;
  if (c == 0x38e || c == 0x38f) return c + 0x3f;
  if (((c >= 0x100 && c <= 0x137) || (c >= 0x14a && c <= 0x177)) && !(c & 1)) return c + 1;
  if (((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e)) && (c & 1)) return c + 1;
  return c;
}

bool is_cased(char32_t c) { return to_upper(c) != c || to_lower(c) != c; }

bool is_word_char(char32_t c) {
  if (c < 0x80) return std::isalnum(static_cast<int>(c)) || c == '_';
  if (c < 0xc0) return c == 0xaa || c == 0xb5 || c == 0xba || c == 0xb2 || c == 0xb3 || c == 0xb9 || (c >= 0xbc && c <= 0xbe);
  if (c == 0xd7 || c == 0xf7) return false;
  if ((c >= 0x2000 && c <= 0x2bff) || (c >= 0x3000 && c <= 0x303f) || (c >= 0xfe00 && c <= 0xfe0f) ||
      (c >= 0xff00 && c <= 0xff0f) || (c >= 0x1f000 && c <= 0x1faff) || c >= 0xe0000)
    return false;
  return true;
}

namespace {
template <typename F>
std::string map_chars(std::string_view s, F f) {
  std::u32string u = decode(s);
  for (char32_t& c : u) c = f(c);
  return encode(u);
}
}  // namespace

std::string lower(std::string_view s) { return map_chars(s, to_lower); }
std::string upper(std::string_view s) { return map_chars(s, to_upper); }

std::string capitalize(std::string_view s) {
  std::u32string u = decode(s);
  for (size_t i = 0; i < u.size(); ++i) u[i] = i == 0 ? to_upper(u[i]) : to_lower(u[i]);
  return encode(u);
}

std::string title(std::string_view s) {
  std::u32string u = decode(s);
  bool prev_cased = false;
  for (char32_t& c : u) {
    bool cased = is_cased(c);
    c = prev_cased ? to_lower(c) : to_upper(c);
    prev_cased = cased;
  }
  return encode(u);
}

int64_t count(std::string_view s, std::string_view sub) {
  detail::charge_bytes(s.size());
  if (sub.empty()) return static_cast<int64_t>(length(s)) + 1;
  int64_t n = 0;
  for (size_t at = s.find(sub); at != std::string_view::npos; at = s.find(sub, at + sub.size())) ++n;
  return n;
}

int64_t find(std::string_view s, std::string_view sub, bool reverse) {
  detail::charge_bytes(s.size());
  size_t at = reverse ? s.rfind(sub) : s.find(sub);
  if (at == std::string_view::npos) return -1;
  return static_cast<int64_t>(length(s.substr(0, at)));
}

size_t length(std::string_view s) {
  detail::charge_bytes(s.size());
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xc0) != 0x80;
  return n;
}

}  // namespace pystr
}  // namespace minfer::jinja
