// Helpers shared by the subcommands.
#pragma once
#include <CLI/CLI.hpp>
#include <cstddef>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "model/model.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"

namespace minfer::cli {

// For counts that may be 0: CLI11's NonNegativeNumber would print its upper end as a 309-digit
// number; this range prints an int.
inline const CLI::Range kNonNegativeInt(0, std::numeric_limits<int>::max());

// --temp, --top-k, --top-p, --min-p, penalties, --seed: the options every generating command has.
// Once parsing is done they are checked with SamplerParams::validate, and --seed with parse_seed,
// so that errors name the flag: "--top-p 2 is out of range: top_p must be in (0, 1]".
void add_sampler_options(CLI::App& app, SamplerParams& sp);

// --seed: a decimal integer in [0, 2^64 - 1] (parse_seed), never wrapped or saturated.
void add_seed_option(CLI::App& app, uint64_t& seed, const std::string& help);

// -t/--threads: 0 (all cores) up to the number of hardware threads; more only slows down.
void add_threads_option(CLI::App& app, int& n_threads);

// `given` when non-empty; else the embedded default model (models/default.gguf), or, in a tree
// without one, a tiny random model synthesized once into the user's cache.
std::string resolve_model_path(const std::string& given);

// The ids that end a generation (eos, eot, <|im_end|>, ...) among those the model can produce.
std::vector<int32_t> end_of_generation_tokens(const Model& model, const Tokenizer& tok);
// Writes to stdout and flushes at once (generated text streams); a failed write (a full disk,
// a closed pipe) throws, so that output that never arrived cannot end in exit status 0. main()
// checks stdout once more after every command for what was printed with printf.
void print(std::string_view text);

// The longest line `chat` takes from stdin: far above any context window, small enough that
// input without newlines (a binary file, /dev/zero) ends in an error, not in unbounded memory.
inline constexpr size_t kMaxInputLineBytes = size_t(1) << 20;

// One line of stdin without its newline; std::nullopt at the end of input. Throws for a line
// longer than max_bytes and for a read error.
std::optional<std::string> read_stdin_line(size_t max_bytes = kMaxInputLineBytes);

}  // namespace minfer::cli
