#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <array>
#include <mutex>
#include <queue>
#include <unordered_map>

#include "tokenizer/pretokenize.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab.h"
#include "util/error.h"

namespace minfer {

namespace {

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's visible space

// Token texts that end a turn in the common chat formats (besides the eos/eot/eom ids).
constexpr std::string_view kEndOfGenerationTexts[] = {
    "<|eot_id|>", "<|eom_id|>",   "<|im_end|>", "<|end|>",  "<|endoftext|>", "<|end_of_text|>",
    "</s>",       "<end_of_turn>", "<|EOT|>",   "<｜end▁of▁sentence｜>"};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using IdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// Special-token texts in a byte trie, so the text is scanned once whatever the number of
// special tokens (Llama 3 has 256, DeepSeek 2400).
class SpecialMatcher {
 public:
  void add(std::string_view text, int32_t id, bool control) {
    if (text.empty()) return;
    int32_t node = 0;
    for (unsigned char c : text) {
      int32_t child = find_child(node, c);
      if (child < 0) {
        child = int32_t(nodes_.size());
        nodes_.emplace_back();
        nodes_[size_t(node)].children.emplace_back(c, child);
      }
      node = child;
    }
    Node& end = nodes_[size_t(node)];
    if (end.token < 0) {
      end.token = id;
      end.control = control;
    }
    may_start_[static_cast<unsigned char>(text[0])] = true;
  }

  bool may_start(unsigned char c) const { return may_start_[c]; }

  // The longest allowed special token starting at text[0]: {id, length}, or {-1, 0}.
  std::pair<int32_t, size_t> longest_match(std::string_view text, bool parse_control) const {
    std::pair<int32_t, size_t> best{-1, 0};
    int32_t node = 0;
    for (size_t i = 0; i < text.size(); ++i) {
      node = find_child(node, static_cast<unsigned char>(text[i]));
      if (node < 0) break;
      const Node& n = nodes_[size_t(node)];
      if (n.token >= 0 && (parse_control || !n.control)) best = {n.token, i + 1};
    }
    return best;
  }

 private:
  struct Node {
    int32_t token = -1;
    bool control = false;
    std::vector<std::pair<unsigned char, int32_t>> children;
  };
  int32_t find_child(int32_t node, unsigned char c) const {
    for (const auto& [byte, child] : nodes_[size_t(node)].children)
      if (byte == c) return child;
    return -1;
  }
  std::vector<Node> nodes_{1};
  std::array<bool, 256> may_start_{};
};

// A symbol of a word being merged: a run of the word's bytes and the token it currently is
// (-1 when the run is not a token). Symbols form a linked list; merged-away ones have len 0.
struct Symbol {
  int32_t id;
  uint32_t start, len;
  int32_t prev, next;
};

// Merges adjacent symbols, always the best-priority pair first (lowest `priority`; ties go to the
// leftmost pair), until no adjacent pair can merge. `lookup(left, right)` returns
// {priority, merged id} or a negative id when the pair cannot merge. This is both the BPE merge
// by rank and SentencePiece's merge by score. A heap with lazy invalidation keeps it
// O(n log n) for long words.
template <typename Lookup>
void merge_symbols(std::vector<Symbol>& syms, const Lookup& lookup) {
  struct Candidate {
    double priority;
    int32_t left, right;
    uint32_t len;  // left.len + right.len when queued: detects symbols changed since
    bool operator>(const Candidate& o) const {
      return priority != o.priority ? priority > o.priority : left > o.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  const auto try_queue = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const auto [priority, id] = lookup(syms[size_t(left)], syms[size_t(right)]);
    if (id >= 0) queue.push({priority, left, right, syms[size_t(left)].len + syms[size_t(right)].len});
  };
  for (size_t i = 1; i < syms.size(); ++i) try_queue(int32_t(i - 1), int32_t(i));
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = syms[size_t(c.left)];
    Symbol& right = syms[size_t(c.right)];
    if (left.len == 0 || right.len == 0 || left.next != c.right || left.len + right.len != c.len)
      continue;
    left.id = lookup(left, right).second;
    left.len += right.len;
    right.len = 0;
    left.next = right.next;
    if (right.next >= 0) syms[size_t(right.next)].prev = c.left;
    try_queue(left.prev, c.left);
    try_queue(c.left, left.next);
  }
}

// Splits `text` into one symbol per UTF-8 character (invalid bytes are single symbols).
void char_symbols(std::string_view text, std::vector<Symbol>& syms) {
  syms.clear();
  for (size_t i = 0; i < text.size();) {
    const size_t len = utf8::char_len(text.substr(i));
    const auto index = int32_t(syms.size());
    syms.push_back({-1, uint32_t(i), uint32_t(len), index - 1, index + 1});
    i += len;
  }
  if (!syms.empty()) syms.back().next = -1;
}

int parse_byte_token(std::string_view text) {  // "<0xAB>" -> 0xAB, else -1
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  int value = 0;
  for (char c : text.substr(3, 2)) {
    const int digit = c >= '0' && c <= '9'   ? c - '0'
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                             : -1;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

// The bytes a byte-level BPE token stands for; characters outside the 256-character map (not
// produced by GPT-2's encoding) are kept as they are.
std::string byte_level_piece(std::string_view text) {
  std::string piece;
  for (size_t i = 0; i < text.size();) {
    const size_t len = utf8::char_len(text.substr(i));
    const bool valid = len > 1 || static_cast<unsigned char>(text[i]) < 0x80;
    const int b = valid ? byte_level::char_to_byte(utf8::decode(text.substr(i), len)) : -1;
    if (b >= 0)
      piece += char(b);
    else
      piece.append(text.substr(i, len));
    i += len;
  }
  return piece;
}

std::string spm_piece(std::string_view text) {  // "▁" -> " "
  std::string piece;
  for (size_t i = 0; i < text.size();) {
    if (text.substr(i, kSpmSpace.size()) == kSpmSpace) {
      piece += ' ';
      i += kSpmSpace.size();
    } else {
      piece += text[i++];
    }
  }
  return piece;
}

}  // namespace

struct Tokenizer::Impl {
  TokenizerMetadata meta;
  bool byte_level = false;  // gpt2 (byte-level BPE) vs llama (SentencePiece)
  IdMap ids;                // token text -> id, normal tokens taking precedence
  std::vector<std::string> pieces;  // the bytes each token decodes to
  std::vector<bool> end_of_generation;
  SpecialMatcher specials;
  std::array<int32_t, 256> byte_tokens;  // BPE: the byte's character; SPM: <0xXX>; -1 if none
  bool spm_word_boundaries = false;      // SPM: no token has "▁" after another character

  // Byte-level BPE.
  struct Merge {
    int32_t rank, result;
  };
  std::unique_ptr<PreTokenizer> pre;
  bool ignore_merges = false;
  std::unordered_map<uint64_t, Merge> merges;  // (left id << 32 | right id)
  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache;
  static constexpr size_t kCacheLimit = 1 << 16;

  explicit Impl(TokenizerMetadata m, const std::string& source);
  void build_pieces();
  void encode_fragment(std::string_view text, bool at_text_start, std::vector<int32_t>& out) const;
  // Memoised per word: repeated words cost one hash lookup.
  void encode_cached(std::string_view word, std::vector<int32_t>& out) const;
  void encode_bpe_word(std::string_view word, std::vector<int32_t>& out) const;
  void encode_spm(std::string_view text, bool prefix_space, std::vector<int32_t>& out) const;
  void encode_spm_word(std::string_view word, std::vector<int32_t>& out) const;
  int32_t lookup(std::string_view text) const {
    auto it = ids.find(text);
    return it == ids.end() ? -1 : it->second;
  }
};

Tokenizer::Impl::Impl(TokenizerMetadata m, const std::string& source) : meta(std::move(m)) {
  validate_tokenizer_metadata(meta, source);
  byte_level = meta.model == "gpt2";
  const auto n = int32_t(meta.tokens.size());
  for (int pass = 0; pass < 2; ++pass)  // normal tokens first: they win duplicate texts
    for (int32_t id = 0; id < n; ++id)
      if ((meta.type_of(id) == TokenType::NORMAL) == (pass == 0)) ids.emplace(meta.tokens[size_t(id)], id);

  for (int32_t id = 0; id < n; ++id) {
    const TokenType type = meta.type_of(id);
    if (type == TokenType::CONTROL || type == TokenType::UNKNOWN)
      specials.add(meta.tokens[size_t(id)], id, /*control=*/true);
    else if (type == TokenType::USER_DEFINED)
      specials.add(meta.tokens[size_t(id)], id, /*control=*/false);
  }

  byte_tokens.fill(-1);
  if (byte_level) {
    const auto& chars = byte_level::byte_chars();
    for (int b = 0; b < 256; ++b) byte_tokens[size_t(b)] = lookup(chars[size_t(b)]);
    const PreTokenizerFamily* family = find_pre_tokenizer(meta.pre);
    if (!family) {
      std::string known;
      for (const auto& f : pre_tokenizer_families())
        for (std::string_view name : f.names) known += str_cat(known.empty() ? "" : ", ", name);
      fail(source, ": unknown pre-tokenizer tokenizer.ggml.pre = ", gguf::quoted(meta.pre),
           " (known: ", known, ")");
    }
    pre = std::make_unique<PreTokenizer>(*family);
    ignore_merges = family->ignore_merges;
    merges.reserve(meta.merges.size());
    for (size_t rank = 0; rank < meta.merges.size(); ++rank) {
      const std::string& merge = meta.merges[rank];
      const size_t space = merge.find(' ', 1);
      if (space == std::string::npos)
        fail(source, ": merge ", rank, " ", gguf::quoted(merge), " is not \"left right\"");
      const int32_t left = lookup(std::string_view(merge).substr(0, space));
      const int32_t right = lookup(std::string_view(merge).substr(space + 1));
      const int32_t result = lookup(merge.substr(0, space) + merge.substr(space + 1));
      if (left < 0 || right < 0 || result < 0) continue;  // cannot apply to this vocabulary
      merges.try_emplace(uint64_t(uint32_t(left)) << 32 | uint32_t(right),
                         Merge{int32_t(rank), result});
    }
  } else {
    spm_word_boundaries = std::none_of(meta.tokens.begin(), meta.tokens.end(), [](std::string_view t) {
      for (size_t pos = t.find(kSpmSpace, 1); pos != std::string_view::npos; pos = t.find(kSpmSpace, pos + 1))
        if (pos < kSpmSpace.size() || t.substr(pos - kSpmSpace.size(), kSpmSpace.size()) != kSpmSpace)
          return true;
      return false;
    });
    for (int32_t id = 0; id < n; ++id)
      if (meta.type_of(id) == TokenType::BYTE) {
        const int b = parse_byte_token(meta.tokens[size_t(id)]);
        if (b >= 0 && byte_tokens[size_t(b)] < 0) byte_tokens[size_t(b)] = id;
      }
  }

  end_of_generation.assign(size_t(n), false);
  for (int32_t id : {meta.eos, meta.eot, meta.eom})
    if (id >= 0) end_of_generation[size_t(id)] = true;
  for (int32_t id = 0; id < n; ++id) {
    const TokenType type = meta.type_of(id);
    if (type != TokenType::CONTROL && type != TokenType::USER_DEFINED) continue;
    for (std::string_view text : kEndOfGenerationTexts)
      if (meta.tokens[size_t(id)] == text) end_of_generation[size_t(id)] = true;
  }
  build_pieces();
}

void Tokenizer::Impl::build_pieces() {
  pieces.resize(meta.tokens.size());
  for (size_t id = 0; id < meta.tokens.size(); ++id) {
    const std::string& text = meta.tokens[id];
    const TokenType type = meta.type_of(int32_t(id));
    const int byte = type == TokenType::BYTE ? parse_byte_token(text) : -1;
    if (type != TokenType::NORMAL && type != TokenType::UNDEFINED && byte < 0)
      pieces[id] = text;  // special and user-defined tokens are stored as raw text
    else if (byte >= 0)
      pieces[id] = std::string(1, char(byte));
    else
      pieces[id] = byte_level ? byte_level_piece(text) : spm_piece(text);
  }
}

void Tokenizer::Impl::encode_cached(std::string_view word, std::vector<int32_t>& out) const {
  {
    std::lock_guard lock(cache_mutex);
    if (auto it = cache.find(word); it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  if (byte_level)
    encode_bpe_word(word, out);
  else
    encode_spm_word(word, out);
  std::lock_guard lock(cache_mutex);
  if (cache.size() >= kCacheLimit) cache.clear();
  cache.emplace(std::string(word), std::vector<int32_t>(out.begin() + ptrdiff_t(first), out.end()));
}

void Tokenizer::Impl::encode_bpe_word(std::string_view word, std::vector<int32_t>& out) const {
  if (ignore_merges) {
    std::string mapped;
    for (unsigned char c : word) mapped += byte_level::byte_chars()[c];
    if (const int32_t whole = lookup(mapped); whole >= 0) {
      out.push_back(whole);
      return;
    }
  }
  std::vector<Symbol> syms(word.size());
  for (size_t i = 0; i < word.size(); ++i)
    syms[i] = {byte_tokens[static_cast<unsigned char>(word[i])], uint32_t(i), 1, int32_t(i) - 1,
               i + 1 < word.size() ? int32_t(i + 1) : -1};
  merge_symbols(syms, [&](const Symbol& l, const Symbol& r) -> std::pair<double, int32_t> {
    if (l.id < 0 || r.id < 0) return {0, -1};
    auto it = merges.find(uint64_t(uint32_t(l.id)) << 32 | uint32_t(r.id));
    if (it == merges.end()) return {0, -1};
    return {it->second.rank, it->second.result};
  });
  for (const Symbol& s : syms)
    if (s.len > 0 && (s.id >= 0 || meta.unk >= 0)) out.push_back(s.id >= 0 ? s.id : meta.unk);
}

void Tokenizer::Impl::encode_spm_word(std::string_view word, std::vector<int32_t>& out) const {
  std::vector<Symbol> syms;
  char_symbols(word, syms);
  for (Symbol& s : syms) s.id = lookup(word.substr(s.start, s.len));
  merge_symbols(syms, [&](const Symbol& l, const Symbol& r) -> std::pair<double, int32_t> {
    const int32_t id = lookup(word.substr(l.start, l.len + r.len));
    if (id < 0) return {0, -1};
    return {meta.scores.empty() ? 0.0 : -double(meta.scores[size_t(id)]), id};
  });
  for (const Symbol& s : syms) {
    if (s.len == 0) continue;
    if (s.id >= 0) {
      out.push_back(s.id);
      continue;
    }
    // A character without a token: its bytes as <0xXX> tokens, else one unknown token.
    const std::string_view bytes = word.substr(s.start, s.len);
    const bool all_bytes = std::all_of(bytes.begin(), bytes.end(), [&](char c) {
      return byte_tokens[static_cast<unsigned char>(c)] >= 0;
    });
    if (all_bytes)
      for (char c : bytes) out.push_back(byte_tokens[static_cast<unsigned char>(c)]);
    else if (meta.unk >= 0)
      out.push_back(meta.unk);
  }
}

void Tokenizer::Impl::encode_spm(std::string_view raw, bool prefix_space,
                                 std::vector<int32_t>& out) const {
  std::string text;
  text.reserve(raw.size() + 8);
  if (prefix_space) text += kSpmSpace;
  for (char c : raw) {
    if (c == ' ')
      text += kSpmSpace;
    else
      text += c;
  }
  if (!spm_word_boundaries) {
    encode_spm_word(text, out);
    return;
  }
  // No token continues past a character into a following "▁", so words start at every "▁"
  // that follows another character, and merging word by word gives the same result.
  const std::string_view all(text);
  size_t word_start = 0;
  for (size_t pos = all.find(kSpmSpace, 1); pos != std::string_view::npos;
       pos = all.find(kSpmSpace, pos + kSpmSpace.size())) {
    if (pos >= kSpmSpace.size() && all.substr(pos - kSpmSpace.size(), kSpmSpace.size()) == kSpmSpace)
      continue;  // inside a run of spaces
    encode_cached(all.substr(word_start, pos - word_start), out);
    word_start = pos;
  }
  if (word_start < all.size()) encode_cached(all.substr(word_start), out);
}

void Tokenizer::Impl::encode_fragment(std::string_view text, bool after_special,
                                      std::vector<int32_t>& out) const {
  if (!byte_level) {
    encode_spm(text, meta.add_space_prefix && after_special, out);
    return;
  }
  std::vector<std::string_view> words;
  pre->split(text, words);
  for (std::string_view word : words) encode_cached(word, out);
}

Tokenizer Tokenizer::from_gguf(const gguf::File& file) {
  return from_metadata(read_tokenizer_metadata(file), file.path());
}

Tokenizer Tokenizer::from_metadata(TokenizerMetadata meta, const std::string& source) {
  return Tokenizer(std::make_unique<Impl>(std::move(meta), source));
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  const Impl& t = *impl_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special && t.meta.add_bos && t.meta.bos >= 0) out.push_back(t.meta.bos);
  // Cut the special tokens out (leftmost, then longest) and encode the text between them.
  bool after_special = true;  // the text start counts: SentencePiece adds its space prefix there
  size_t raw_start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (!t.specials.may_start(static_cast<unsigned char>(text[i]))) continue;
    const auto [id, len] = t.specials.longest_match(text.substr(i), parse_special);
    if (id < 0) continue;
    if (i > raw_start) t.encode_fragment(text.substr(raw_start, i - raw_start), after_special, out);
    out.push_back(id);
    after_special = true;
    raw_start = i + len;
    i = raw_start - 1;
  }
  if (raw_start < text.size()) t.encode_fragment(text.substr(raw_start), after_special, out);
  if (add_special && t.meta.add_eos && t.meta.eos >= 0) out.push_back(t.meta.eos);
  return out;
}

void Tokenizer::append_piece(int32_t id, std::string& out, bool& at_text_start) const {
  const Impl& t = *impl_;
  if (id < 0 || id >= n_vocab()) fail("token id ", id, " is outside the vocabulary of ", n_vocab());
  std::string_view piece = t.pieces[size_t(id)];
  if (t.meta.type_of(id) == TokenType::CONTROL) {  // bos/eos do not end the text start
    out += piece;
    return;
  }
  // SentencePiece's space prefix belongs to the encoding, not to the text.
  if (at_text_start && !t.byte_level && t.meta.add_space_prefix && !piece.empty() && piece[0] == ' ')
    piece.remove_prefix(1);
  at_text_start = false;
  out += piece;
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  bool at_text_start = true;
  for (int32_t id : ids) append_piece(id, out, at_text_start);
  return out;
}

std::string Tokenizer::token_to_piece(int32_t id) const {
  if (id < 0 || id >= n_vocab()) fail("token id ", id, " is outside the vocabulary of ", n_vocab());
  return impl_->pieces[size_t(id)];
}

const std::string& Tokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= n_vocab()) fail("token id ", id, " is outside the vocabulary of ", n_vocab());
  return impl_->meta.tokens[size_t(id)];
}

int Tokenizer::n_vocab() const { return int(impl_->meta.tokens.size()); }
int32_t Tokenizer::bos() const { return impl_->meta.bos; }
int32_t Tokenizer::eos() const { return impl_->meta.eos; }
bool Tokenizer::add_bos() const { return impl_->meta.add_bos && impl_->meta.bos >= 0; }
bool Tokenizer::is_end_of_generation(int32_t id) const {
  return id >= 0 && id < n_vocab() && impl_->end_of_generation[size_t(id)];
}
const std::string& Tokenizer::model_name() const { return impl_->meta.model; }
const std::string& Tokenizer::pre_name() const { return impl_->meta.pre; }
std::string Tokenizer::chat_template() const { return impl_->meta.chat_template; }
const TokenizerMetadata& Tokenizer::metadata() const { return impl_->meta; }

std::string StreamDecoder::push(int32_t id) {
  tok_.append_piece(id, pending_, at_text_start_);
  const size_t ready = utf8::complete_prefix(pending_);
  std::string out = utf8::sanitize(std::string_view(pending_).substr(0, ready));
  pending_.erase(0, ready);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = utf8::sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace minfer
