#include "tokenizer/unicode.h"

namespace minfer::utf8 {

namespace {

bool is_continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

// Expected sequence length from the lead byte, 0 when it cannot start a sequence.
size_t expected_len(unsigned char c) {
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c >= 0xE0 && c <= 0xEF) return 3;
  if (c >= 0xF0 && c <= 0xF4) return 4;
  return 0;
}

// Whether s[1] is allowed after the lead byte s[0] (rules out overlongs, surrogates, > U+10FFFF).
bool second_byte_ok(unsigned char lead, unsigned char c) {
  if (!is_continuation(c)) return false;
  if (lead == 0xE0) return c >= 0xA0;
  if (lead == 0xED) return c <= 0x9F;
  if (lead == 0xF0) return c >= 0x90;
  if (lead == 0xF4) return c <= 0x8F;
  return true;
}

// Number of leading bytes of s that form a valid (possibly incomplete) sequence.
size_t valid_run(std::string_view s, size_t need) {
  size_t i = 1;
  for (; i < need && i < s.size(); ++i) {
    const unsigned char c = s[i];
    if (i == 1 ? !second_byte_ok(static_cast<unsigned char>(s[0]), c) : !is_continuation(c)) break;
  }
  return i;
}

}  // namespace

size_t char_len(std::string_view s) {
  if (s.empty()) return 0;
  const size_t need = expected_len(static_cast<unsigned char>(s[0]));
  if (need <= 1) return 1;
  return valid_run(s, need) == need ? need : 1;
}

uint32_t decode(std::string_view s, size_t len) {
  const auto b = [&](size_t i) { return uint32_t(static_cast<unsigned char>(s[i])); };
  switch (len) {
    case 2: return (b(0) & 0x1F) << 6 | (b(1) & 0x3F);
    case 3: return (b(0) & 0x0F) << 12 | (b(1) & 0x3F) << 6 | (b(2) & 0x3F);
    case 4: return (b(0) & 0x07) << 18 | (b(1) & 0x3F) << 12 | (b(2) & 0x3F) << 6 | (b(3) & 0x3F);
    default: return b(0);
  }
}

void append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | cp >> 6);
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | cp >> 12);
    out += char(0x80 | (cp >> 6 & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | cp >> 18);
    out += char(0x80 | (cp >> 12 & 0x3F));
    out += char(0x80 | (cp >> 6 & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

size_t complete_prefix(std::string_view s) {
  // Only the last 3 bytes can belong to an unfinished sequence.
  const size_t from = s.size() > 3 ? s.size() - 3 : 0;
  for (size_t i = from; i < s.size(); ++i) {
    const size_t need = expected_len(static_cast<unsigned char>(s[i]));
    if (need <= 1) continue;
    const size_t have = s.size() - i;
    if (have < need && valid_run(s.substr(i), need) == have) return i;
  }
  return s.size();
}

std::string sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t len = char_len(s.substr(i));
    if (len == 1 && static_cast<unsigned char>(s[i]) >= 0x80)
      out += "\xEF\xBF\xBD";
    else
      out.append(s, i, len);
    i += len;
  }
  return out;
}

}  // namespace minfer::utf8

namespace minfer::byte_level {

namespace {

// GPT-2 keeps the printable Latin-1 bytes as themselves and moves the other 68 bytes, in byte
// order, to U+0100 onwards.
bool is_printable(int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; }

struct Tables {
  std::array<std::string, 256> chars;
  std::array<int16_t, 0x144> byte_of;  // code points U+0000..U+0143
  Tables() {
    byte_of.fill(-1);
    uint32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cp = is_printable(b) ? uint32_t(b) : next++;
      utf8::append(chars[b], cp);
      byte_of[cp] = int16_t(b);
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

const std::array<std::string, 256>& byte_chars() { return tables().chars; }

int char_to_byte(uint32_t cp) { return cp < tables().byte_of.size() ? tables().byte_of[cp] : -1; }

}  // namespace minfer::byte_level
