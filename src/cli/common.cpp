#include "cli/common.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "convert/synth.h"

namespace minfer::cli {

namespace fs = std::filesystem;

std::string resolve_model_path(const std::string& given) {
  if (!given.empty()) return given;
  const fs::path embedded = fs::path(MINFER_SOURCE_DIR) / "models" / "default.gguf";
  if (fs::exists(embedded)) return embedded.string();
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const fs::path cache = (xdg && *xdg) ? fs::path(xdg) : fs::path(home ? home : "/tmp") / ".cache";
  const fs::path path = cache / "minfer" / "tiny-f16.gguf";
  if (fs::exists(path)) return path.string();
  std::fprintf(stderr, "minfer: no -m given and no models/default.gguf; synthesizing the tiny "
                       "preset (random weights) into %s\n", path.c_str());
  fs::create_directories(path.parent_path());
  synth::Options opts;
  opts.preset = "tiny";
  opts.ftype = synth::FileType::F16;
  // Written under a unique name and renamed, so an interrupted run never leaves a broken file.
  const fs::path tmp = path.string() + ".tmp" + std::to_string(getpid());
  opts.out_path = tmp.string();
  synth::write_model(opts);
  fs::rename(tmp, path);
  return path.string();
}

}  // namespace minfer::cli
