// Import of a Hugging Face tokenizer directory (tokenizer.json + optional tokenizer_config.json)
// into GGUF tokenizer metadata. Used by `minfer tokenizer-import`, `minfer convert` and
// `minfer synth --tokenizer DIR`; write the result with write_tokenizer_metadata (vocab.h).
#pragma once
#include <string>

#include "tokenizer/vocab.h"

namespace minfer {

// Supports byte-level BPE tokenizers (model type BPE with a ByteLevel pre-tokenizer or decoder)
// whose split regexes are one of the known pre-tokenizer families (pretokenize.h). Added tokens
// become CONTROL when "special" and USER_DEFINED otherwise; id gaps are filled with unused
// "[PADn]" tokens, and so is the tail up to `pad_to_vocab` (0 = no padding; smaller than the
// token count is an error). Throws naming the file and the offending item.
TokenizerMetadata import_hf_tokenizer(const std::string& dir, int pad_to_vocab = 0);

// Appends unused "[PADn]" tokens until there are n_vocab tokens; throws when there are more.
void pad_tokenizer_vocab(TokenizerMetadata& meta, int n_vocab, const std::string& source);

}  // namespace minfer
