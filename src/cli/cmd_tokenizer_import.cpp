// `minfer tokenizer-import DIR -o vocab.gguf [--vocab-size N]`: a HF tokenizer directory
// (tokenizer.json + tokenizer_config.json) as a tensor-less GGUF vocabulary file.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "cli/command.h"
#include "cli/common.h"
#include "gguf/gguf.h"
#include "tokenizer/hf_import.h"
#include "util/files.h"

namespace {

int run_tokenizer_import(int argc, char** argv) {
  CLI::App app{"Convert a HF tokenizer directory into a vocab-only GGUF file", "minfer tokenizer-import"};
  std::string dir, out_path;
  int vocab_size = 0;
  app.add_option("DIR", dir, "directory with tokenizer.json (and tokenizer_config.json)")->required();
  app.add_option("-o,--output", out_path, "GGUF file to write")->required();
  app.add_option("--vocab-size", vocab_size, "pad with unused [PADn] tokens to this many tokens")
      ->check(minfer::cli::kNonNegativeInt);
  CLI11_PARSE(app, argc, argv);

  minfer::refuse_to_overwrite_inputs(out_path, minfer::hf_tokenizer_files(dir));
  const minfer::TokenizerMetadata meta = minfer::import_hf_tokenizer(dir, vocab_size);
  minfer::gguf::Writer writer(out_path);
  minfer::write_tokenizer_metadata(writer, meta);
  writer.begin_data();
  writer.finish();

  size_t added = 0, unused = 0;
  for (size_t id = 0; id < meta.tokens.size(); ++id) {
    const auto type = meta.type_of(int32_t(id));
    added += type == minfer::TokenType::CONTROL || type == minfer::TokenType::USER_DEFINED;
    unused += type == minfer::TokenType::UNUSED;
  }
  std::printf("%s: %zu tokens (%zu added, %zu unused), %zu merges, pre-tokenizer %s, bos %d, eos %d%s\n",
              out_path.c_str(), meta.tokens.size(), added, unused, meta.merges.size(),
              meta.pre.c_str(), meta.bos, meta.eos,
              meta.chat_template.empty() ? "" : ", with chat template");
  return 0;
}

const minfer::cli::Register registration("tokenizer-import",
                                          "convert a HF tokenizer.json directory into a vocab GGUF",
                                          run_tokenizer_import);

}  // namespace
