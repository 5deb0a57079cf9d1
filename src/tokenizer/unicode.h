// UTF-8 helpers and the GPT-2 byte <-> printable-character mapping of byte-level BPE.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace minfer::utf8 {

// Length of the UTF-8 sequence starting at s[0]: 1..4 for a valid sequence, 1 for an invalid
// byte (so a walk over arbitrary bytes always advances).
size_t char_len(std::string_view s);
// Code point of a valid sequence of `len` bytes (as returned by char_len).
uint32_t decode(std::string_view s, size_t len);
void append(std::string& out, uint32_t cp);
// Length of the longest prefix of `s` that does not end inside a possibly unfinished sequence:
// a valid but incomplete sequence at the very end is held back; everything else is passed.
size_t complete_prefix(std::string_view s);
// Replaces every invalid byte with U+FFFD.
std::string sanitize(std::string_view s);

}  // namespace minfer::utf8

namespace minfer::byte_level {

// The UTF-8 text of the printable character GPT-2 assigns to byte b ("Ġ" for ' ', "Ċ" for '\n').
const std::array<std::string, 256>& byte_chars();
// The byte a code point stands for, or -1 when it is not one of the 256 byte characters.
int char_to_byte(uint32_t cp);

}  // namespace minfer::byte_level
