// mount.fuse.spillfs: the helper mount(8) runs for `mount -t fuse.spillfs`
// and for fstab lines of that type. It is the spillfs binary under another
// name (a symlink installed in sbin/); main.cc sends it here.
//
// mount(8) calls it as
//   mount.fuse.spillfs VOLUME MOUNTPOINT [-sfnv] [-N NS] [-o OPTIONS] [-t TYPE]
// and this turns the call into `spillfs mount VOLUME MOUNTPOINT ...`, so the
// mount options are exactly `spillfs mount`'s long options, spelled with
// underscores: `-o ram_tier=8G,no_dedup` is `--ram-tier 8G --no-dedup`. The
// table is read from the mount subcommand itself, so the two cannot drift.
// Options FUSE takes (allow_other, ro, nosuid ...) go to the daemon's -o;
// options only mount(8) reads (defaults, _netdev, nofail, x-* ...) are
// dropped. Anything else is refused, naming the option (with -s, sloppy,
// it is dropped with a warning instead).
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "commands.h"

namespace spillfs::cli {
namespace {

constexpr std::string_view kHelper = "mount.fuse.spillfs";

// Options of mount(8) and of fstab that are not for the filesystem.
bool IsUserspaceOnly(std::string_view name) {
  static const std::set<std::string_view> kNames = {"defaults", "auto",   "noauto", "nofail", "_netdev",
                                                    "user",     "nouser", "users",  "owner",  "group",
                                                    "comment",  "loud",   "silent", "rw"};
  return kNames.count(name) > 0 || name.starts_with("x-");
}

// Mount options libfuse's mount accepts (the kernel's generic ones and FUSE's).
bool IsFuseOption(std::string_view name) {
  static const std::set<std::string_view> kNames = {
      "ro",      "dev",         "nodev",      "suid",       "nosuid",      "exec",         "noexec",
      "atime",   "noatime",     "relatime",   "norelatime", "strictatime", "sync",         "async",
      "dirsync", "allow_other", "allow_root", "max_read",   "blksize",     "auto_unmount", "default_permissions"};
  return kNames.count(name) > 0;
}

std::string Usage() {
  return fmt::format(
      "usage: {} VOLUME MOUNTPOINT [-sfnv] [-o OPTIONS]\n"
      "  OPTIONS are `spillfs mount`'s long options with '_' for '-' (ram_tier=8G,no_dedup,...),\n"
      "  FUSE's mount options (allow_other, ro, nosuid, ...) and mount(8)'s (defaults, _netdev, ...)",
      kHelper);
}

int Refuse(const std::string& message) {
  fmt::print(stderr, "{}: {}\n", kHelper, message);
  return 1;
}

}  // namespace

int MountHelperMain(int argc, char** argv, const DaemonHooks& hooks) {
  std::vector<std::string> positional;
  std::vector<std::string> option_lists;
  bool fake = false, sloppy = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      fmt::print("{}\n", Usage());
      return 0;
    }
    if (arg == "-o" || arg == "-t" || arg == "-N") {
      if (i + 1 >= argc) return Refuse(fmt::format("{} needs a value\n{}", arg, Usage()));
      if (arg == "-o") option_lists.emplace_back(argv[i + 1]);
      if (arg == "-t" && std::string_view(argv[i + 1]) != "fuse.spillfs" &&
          std::string_view(argv[i + 1]) != "spillfs") {
        return Refuse(fmt::format("cannot mount type '{}': this is the helper of fuse.spillfs", argv[i + 1]));
      }
      if (arg == "-N") return Refuse("mounting into another namespace (-N) is not supported");
      ++i;
    } else if (arg.starts_with("-o") && arg.size() > 2) {
      option_lists.emplace_back(arg.substr(2));
    } else if (arg.size() > 1 && arg[0] == '-' && arg.find_first_not_of("sfnv", 1) == std::string_view::npos) {
      fake |= arg.find('f') != std::string_view::npos;  // -f: do everything but mount
      sloppy |= arg.find('s') != std::string_view::npos;
      // -n (no /etc/mtab) and -v (verbose) change nothing here.
    } else if (arg.size() > 1 && arg[0] == '-') {
      return Refuse(fmt::format("unknown argument '{}'\n{}", arg, Usage()));
    } else {
      positional.emplace_back(arg);
    }
  }
  if (positional.size() != 2) return Refuse(Usage());

  // The mount subcommand's long options, as mount options.
  CLI::App app;
  int unused = 0;
  RegisterMount(app, &unused, hooks);
  CLI::App* mount = app.get_subcommand("mount");
  std::vector<std::string> args = {"spillfs", "mount", positional[0], positional[1]};
  std::string fuse_options;
  for (const auto& list : option_lists) {
    size_t start = 0;
    while (start <= list.size()) {
      size_t end = list.find(',', start);
      if (end == std::string::npos) end = list.size();
      std::string item = list.substr(start, end - start);
      start = end + 1;
      if (item.empty()) continue;
      const size_t eq = item.find('=');
      const std::string name = item.substr(0, eq);
      const bool has_value = eq != std::string::npos;
      const std::string value = has_value ? item.substr(eq + 1) : "";
      if (IsUserspaceOnly(name)) continue;
      if (IsFuseOption(name)) {
        fuse_options += (fuse_options.empty() ? "" : ",") + item;
        continue;
      }
      std::string flag = "--" + name;
      std::replace(flag.begin() + 2, flag.end(), '_', '-');
      const CLI::Option* option = name.empty() || name.find('-') != std::string::npos || flag == "--help"
                                      ? nullptr
                                      : mount->get_option_no_throw(flag);
      if (option == nullptr || option->get_lnames().empty()) {
        if (sloppy) {
          fmt::print(stderr, "{}: ignoring unknown mount option '{}'\n", kHelper, name);
          continue;
        }
        return Refuse(fmt::format("unknown mount option '{}'\n{}", name, Usage()));
      }
      const bool is_flag = option->get_expected_min() == 0;
      if (is_flag && has_value) return Refuse(fmt::format("mount option '{}' takes no value", name));
      if (!is_flag && !has_value) return Refuse(fmt::format("mount option '{}' needs a value ({}=...)", name, name));
      args.push_back(flag);
      if (!is_flag) args.push_back(value);
    }
  }
  if (!fuse_options.empty()) {
    args.push_back("-o");
    args.push_back(fuse_options);
  }
  if (fake) return 0;
  std::vector<char*> argv_out;
  for (auto& a : args) argv_out.push_back(a.data());
  argv_out.push_back(nullptr);
  return Main(static_cast<int>(args.size()), argv_out.data(), hooks);
}

bool IsMountHelperName(const char* argv0) {
  const char* slash = std::strrchr(argv0, '/');
  return std::string_view(slash ? slash + 1 : argv0).starts_with("mount.");
}

}  // namespace spillfs::cli
