// Reading and writing files named by an untrusted user or file without losing data, hanging or
// growing without bound:
// - readers take regular files only and find out before anything can block (a FIFO blocks in a
//   plain open() until a writer appears; /dev/zero never ends);
// - writers write a temporary file beside the target and rename it over the target only after a
//   complete, flushed write, so the target is either untouched or entirely new, and a process that
//   has the old file mapped keeps reading the old bytes; they never truncate or delete a path they
//   did not create;
// - "same file" means same device and inode, never equal strings.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace minfer {

// The largest text file minfer reads whole (perplexity text, config.json, tokenizer.json, chat
// templates): far above real inputs (a 262k-token tokenizer.json is 33 MB), far below the memory
// a parsed copy would need on a small machine.
inline constexpr uint64_t kMaxTextFileBytes = uint64_t(256) << 20;

// An open, regular file: the descriptor and its size. Owns the descriptor.
class RegularFile {
 public:
  // Opens without blocking and refuses anything but a regular file, naming what it is instead
  // ("is a directory", "is a named pipe (FIFO)", ...). Throws minfer::Error naming the path.
  explicit RegularFile(const std::string& path);
  ~RegularFile();
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;

  int fd() const { return fd_; }
  uint64_t size() const { return size_; }

 private:
  int fd_ = -1;
  uint64_t size_ = 0;
};

// The whole file as bytes; a file larger than max_bytes is refused with the numbers.
std::string read_file(const std::string& path, uint64_t max_bytes = kMaxTextFileBytes);

// Fails before anything is written when `output` is the same file (device and inode; through
// symlinks and hard links) as one of `inputs`. Inputs that do not exist are ignored.
void refuse_to_overwrite_inputs(const std::string& output, const std::vector<std::string>& inputs);

// A file being written: created as a temporary file beside `target` (so the rename stays on one
// file system); commit() flushes it to disk and renames it over the target. Destroyed without
// commit(), it removes the temporary file and leaves the target as it was. An existing target
// must be a regular file (a symlink to one is followed: the file it points to is replaced); its
// permission bits carry over to the new file.
class OutputFile {
 public:
  explicit OutputFile(const std::string& target);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  // Throws minfer::Error naming the target and the system's reason (ENOSPC, EIO, ...).
  void write(const void* data, size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  void commit();
  const std::string& target() const { return target_; }

 private:
  std::string target_;      // as the caller named it, for messages
  std::string final_path_;  // what the rename replaces (the target, or the file a symlink names)
  std::string temp_path_;
  std::FILE* stream_ = nullptr;
};

}  // namespace minfer
