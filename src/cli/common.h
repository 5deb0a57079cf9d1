// Helpers shared by the subcommands.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "sampling/sampler.h"

namespace minfer::cli {

// --temp, --top-k, --top-p, --min-p, penalties, --seed: the options every generating command has.
void add_sampler_options(CLI::App& app, SamplerParams& sp);

// `given` when non-empty; else the embedded default model (models/default.gguf), or, in a tree
// without one, a tiny random model synthesized once into the user's cache.
std::string resolve_model_path(const std::string& given);

}  // namespace minfer::cli
