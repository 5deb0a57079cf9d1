// tokenizer.* GGUF metadata for the model writers: a small built-in byte-level BPE vocabulary for
// the `tiny` preset, or one taken from a vocab .gguf or a HF tokenizer directory, padded to the
// model's embedding rows.
#pragma once
#include <string>
#include <vector>

#include "convert/arch.h"
#include "tokenizer/vocab.h"

namespace minfer::convert {

// 256 byte tokens, BPE merges learned from a fixed English text, [PADn] fillers and the
// <|endoftext|>, <|im_start|>, <|im_end|> control tokens as the last three ids.
Metadata builtin_tokenizer(int n_vocab);

// `source` is a .gguf file (its tokenizer.* keys are copied) or a directory with a HF
// tokenizer.json. Token lists shorter than n_vocab are padded with unused [PADn] tokens; longer
// ones are an error.
Metadata load_tokenizer(const std::string& source, int n_vocab);
// The files load_tokenizer reads for `source` (writers refuse to replace them).
std::vector<std::string> tokenizer_source_files(const std::string& source);

// The tokenizer.* keys of `meta` as write_tokenizer_metadata writes them.
Metadata tokenizer_kv(const TokenizerMetadata& meta);

}  // namespace minfer::convert
