// Read-only whole-file memory mapping: model files are many GB, and mapping lets the page cache
// serve tensor data without copying it into the process.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace minfer {

struct Mapping {
  const uint8_t* data = nullptr;  // null for an empty file
  uint64_t size = 0;
  std::shared_ptr<const void> keep_alive;  // unmaps when the last owner goes
};

// Maps a regular file (anything else is refused before it can block: see RegularFile). Throws
// minfer::Error naming the path and the system's reason. If the file shrinks while mapped (another
// program truncates or rewrites it in place), touching the lost pages raises SIGBUS; the first call
// installs a handler that turns that into "minfer: error: PATH: the file became shorter ..." and
// exit status 1 instead of a crash (SIGBUS outside a mapping keeps its previous action).
Mapping map_file(const std::string& path);

}  // namespace minfer
