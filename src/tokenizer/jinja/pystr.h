// Python str semantics on UTF-8 std::string: code-point length and slicing, whitespace as
// str.isspace() sees it, strip/split/title as Python does them (case mapping covers Latin, Greek
// and Cyrillic; no special casing).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace minfer::jinja::pystr {

std::u32string decode(std::string_view s);  // invalid bytes map to U+FFFD
std::string encode(std::u32string_view s);
bool is_space(char32_t c);
// chars: the set to strip (None: whitespace).
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
// sep None: runs of whitespace, empty pieces dropped. maxsplit < 0: unlimited.
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit);
std::string replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count);
char32_t to_upper(char32_t c);
char32_t to_lower(char32_t c);
bool is_word_char(char32_t c);  // \w as Python's re sees it (approximately, outside ASCII)
std::string lower(std::string_view s);
std::string upper(std::string_view s);
std::string capitalize(std::string_view s);  // first character upper, the rest lower
std::string title(std::string_view s);       // str.title(): upper after every non-letter
int64_t count(std::string_view s, std::string_view sub);
int64_t find(std::string_view s, std::string_view sub, bool reverse);  // code-point index, -1
size_t length(std::string_view s);                                     // code points

}  // namespace minfer::jinja::pystr
