// Subcommand registry: each src/cli/cmd_*.cpp registers itself, so adding a command touches one
// file. main() dispatches on argv[1] and prints minfer::Error messages as one line.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace minfer::cli {

using CommandFn = std::function<int(int argc, char** argv)>;  // argv[0] is the command name

struct Command {
  std::string name;
  std::string summary;
  CommandFn run;
};

std::vector<Command>& registry();

struct Register {
  Register(std::string name, std::string summary, CommandFn fn) {
    registry().push_back({std::move(name), std::move(summary), std::move(fn)});
  }
};

}  // namespace minfer::cli
