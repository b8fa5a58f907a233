// The `spillfs` subcommands. Each Register* adds one subcommand to the app;
// its callback runs the command and returns the process exit status through
// the shared `exit_code`.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <utility>

#include "spillfs/fuse/fuse_daemon.h"
#include "spillfs/store/volume.h"

namespace spillfs::cli {

// Test seams of the mounted daemon. The spillfs binary leaves them empty; the
// test-only spillfs-faulty (testing/spillfs_faulty_main.cc), built from these
// same sources, fills them in: the power-cut journals around the volume, a
// RAM tier that runs out of memory.
struct DaemonHooks {
  Volume::Wrappers volume = {};
  BufferPool::SlabFault ram_tier_slab_fault = nullptr;
};

// The whole command line: parses argv and runs the subcommand; the exit
// status.
int Main(int argc, char** argv, const DaemonHooks& hooks = {});

// mount.fuse.spillfs, the helper of mount(8) (mount_helper.cc): turns
// `VOLUME MOUNTPOINT -o name=value,...` into `spillfs mount` and runs it.
int MountHelperMain(int argc, char** argv, const DaemonHooks& hooks = {});

// Whether argv[0] names the mount helper (mount.fuse.spillfs, mount.spillfs).
bool IsMountHelperName(const char* argv0);

void RegisterMkfs(CLI::App& app, int* exit_code);
void RegisterMount(CLI::App& app, int* exit_code, const DaemonHooks& hooks = {});
void RegisterUmount(CLI::App& app, int* exit_code);
void RegisterFsck(CLI::App& app, int* exit_code);
void RegisterStat(CLI::App& app, int* exit_code);
void RegisterLs(CLI::App& app, int* exit_code);
void RegisterDu(CLI::App& app, int* exit_code);
void RegisterTop(CLI::App& app, int* exit_code);

// Adds subcommand `name`; its options bind to the returned Args (kept alive by
// the callback), and its callback stores run(args) in *exit_code.
template <typename Args, typename Run>
std::pair<CLI::App*, std::shared_ptr<Args>> AddCommand(CLI::App& app, const char* name, const char* help,
                                                       int* exit_code, Run run) {
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(name, help);
  cmd->callback([args, exit_code, run] { *exit_code = run(*args); });
  return {cmd, args};
}

// Prints "spillfs COMMAND: MESSAGE" to stderr and returns 1.
int Fail(const std::string& command, const std::string& message);

}  // namespace spillfs::cli
