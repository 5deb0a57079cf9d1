#include "util/mmap.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "util/error.h"
#include "util/files.h"

namespace minfer {

namespace {

// The live mappings, for the SIGBUS handler. A signal handler may only read memory that is valid
// at every instant, so this is a fixed table published through atomics: a slot's path is written
// before its range, and the range is cleared before the memory is unmapped.
struct WatchedMapping {
  std::atomic<bool> taken{false};
  std::atomic<uintptr_t> begin{0}, end{0};
  char path[512] = {};
  size_t path_len = 0;
};
constexpr size_t kMaxWatchedMappings = 256;  // mappings beyond this keep the default SIGBUS action
WatchedMapping g_watched[kMaxWatchedMappings];
struct sigaction g_previous_sigbus {};

void write_stderr(const char* s, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= size_t(w);
  }
}

// Touching a page of a mapping past the end of its file raises SIGBUS: another program truncated
// or rewrote the file in place while it was mapped. That is bad input, not a bug in minfer: say so
// and exit like any other error. A SIGBUS anywhere else goes to the previous handler.
void on_sigbus(int sig, siginfo_t* info, void* context) {
  const uintptr_t addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (const WatchedMapping& w : g_watched) {
    const uintptr_t begin = w.begin.load(std::memory_order_acquire);
    if (begin == 0 || addr < begin || addr >= w.end.load(std::memory_order_acquire)) continue;
    static const char kPrefix[] = "minfer: error: ";
    static const char kSuffix[] =
        ": the file became shorter while minfer was reading it (another program truncated or "
        "rewrote it in place)\n";
    write_stderr(kPrefix, sizeof kPrefix - 1);
    write_stderr(w.path, w.path_len);
    write_stderr(kSuffix, sizeof kSuffix - 1);
    _exit(1);
  }
  if (g_previous_sigbus.sa_flags & SA_SIGINFO) {
    g_previous_sigbus.sa_sigaction(sig, info, context);
    return;
  }
  // Default or ignored before: restore it; the faulting access repeats and takes that action.
  sigaction(SIGBUS, &g_previous_sigbus, nullptr);
}

void install_sigbus_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &g_previous_sigbus);
  });
}

// Returns the slot watching [data, data + size), or nullptr when the table is full.
WatchedMapping* watch(const uint8_t* data, uint64_t size, const std::string& path) {
  install_sigbus_handler();
  for (WatchedMapping& w : g_watched) {
    bool expected = false;
    if (!w.taken.compare_exchange_strong(expected, true)) continue;
    w.path_len = std::min(path.size(), sizeof w.path);
    std::memcpy(w.path, path.data(), w.path_len);
    w.end.store(reinterpret_cast<uintptr_t>(data) + size, std::memory_order_release);
    w.begin.store(reinterpret_cast<uintptr_t>(data), std::memory_order_release);
    return &w;
  }
  return nullptr;
}

void unwatch(WatchedMapping* w) {
  if (!w) return;
  w->begin.store(0, std::memory_order_release);
  w->taken.store(false, std::memory_order_release);
}

}  // namespace

Mapping map_file(const std::string& path) {
  const RegularFile file(path);
  Mapping m;
  m.size = file.size();
  if (m.size == 0) return m;  // mmap rejects length 0; an empty file is simply zero bytes
  void* p = ::mmap(nullptr, m.size, PROT_READ, MAP_PRIVATE, file.fd(), 0);
  if (p == MAP_FAILED) fail(path, ": cannot map ", m.size, " bytes: ", std::strerror(errno));
  m.data = static_cast<const uint8_t*>(p);
  WatchedMapping* watched = watch(m.data, m.size, path);
  const uint64_t size = m.size;
  m.keep_alive = std::shared_ptr<const void>(p, [size, watched](const void* q) {
    unwatch(watched);
    ::munmap(const_cast<void*>(q), size);
  });
  return m;  // the mapping keeps its own reference to the file; the descriptor closes here
}

}  // namespace minfer
