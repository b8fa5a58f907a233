// The spillfs command line (main.cc for the product, testing/
// spillfs_faulty_main.cc for the test-only daemon).
#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include "commands.h"

namespace spillfs::cli {

int Fail(const std::string& command, const std::string& message) {
  fmt::print(stderr, "spillfs {}: {}\n", command, message);
  return 1;
}

int Main(int argc, char** argv, const DaemonHooks& hooks) {
  CLI::App app{"spillfs: a filesystem that gives activations and feature tables a home on SSD"};
  app.set_version_flag("--version", std::string("spillfs ") + SPILLFS_VERSION);
  app.require_subcommand(1);
  int exit_code = 0;
  RegisterMkfs(app, &exit_code);
  RegisterMount(app, &exit_code, hooks);
  RegisterUmount(app, &exit_code);
  RegisterFsck(app, &exit_code);
  RegisterStat(app, &exit_code);
  RegisterLs(app, &exit_code);
  RegisterDu(app, &exit_code);
  RegisterTop(app, &exit_code);
  CLI11_PARSE(app, argc, argv);
  return exit_code;
}

}  // namespace spillfs::cli
