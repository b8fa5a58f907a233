// spillfs: make, mount and inspect spillfs volumes.
#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include "commands.h"

namespace spillfs::cli {

int Fail(const std::string& command, const std::string& message) {
  fmt::print(stderr, "spillfs {}: {}\n", command, message);
  return 1;
}

}  // namespace spillfs::cli

int main(int argc, char** argv) {
  CLI::App app{"spillfs: a filesystem that gives activations and feature tables a home on SSD"};
  app.set_version_flag("--version", std::string("spillfs ") + SPILLFS_VERSION);
  app.require_subcommand(1);
  int exit_code = 0;
  spillfs::cli::RegisterMkfs(app, &exit_code);
  spillfs::cli::RegisterMount(app, &exit_code);
  spillfs::cli::RegisterUmount(app, &exit_code);
  spillfs::cli::RegisterFsck(app, &exit_code);
  spillfs::cli::RegisterStat(app, &exit_code);
  spillfs::cli::RegisterLs(app, &exit_code);
  spillfs::cli::RegisterDu(app, &exit_code);
  spillfs::cli::RegisterTop(app, &exit_code);
  CLI11_PARSE(app, argc, argv);
  return exit_code;
}
