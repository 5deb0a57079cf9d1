// Helpers shared by the subcommands.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "model/model.h"
#include "sampling/sampler.h"
#include "tokenizer/tokenizer.h"

namespace minfer::cli {

// --temp, --top-k, --top-p, --min-p, penalties, --seed: the options every generating command has.
void add_sampler_options(CLI::App& app, SamplerParams& sp);

// `given` when non-empty; else the embedded default model (models/default.gguf), or, in a tree
// without one, a tiny random model synthesized once into the user's cache.
std::string resolve_model_path(const std::string& given);

// The ids that end a generation (eos, eot, <|im_end|>, ...) among those the model can produce.
std::vector<int32_t> end_of_generation_tokens(const Model& model, const Tokenizer& tok);

}  // namespace minfer::cli
