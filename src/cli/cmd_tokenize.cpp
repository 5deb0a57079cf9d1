// `minfer tokenize -m FILE -p TEXT [--ids] [--special]`: the token ids of a text under the
// tokenizer stored in any GGUF file (a model or a vocab-only file).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "cli/command.h"
#include "cli/common.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace {

// The piece in single quotes, with control characters, quotes and bytes that are not valid UTF-8
// escaped, so that every token is visible on one line.
std::string quote_piece(std::string_view piece) {
  std::string out = "'";
  for (size_t i = 0; i < piece.size();) {
    const size_t len = minfer::utf8::char_len(piece.substr(i));
    const auto c = static_cast<unsigned char>(piece[i]);
    if (len > 1 || (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\')) {
      out.append(piece, i, len);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\'' || c == '\\') {
      out += '\\';
      out += char(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
    i += len;
  }
  return out + "'";
}

int run_tokenize(int argc, char** argv) {
  CLI::App app{"Print the tokens of a text under a GGUF file's tokenizer", "minfer tokenize"};
  std::string model, prompt;
  bool ids_only = false, parse_special = false, no_add_special = false;
  app.add_option("-m,--model", model, "GGUF file (a model or a vocab-only file); default model if omitted");
  app.add_option("-p,--prompt", prompt, "text to tokenize")->required();
  app.add_flag("--ids", ids_only, "print only the ids, space-separated on one line");
  app.add_flag("--special", parse_special, "turn special-token text such as <|im_start|> into its id");
  app.add_flag("--no-add-special", no_add_special, "do not add BOS/EOS even where the metadata asks");
  CLI11_PARSE(app, argc, argv);

  const auto file = minfer::gguf::File::open(minfer::cli::resolve_model_path(model));
  const auto tok = minfer::Tokenizer::from_gguf(file);
  const auto ids = tok.encode(prompt, !no_add_special, parse_special);
  if (ids_only) {
    std::string line;
    for (int32_t id : ids) line += (line.empty() ? "" : " ") + std::to_string(id);
    std::printf("%s\n", line.c_str());
  } else {
    for (int32_t id : ids) std::printf("%6d %s\n", id, quote_piece(tok.token_to_piece(id)).c_str());
  }
  return 0;
}

const minfer::cli::Register registration("tokenize", "print the token ids of a text", run_tokenize);

}  // namespace
