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

// Throws minfer::Error naming the path and the system's reason.
Mapping map_file(const std::string& path);

}  // namespace minfer
