// spillfs stat MOUNTPOINT|VOLUME [--json]
// spillfs ls [-l] [-d] [--extents] [--json] [--volume VOLUME] PATH...
// spillfs du [--json] [--volume VOLUME] PATH
// spillfs top MOUNTPOINT [--interval S] [--count N]
//
// A path inside a mounted spillfs is answered by the daemon through the mount's
// control file (MOUNTPOINT/.spillfs/control). An unmounted volume directory is
// opened read-only and answered by an Inspector in this process; with
// --volume, PATHs name paths inside that volume ("/" is its root). A mounted
// volume's directory is refused: its index belongs to the daemon, and the
// mount point answers instead.
#include <fmt/format.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "sizes.h"
#include "spillfs/common/control_protocol.h"
#include "spillfs/common/mountinfo.h"
#include "spillfs/common/stat_keys.h"
#include "spillfs/inspect/inspector.h"
#include "spillfs/store/volume.h"

namespace spillfs::cli {
namespace {

using nlohmann::json;

std::string Dump(const json& value, int indent = 2) {
  return value.dump(indent, ' ', false, json::error_handler_t::replace);
}

// ---- where a path lives ----

struct Target {
  bool mounted = false;
  std::string mountpoint;  // mounted only
  std::string volume;      // the volume directory (a mount's source when mounted)
  std::string rel = "/";   // the path inside the volume
};

std::string Canonical(const std::string& path) {
  char buf[PATH_MAX];
  if (realpath(path.c_str(), buf) == nullptr) return "";
  return buf;
}

// The canonical form of `arg` without following a symlink in its last
// component (so that `ls LINK` shows the link, as ls does). Empty when the
// path does not exist; errno is left set.
std::string CanonicalNoFollow(const std::string& arg) {
  struct stat st {};
  if (lstat(arg.c_str(), &st) != 0) return "";
  std::string trimmed = arg;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  size_t slash = trimmed.rfind('/');
  std::string base = slash == std::string::npos ? trimmed : trimmed.substr(slash + 1);
  if (!S_ISLNK(st.st_mode) || base.empty() || base == "." || base == ".." || trimmed != arg) {
    return Canonical(arg);
  }
  std::string parent = slash == std::string::npos ? "." : (slash == 0 ? "/" : trimmed.substr(0, slash));
  std::string dir = Canonical(parent);
  if (dir.empty()) return "";
  return dir == "/" ? "/" + base : dir + "/" + base;
}

// Resolves a command-line path to a mount (and the path inside it) or an
// unmounted volume directory.
Result<Target> Locate(const std::string& arg) {
  std::string path = CanonicalNoFollow(arg);
  if (path.empty()) {
    return Status::Error(ENOENT, fmt::format("{}: {}", arg, std::strerror(errno)));
  }
  if (auto mount = FindMountHolding(path); mount && mount->fstype == control::kFsType) {
    Target t;
    t.mounted = true;
    t.mountpoint = mount->mountpoint;
    t.volume = mount->source;
    t.rel = mount->mountpoint == "/" ? path : path.substr(mount->mountpoint.size());
    if (t.rel.empty()) t.rel = "/";
    return t;
  }
  if (Volume::Exists(path)) {
    Target t;
    t.volume = path;
    return t;
  }
  return Status::Error(EINVAL, fmt::format("{}: neither inside a mounted spillfs nor a spillfs volume", arg));
}

// Volumes opened read-only by this process, one open per volume (the volume
// lock is per open file, so a second open would find the volume busy).
class Volumes {
 public:
  Result<Volume*> Open(const std::string& dir) {
    auto it = open_.find(dir);
    if (it != open_.end()) return it->second.get();
    if (auto mount = FindMountOfSource(control::kFsType, dir)) return Mounted(dir, mount->mountpoint);
    auto volume = Volume::Open(dir, Volume::OpenOptions{.read_only = true});
    if (!volume.ok()) {
      if (volume.status().code() == EBUSY) {
        return Status::Error(EBUSY, fmt::format("{}; a mounted volume is inspected through its mount "
                                                "point",
                                                volume.status().message()));
      }
      return volume.status();
    }
    Volume* raw = volume->get();
    open_.emplace(dir, std::move(volume).value());
    return raw;
  }

  static Status Mounted(const std::string& dir, const std::string& mountpoint) {
    return Status::Error(EBUSY, fmt::format("volume {} is mounted at {} and its index is held by the "
                                            "daemon; use the mount point instead ({})",
                                            dir, mountpoint, mountpoint));
  }

 private:
  std::map<std::string, std::unique_ptr<Volume>> open_;
};

// The path to show for an answer about volume path `answer`, when the user
// named volume path `asked` as `arg`.
std::string DisplayPath(const std::string& arg, const std::string& asked, const std::string& answer) {
  std::string base = arg;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  std::string suffix;
  if (answer.size() > asked.size() && answer.compare(0, asked.size(), asked) == 0) {
    suffix = answer.substr(asked.size());
    if (asked == "/") suffix = "/" + suffix;
  } else if (answer != asked) {
    return answer;
  }
  if (base == "/" && !suffix.empty()) return suffix;
  return base + suffix;
}

// The volume path as Inspector prints it.
std::string VolumePathForm(const std::string& path) {
  std::string out;
  size_t i = 0;
  while (i < path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string::npos) j = path.size();
    if (j > i) out += "/" + path.substr(i, j - i);
    i = j + 1;
  }
  return out.empty() ? "/" : out;
}

// The message for a failed answer about `arg`: path errors name the path as
// the user wrote it (the answer names the path inside the volume).
std::string PathError(const std::string& arg, const std::string& volume_dir, const Status& status) {
  int code = status.code();
  if (code != ENOENT && code != ENOTDIR && code != ELOOP) return status.message();
  std::string message = fmt::format("{}: {}", arg, std::strerror(code));
  if (!volume_dir.empty()) message += fmt::format(" (in volume {})", volume_dir);
  return message;
}

// ---- human output ----

std::string ModeString(uint32_t mode) {
  // The type letters of ls -l; '-' for a regular file (and anything else).
  static constexpr std::pair<uint32_t, char> kTypes[] = {{S_IFDIR, 'd'},  {S_IFLNK, 'l'}, {S_IFIFO, 'p'},
                                                         {S_IFSOCK, 's'}, {S_IFCHR, 'c'}, {S_IFBLK, 'b'}};
  std::string s(10, '-');
  for (const auto& [type, letter] : kTypes) {
    if ((mode & S_IFMT) == type) s[0] = letter;
  }
  const char* rwx = "rwxrwxrwx";
  for (int i = 0; i < 9; ++i) {
    if (mode & (1u << (8 - i))) s[1 + i] = rwx[i];
  }
  if (mode & S_ISUID) s[3] = (mode & S_IXUSR) ? 's' : 'S';
  if (mode & S_ISGID) s[6] = (mode & S_IXGRP) ? 's' : 'S';
  if (mode & S_ISVTX) s[9] = (mode & S_IXOTH) ? 't' : 'T';
  return s;
}

std::string LocalTime(int64_t ns, const char* format) {
  time_t t = static_cast<time_t>(ns / 1000000000);
  struct tm tm {};
  localtime_r(&t, &tm);
  char buf[64];
  strftime(buf, sizeof(buf), format, &tm);
  return buf;
}

uint64_t U64(const json& o, const char* key) {
  auto it = o.find(key);
  if (it == o.end()) return 0;
  if (it->is_number_unsigned()) return it->get<uint64_t>();
  if (it->is_number_integer()) return static_cast<uint64_t>(std::max<int64_t>(0, it->get<int64_t>()));
  if (it->is_number_float()) return static_cast<uint64_t>(std::max(0.0, it->get<double>()));
  return 0;
}

double F64(const json& o, const char* key) {
  auto it = o.find(key);
  return it != o.end() && it->is_number() ? it->get<double>() : 0.0;
}

// Numbers of the stat object: each key is checked against kStatKeys
// (spillfs/common/stat_keys.h) when this builds.
uint64_t StatU64(const json& stat, StatKeyName key) { return U64(stat, key.name); }
double StatF64(const json& stat, StatKeyName key) { return F64(stat, key.name); }

std::string Percent(uint64_t part, uint64_t whole) {
  return whole == 0 ? "0.0%" : fmt::format("{:.1f}%", 100.0 * static_cast<double>(part) / static_cast<double>(whole));
}

void PrintRow(const std::string& label, const std::string& value) { fmt::print("{:<16}{}\n", label, value); }

// ---- stat ----

struct StatArgs {
  std::string target;
  bool json = false;
};

int RunStat(const StatArgs& args) {
  auto target = Locate(args.target);
  if (!target.ok()) return Fail("stat", target.status().message());
  Volumes volumes;
  json stat;
  if (target->mounted) {
    auto result = control::Request(target->mountpoint, json{{control::key::kOp, control::op::kStat}});
    if (!result.ok()) return Fail("stat", result.status().message());
    stat = std::move(result).value();
  } else {
    auto volume = volumes.Open(target->volume);
    if (!volume.ok()) return Fail("stat", volume.status().message());
    Inspector inspector((*volume)->index(), (*volume)->superblock());
    auto result = inspector.Stat(RuntimeStats{});
    if (!result.ok()) return Fail("stat", result.status().message());
    stat = std::move(result).value();
  }
  stat["volume"] = target->volume;
  stat["mountpoint"] = target->mounted ? json(target->mountpoint) : json(nullptr);
  if (args.json) {
    fmt::print("{}\n", Dump(stat));
    return 0;
  }
  uint64_t capacity = StatU64(stat, "capacity_bytes");
  PrintRow("volume", target->volume);
  PrintRow("mounted", target->mounted ? "at " + target->mountpoint : std::string("no"));
  PrintRow("uuid", stat.value("uuid", ""));
  PrintRow("capacity", HumanBytes(capacity));
  PrintRow("used", fmt::format("{} ({})", HumanBytes(StatU64(stat, "used_bytes")),
                               Percent(StatU64(stat, "used_bytes"), capacity)));
  PrintRow("free", HumanBytes(StatU64(stat, "free_bytes")));
  PrintRow("files", std::to_string(StatU64(stat, "files")));
  PrintRow("directories", std::to_string(StatU64(stat, "directories")));
  PrintRow("logical", HumanBytes(StatU64(stat, "logical_bytes")));
  PrintRow("physical", HumanBytes(StatU64(stat, "physical_bytes")));
  PrintRow("dedup ratio", fmt::format("{:.2f}", StatF64(stat, "dedup_ratio")));
  uint64_t tier_capacity = StatU64(stat, "ram_tier_capacity_bytes");
  PrintRow("ram tier", tier_capacity == 0 ? HumanBytes(StatU64(stat, "ram_tier_bytes"))
                                          : fmt::format("{} of {} ({})", HumanBytes(StatU64(stat, "ram_tier_bytes")),
                                                        HumanBytes(tier_capacity),
                                                        Percent(StatU64(stat, "ram_tier_bytes"), tier_capacity)));
  PrintRow("ssd written", fmt::format("{} ({} by the direct path)", HumanBytes(StatU64(stat, "bytes_written_ssd")),
                                      HumanBytes(StatU64(stat, "bytes_written_direct"))));
  PrintRow("deduplicated", HumanBytes(StatU64(stat, "bytes_deduplicated")));
  PrintRow("ssd read", HumanBytes(StatU64(stat, "bytes_read_ssd")));
  std::string syncs = std::to_string(StatU64(stat, "data_syncs"));
  if (StatU64(stat, "data_syncs") > 0)
    syncs += fmt::format(", {:.0f} ms in all", StatF64(stat, "data_sync_seconds") * 1e3);
  if (stat.contains("data_sync_error") && stat["data_sync_error"].is_string()) {
    syncs += fmt::format(", then FAILED: {}", stat["data_sync_error"].get<std::string>());
  }
  PrintRow("data syncs", syncs);
  PrintRow("cancelled", HumanBytes(StatU64(stat, "bytes_cancelled")));
  if (StatU64(stat, "read_ahead_window_bytes") > 0) {
    PrintRow("read-ahead",
             fmt::format("{} fetched, {} served (windows of {}); {} reads waited {:.0f} ms",
                         HumanBytes(StatU64(stat, "read_ahead_bytes_fetched")),
                         HumanBytes(StatU64(stat, "read_ahead_bytes_served")),
                         HumanBytes(StatU64(stat, "read_ahead_window_bytes")), StatU64(stat, "read_ahead_waits"),
                         StatF64(stat, "read_ahead_wait_seconds") * 1e3));
  }
  PrintRow("checksum errors", std::to_string(StatU64(stat, "checksum_errors")));
  return 0;
}

// ---- ls ----

struct LsArgs {
  std::vector<std::string> paths;
  std::string volume;
  bool long_format = false;
  bool extents = false;
  bool directory = false;
  bool json = false;
};

void PrintEntry(const json& e, bool long_format) {
  std::string path = e.value("path", "");
  if (e.contains("target")) path += " -> " + e.value("target", "");
  if (long_format) {
    fmt::print("{} {:>3} {:>5} {:>5} {:>10} {} {}\n", ModeString(static_cast<uint32_t>(U64(e, "mode"))),
               U64(e, "nlink"), U64(e, "uid"), U64(e, "gid"), HumanBytes(U64(e, "size")),
               LocalTime(e.value("mtime_ns", int64_t{0}), "%Y-%m-%d %H:%M"), path);
  } else {
    fmt::print("{}\n", path);
  }
  if (!e.contains("extents") || !e["extents"].is_array() || e["extents"].empty()) return;
  fmt::print("    {:>14} {:>14} {:>10} {:<16} {}\n", "FILE_OFFSET", "PHYSICAL", "LENGTH", "CHECKSUM", "SHARED");
  for (const json& x : e["extents"]) {
    std::string checksum = x.contains("checksum") && x["checksum"].is_string() ? x["checksum"].get<std::string>() : "-";
    fmt::print("    {:>14} {:>14} {:>10} {:<16} {}{}\n", U64(x, "file_offset"), U64(x, "physical_offset"),
               HumanBytes(U64(x, "length")), checksum, U64(x, "shared"),
               x.value("unwritten", false) ? " unwritten" : "");
  }
}

int RunLs(const LsArgs& args) {
  Volumes volumes;
  std::string volume_dir;
  if (!args.volume.empty()) {
    volume_dir = Canonical(args.volume);
    if (volume_dir.empty()) return Fail("ls", fmt::format("{}: {}", args.volume, std::strerror(errno)));
    if (!Volume::Exists(volume_dir)) return Fail("ls", fmt::format("{} is not a spillfs volume", args.volume));
  }
  std::vector<std::string> paths = args.paths;
  if (paths.empty()) paths.push_back(volume_dir.empty() ? "." : "/");
  json all = json::array();
  int status = 0;
  for (const std::string& arg : paths) {
    Target target;
    if (!volume_dir.empty()) {
      target.volume = volume_dir;
      target.rel = VolumePathForm(arg);
    } else {
      auto located = Locate(arg);
      if (!located.ok()) {
        status = Fail("ls", located.status().message());
        continue;
      }
      target = std::move(located).value();
    }
    Result<json> result = json::array();
    if (target.mounted) {
      result = control::Request(target.mountpoint, json{{control::key::kOp, control::op::kLs},
                                                        {"paths", json::array({target.rel})},
                                                        {"long", args.long_format},
                                                        {"extents", args.extents},
                                                        {"directory", args.directory}});
    } else {
      auto volume = volumes.Open(target.volume);
      if (!volume.ok()) {
        status = Fail("ls", volume.status().message());
        continue;
      }
      Inspector inspector((*volume)->index(), (*volume)->superblock());
      result = inspector.Ls(
          {target.rel},
          Inspector::LsOptions{.long_format = args.long_format, .extents = args.extents, .directory = args.directory});
    }
    if (!result.ok()) {
      status = Fail("ls", PathError(arg, volume_dir, result.status()));
      continue;
    }
    if (!result->is_array()) {
      status = Fail("ls", "malformed answer (not a list)");
      continue;
    }
    std::string asked = VolumePathForm(target.rel);
    for (json& e : *result) {
      std::string volume_path = e.value("path", "");
      e["volume_path"] = volume_path;
      e["path"] = DisplayPath(arg, asked, volume_path);
      if (!args.json) PrintEntry(e, args.long_format);
      all.push_back(std::move(e));
    }
  }
  if (args.json) fmt::print("{}\n", Dump(all));
  return status;
}

// ---- du ----

struct DuArgs {
  std::string path;
  std::string volume;
  bool json = false;
};

int RunDu(const DuArgs& args) {
  Volumes volumes;
  Target target;
  if (!args.volume.empty()) {
    target.volume = Canonical(args.volume);
    if (target.volume.empty()) return Fail("du", fmt::format("{}: {}", args.volume, std::strerror(errno)));
    if (!Volume::Exists(target.volume)) return Fail("du", fmt::format("{} is not a spillfs volume", args.volume));
    target.rel = VolumePathForm(args.path.empty() ? "/" : args.path);
  } else {
    auto located = Locate(args.path.empty() ? "." : args.path);
    if (!located.ok()) return Fail("du", located.status().message());
    target = std::move(located).value();
  }
  Result<json> result = json::object();
  if (target.mounted) {
    result = control::Request(target.mountpoint, json{{control::key::kOp, control::op::kDu}, {"path", target.rel}});
  } else {
    auto volume = volumes.Open(target.volume);
    if (!volume.ok()) return Fail("du", volume.status().message());
    Inspector inspector((*volume)->index(), (*volume)->superblock());
    result = inspector.Du(target.rel);
  }
  std::string shown = args.path.empty() ? (args.volume.empty() ? "." : "/") : args.path;
  if (!result.ok()) return Fail("du", PathError(shown, args.volume.empty() ? "" : target.volume, result.status()));
  json du = std::move(result).value();
  du["volume_path"] = du.value("path", target.rel);
  du["path"] = shown;
  if (args.json) {
    fmt::print("{}\n", Dump(du));
    return 0;
  }
  uint64_t referenced = U64(du, "referenced_bytes"), physical = U64(du, "physical_bytes");
  PrintRow("path", shown);
  PrintRow("logical", HumanBytes(U64(du, "logical_bytes")));
  PrintRow("physical", HumanBytes(physical));
  PrintRow(
      "dedup ratio",
      fmt::format("{:.2f}", physical == 0 ? 1.0 : static_cast<double>(referenced) / static_cast<double>(physical)));
  PrintRow("files", std::to_string(U64(du, "files")));
  PrintRow("directories", std::to_string(U64(du, "directories")));
  if (U64(du, "symlinks") + U64(du, "special_files") > 0) {
    PrintRow("other", std::to_string(U64(du, "symlinks") + U64(du, "special_files")));
  }
  return 0;
}

// ---- top ----

struct TopArgs {
  std::string mountpoint;
  double interval = 1.0;
  int64_t count = 0;  // 0: until interrupted
};

uint64_t Delta(const json& now, const json& before, StatKeyName key) {
  uint64_t a = StatU64(now, key), b = StatU64(before, key);
  return a >= b ? a - b : 0;  // a restarted daemon starts from zero
}

std::string Rate(uint64_t bytes, double seconds) {
  return HumanBytes(static_cast<uint64_t>(std::llround(static_cast<double>(bytes) / seconds))) + "/s";
}

int RunTop(const TopArgs& args) {
  if (!(args.interval >= 0.05)) return Fail("top", "--interval must be at least 0.05 seconds");
  if (args.count < 0) return Fail("top", "--count must not be negative");
  auto target = Locate(args.mountpoint);
  if (!target.ok()) return Fail("top", target.status().message());
  if (!target->mounted) {
    return Fail("top", fmt::format("{} is not mounted; top shows live counters of a mounted volume (use "
                                   "spillfs stat for an unmounted one)",
                                   args.mountpoint));
  }
  const std::string mountpoint = target->mountpoint;
  const bool tty = isatty(STDOUT_FILENO) == 1;
  auto sample = [&]() { return control::Request(mountpoint, json{{control::key::kOp, control::op::kStat}}); };
  auto before = sample();
  if (!before.ok()) return Fail("top", before.status().message());
  auto before_time = std::chrono::steady_clock::now();
  if (!tty) {
    fmt::print("{:<8} {:>12} {:>12} {:>12} {:>12} {:>8} {:>10} {:>6} {:>6} {:>12} {:>4}\n", "TIME", "WRITE/s", "READ/s",
               "SSD-WRITE/s", "SSD-READ/s", "IOPS", "RAM-TIER", "FILL", "HIT%", "CANCEL/s", "QD");
    std::fflush(stdout);
  }
  for (int64_t i = 0; args.count == 0 || i < args.count; ++i) {
    std::this_thread::sleep_for(std::chrono::duration<double>(args.interval));
    auto now = sample();
    if (!now.ok()) return Fail("top", now.status().message());
    auto now_time = std::chrono::steady_clock::now();
    double seconds = std::max(1e-6, std::chrono::duration<double>(now_time - before_time).count());
    const json& a = *now;
    const json& b = *before;
    uint64_t ops = Delta(a, b, "reads") + Delta(a, b, "writes");
    uint64_t hits = Delta(a, b, "ram_tier_hits"), misses = Delta(a, b, "ram_tier_misses");
    std::string hit = hits + misses == 0 ? "-" : Percent(hits, hits + misses);
    uint64_t tier = StatU64(a, "ram_tier_bytes"), tier_capacity = StatU64(a, "ram_tier_capacity_bytes");
    std::string fill = tier_capacity == 0 ? "-" : Percent(tier, tier_capacity);
    std::string clock = LocalTime(static_cast<int64_t>(std::time(nullptr)) * 1000000000, "%H:%M:%S");
    if (tty) {
      fmt::print("\x1b[H\x1b[2J");
      fmt::print("spillfs top: {} (volume {}), every {:.2g} s, {}\n\n", mountpoint, target->volume, args.interval,
                 clock);
      PrintRow("write", Rate(Delta(a, b, "bytes_written"), seconds));
      PrintRow("read", Rate(Delta(a, b, "bytes_read"), seconds));
      PrintRow("ssd write", Rate(Delta(a, b, "bytes_written_ssd"), seconds));
      PrintRow("ssd read", Rate(Delta(a, b, "bytes_read_ssd"), seconds));
      PrintRow("iops", fmt::format("{:.0f}", static_cast<double>(ops) / seconds));
      PrintRow("ram tier", tier_capacity == 0
                               ? HumanBytes(tier)
                               : fmt::format("{} of {} ({})", HumanBytes(tier), HumanBytes(tier_capacity), fill));
      PrintRow("ram tier hits", hits + misses == 0 ? "0" : fmt::format("{} ({} of reads)", hits, hit));
      PrintRow("cancelled", Rate(Delta(a, b, "bytes_cancelled"), seconds));
      PrintRow("queue depth", std::to_string(StatU64(a, "queue_depth")));
      PrintRow("used",
               fmt::format("{} of {}", HumanBytes(StatU64(a, "used_bytes")), HumanBytes(StatU64(a, "capacity_bytes"))));
      PrintRow("checksum errors", std::to_string(StatU64(a, "checksum_errors")));
    } else {
      fmt::print("{:<8} {:>12} {:>12} {:>12} {:>12} {:>8.0f} {:>10} {:>6} {:>6} {:>12} {:>4}\n", clock,
                 Rate(Delta(a, b, "bytes_written"), seconds), Rate(Delta(a, b, "bytes_read"), seconds),
                 Rate(Delta(a, b, "bytes_written_ssd"), seconds), Rate(Delta(a, b, "bytes_read_ssd"), seconds),
                 static_cast<double>(ops) / seconds, HumanBytes(tier), fill, hit,
                 Rate(Delta(a, b, "bytes_cancelled"), seconds), StatU64(a, "queue_depth"));
    }
    std::fflush(stdout);
    before = std::move(now);
    before_time = now_time;
  }
  return 0;
}

}  // namespace

void RegisterStat(CLI::App& app, int* exit_code) {
  auto [cmd, args] =
      AddCommand<StatArgs>(app, "stat", "Show a volume's space, dedup and I/O counters", exit_code, RunStat);
  cmd->add_option("TARGET", args->target, "Mount point (or a path inside it), or an unmounted volume directory")
      ->required();
  cmd->add_flag("--json", args->json, "Print JSON instead of text");
}

void RegisterLs(CLI::App& app, int* exit_code) {
  auto [cmd, args] = AddCommand<LsArgs>(app, "ls", "List files with their attributes and extents", exit_code, RunLs);
  cmd->add_option("PATH", args->paths,
                  "Paths inside a mounted spillfs, or unmounted volume directories (their root); with "
                  "--volume, paths inside that volume (default: . or /)");
  cmd->add_option("--volume", args->volume, "Unmounted volume whose paths PATH names");
  cmd->add_flag("-l,--long", args->long_format, "Long format (mode, links, owner, size, time)");
  cmd->add_flag("-d,--directory", args->directory, "List directories themselves, not their entries");
  cmd->add_flag("--extents", args->extents, "Show each file's extents");
  cmd->add_flag("--json", args->json, "Print JSON instead of text");
}

void RegisterDu(CLI::App& app, int* exit_code) {
  auto [cmd, args] = AddCommand<DuArgs>(app, "du", "Logical and physical usage of a tree (shared bytes counted once)",
                                        exit_code, RunDu);
  cmd->add_option("PATH", args->path,
                  "A path inside a mounted spillfs or an unmounted volume directory; with --volume, a path "
                  "inside that volume");
  cmd->add_option("--volume", args->volume, "Unmounted volume whose path PATH names");
  cmd->add_flag("--json", args->json, "Print JSON instead of text");
}

void RegisterTop(CLI::App& app, int* exit_code) {
  auto [cmd, args] =
      AddCommand<TopArgs>(app, "top", "Live throughput, IOPS and RAM-tier view of a mounted volume", exit_code, RunTop);
  cmd->add_option("MOUNTPOINT", args->mountpoint, "Mount point of a spillfs volume")->required();
  cmd->add_option("--interval", args->interval, "Seconds between refreshes (default 1)");
  cmd->add_option("--count", args->count, "Stop after this many refreshes (default: run until interrupted)");
}

}  // namespace spillfs::cli
