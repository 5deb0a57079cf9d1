#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>

#include "cli/command.h"
#include "util/error.h"

namespace minfer::cli {
std::vector<Command>& registry() {
  static std::vector<Command> commands;
  return commands;
}
}  // namespace minfer::cli

static void usage() {
  auto cmds = minfer::cli::registry();
  std::sort(cmds.begin(), cmds.end(), [](auto& a, auto& b) { return a.name < b.name; });
  std::fprintf(stderr, "usage: minfer COMMAND [options]   (minfer COMMAND --help)\n\ncommands:\n");
  for (auto& c : cmds) std::fprintf(stderr, "  %-16s %s\n", c.name.c_str(), c.summary.c_str());
}

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage();
    return argc < 2 ? 1 : 0;
  }
  for (auto& c : minfer::cli::registry()) {
    if (c.name != argv[1]) continue;
    try {
      const int status = c.run(argc - 1, argv + 1);
      // What printf wrote may still sit in the buffer: a full disk must not end in status 0.
      const bool flushed = std::fflush(stdout) == 0;
      if (!flushed || std::ferror(stdout))
        minfer::fail("writing to standard output failed", flushed ? "" : ": ", flushed ? "" : std::strerror(errno));
      return status;
    } catch (const minfer::Error& e) {
      std::fprintf(stderr, "minfer %s: error: %s\n", argv[1], e.what());
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "minfer %s: internal error: %s\n", argv[1], e.what());
      return 2;
    }
  }
  std::fprintf(stderr, "minfer: unknown command '%s'\n\n", argv[1]);
  usage();
  return 1;
}
