// Helpers shared by the subcommands.
#pragma once
#include <string>

namespace minfer::cli {

// `given` when non-empty; else the embedded default model (models/default.gguf), or, in a tree
// without one, a tiny random model synthesized once into the user's cache.
std::string resolve_model_path(const std::string& given);

}  // namespace minfer::cli
