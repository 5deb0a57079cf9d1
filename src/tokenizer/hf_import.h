// Import of a Hugging Face tokenizer directory (tokenizer.json + optional tokenizer_config.json)
// into GGUF tokenizer metadata. Used by `minfer tokenizer-import`, `minfer convert` and
// `minfer synth --tokenizer DIR`; write the result with write_tokenizer_metadata (vocab.h).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/vocab.h"

namespace minfer {

// Supports byte-level BPE tokenizers (model type BPE with a ByteLevel pre-tokenizer or decoder)
// whose split regexes are one of the known pre-tokenizer families (pretokenize.h). Added tokens
// become CONTROL when "special" and USER_DEFINED otherwise; id gaps are filled with unused
// "[PADn]" tokens, and so is the tail up to `pad_to_vocab` (0 = no padding; smaller than the
// token count is an error). Throws naming the file and the offending item.
TokenizerMetadata import_hf_tokenizer(const std::string& dir, int pad_to_vocab = 0);

// The files import_hf_tokenizer reads from `dir`, present or not (writers refuse to replace them).
std::vector<std::string> hf_tokenizer_files(const std::string& dir);

// A JSON file of a HF directory (config.json, tokenizer.json, ...), read with read_file's limits;
// throws naming the file for a non-regular or oversized file and for invalid JSON.
nlohmann::json read_json_file(const std::string& path);

// Appends unused "[PADn]" tokens until there are n_vocab tokens; throws when there are more.
void pad_tokenizer_vocab(TokenizerMetadata& meta, int n_vocab, const std::string& source);

}  // namespace minfer
