// The `spillfs` subcommands. Each Register* adds one subcommand to the app;
// its callback runs the command and returns the process exit status through
// the shared `exit_code`.
#pragma once

#include <CLI/CLI.hpp>

namespace spillfs::cli {

void RegisterMkfs(CLI::App& app, int* exit_code);
void RegisterMount(CLI::App& app, int* exit_code);
void RegisterUmount(CLI::App& app, int* exit_code);
void RegisterFsck(CLI::App& app, int* exit_code);
void RegisterStat(CLI::App& app, int* exit_code);
void RegisterLs(CLI::App& app, int* exit_code);
void RegisterDu(CLI::App& app, int* exit_code);
void RegisterTop(CLI::App& app, int* exit_code);

// Prints "spillfs COMMAND: MESSAGE" to stderr and returns 1.
int Fail(const std::string& command, const std::string& message);

}  // namespace spillfs::cli
