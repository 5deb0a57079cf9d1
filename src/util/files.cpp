#include "util/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "util/error.h"

namespace minfer {

namespace fs = std::filesystem;

namespace {

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "is a directory";
  if (S_ISFIFO(mode)) return "is a named pipe (FIFO)";
  if (S_ISCHR(mode)) return "is a character device";
  if (S_ISBLK(mode)) return "is a block device";
  if (S_ISSOCK(mode)) return "is a socket";
  return "is not a regular file";
}

[[noreturn]] void fail_not_regular(const std::string& path, mode_t mode) {
  fail(path, ": ", kind_of(mode), "; minfer reads and writes only regular files");
}

}  // namespace

RegularFile::RegularFile(const std::string& path) {
  // stat() first: opening a device can have effects of its own, and a FIFO blocks in open().
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail(path, ": cannot open: ", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail_not_regular(path, st.st_mode);
  // O_NONBLOCK because the path may have been replaced by a FIFO since the stat().
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd_ < 0) fail(path, ": cannot open: ", std::strerror(errno));
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    fail(path, ": cannot stat: ", std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    fail_not_regular(path, st.st_mode);
  }
  size_ = uint64_t(st.st_size);
}

RegularFile::~RegularFile() { ::close(fd_); }

std::string read_file(const std::string& path, uint64_t max_bytes) {
  const RegularFile file(path);
  auto too_large = [&](uint64_t n) {
    fail(path, ": ", n, " bytes is more than minfer reads from one text file (", max_bytes, " bytes)");
  };
  if (file.size() > max_bytes) too_large(file.size());
  std::string out;
  out.reserve(size_t(file.size()));
  char buf[1 << 16];
  // Read to the end rather than to the size stat() saw: the file may still be growing.
  while (true) {
    const ssize_t n = ::read(file.fd(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(path, ": read failed: ", std::strerror(errno));
    if (n == 0) break;
    out.append(buf, size_t(n));
    if (out.size() > max_bytes) too_large(out.size());
  }
  return out;
}

void refuse_to_overwrite_inputs(const std::string& output, const std::vector<std::string>& inputs) {
  for (const std::string& input : inputs) {
    std::error_code ec;  // set when either path does not exist: then they are not the same file
    if (fs::equivalent(input, output, ec))
      fail("the output ", output, " is the input ", input, " (same file); writing it would destroy the input");
  }
}

OutputFile::OutputFile(const std::string& target) : target_(target), final_path_(target) {
  struct stat st {};
  const bool exists = ::stat(target.c_str(), &st) == 0;
  if (!exists && errno != ENOENT) fail(target, ": cannot create: ", std::strerror(errno));
  if (exists && !S_ISREG(st.st_mode)) fail_not_regular(target, st.st_mode);
  struct stat link {};
  if (::lstat(target.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
    std::error_code ec;
    final_path_ = fs::weakly_canonical(target, ec).string();
    if (ec) fail(target, ": cannot resolve the symbolic link: ", ec.message());
  }

  const fs::path final_path(final_path_);
  static std::atomic<unsigned> counter{0};
  int fd = -1;
  while (fd < 0) {
    temp_path_ = (final_path.parent_path() / (final_path.filename().string() + ".minfer-tmp-" +
                                              std::to_string(::getpid()) + "-" + std::to_string(counter++)))
                     .string();
    fd = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) {
      const int err = errno;
      temp_path_.clear();  // nothing was created
      fail(target, ": cannot create a file in its directory: ", std::strerror(err));
    }
  }
  if (exists) (void)::fchmod(fd, st.st_mode & 07777);  // best effort: the new file looks like the old one
  stream_ = ::fdopen(fd, "wb");
  if (!stream_) {  // the destructor will not run: remove what this constructor created
    const int err = errno;
    ::close(fd);
    ::unlink(temp_path_.c_str());
    fail(target, ": cannot open a stream: ", std::strerror(err));
  }
}

OutputFile::~OutputFile() {
  if (stream_) std::fclose(stream_);
  if (!temp_path_.empty()) ::unlink(temp_path_.c_str());
}

void OutputFile::write(const void* data, size_t n) {
  if (!stream_) fail(target_, ": write after commit");
  if (n && std::fwrite(data, 1, n, stream_) != n) fail(target_, ": write failed: ", std::strerror(errno));
}

void OutputFile::commit() {
  if (!stream_) fail(target_, ": commit twice");
  std::FILE* f = std::exchange(stream_, nullptr);
  const bool flushed = std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  const int flush_err = errno;
  const bool closed = std::fclose(f) == 0;
  if (!flushed || !closed) fail(target_, ": write failed: ", std::strerror(flushed ? errno : flush_err));
  if (::rename(temp_path_.c_str(), final_path_.c_str()) != 0)
    fail(target_, ": cannot replace it with the new file: ", std::strerror(errno));
  temp_path_.clear();
}

}  // namespace minfer
