// spillfs fsck VOLUME [--repair] [--scrub] [--json] [--list-extents]
//
// Exit status: 0 clean (after --repair: everything found was repaired),
// 1 problems found (or left), 2 fsck could not run (not a volume, mounted or
// locked, unreadable index or superblock).
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "sizes.h"
#include "spillfs/common/control_protocol.h"
#include "spillfs/common/mountinfo.h"
#include "spillfs/inspect/fsck.h"
#include "spillfs/store/volume.h"

namespace spillfs::cli {
namespace {

namespace stdfs = std::filesystem;

constexpr int kExitClean = 0;
constexpr int kExitProblems = 1;
constexpr int kExitCannotRun = 2;

struct FsckArgs {
  std::string volume;
  bool repair = false;
  bool scrub = false;
  bool json = false;
  bool list_extents = false;
};

int CannotRun(const std::string& message) {
  fmt::print(stderr, "spillfs fsck: {}\n", message);
  return kExitCannotRun;
}

// Progress on stderr, at most ten lines a second, only on a terminal.
class ProgressLine {
 public:
  ProgressLine() : enabled_(isatty(STDERR_FILENO) == 1) {}
  ~ProgressLine() { Clear(); }

  void Update(std::string_view phase, uint64_t done, uint64_t total) {
    if (!enabled_) return;
    auto now = std::chrono::steady_clock::now();
    if (phase == last_phase_ && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    last_phase_ = phase;
    std::string text;
    if (phase == "scrub" && total > 0) {
      text = fmt::format("fsck: scrub {} of {} ({:.0f}%)", HumanBytes(done), HumanBytes(total),
                         100.0 * static_cast<double>(done) / static_cast<double>(total));
    } else if (total > 0) {
      text = fmt::format("fsck: {} {}/{}", phase, done, total);
    } else {
      text = fmt::format("fsck: {} {}", phase, done);
    }
    fmt::print(stderr, "\r\033[K{}", text);
    std::fflush(stderr);
    shown_ = true;
  }
  void Clear() {
    if (!shown_) return;
    fmt::print(stderr, "\r\033[K");
    std::fflush(stderr);
    shown_ = false;
  }

 private:
  bool enabled_;
  bool shown_ = false;
  std::string last_phase_;
  std::chrono::steady_clock::time_point last_{};
};

nlohmann::json ToJson(const std::string& volume, const fsck::Report& report, bool list_extents) {
  nlohmann::json out;
  out["volume"] = volume;
  out["clean"] = report.clean();
  out["repair"] = report.repair;
  out["scrub"] = report.scrub;
  out["problems_found"] = report.problems_found;
  out["problems_remaining"] = report.problems_remaining;
  out["problem_counts"] = report.problem_counts;
  out["counters"] = {
      {"inodes", report.inodes},
      {"directories", report.directories},
      {"files", report.files},
      {"symlinks", report.symlinks},
      {"specials", report.specials},
      {"dirents", report.dirents},
      {"extents", report.extents},
      {"orphans", report.orphans},
      {"xattrs", report.xattrs},
      {"data_area_bytes", report.data_area_bytes},
      {"bytes_mapped", report.bytes_mapped},
      {"bytes_free", report.bytes_free},
      {"bytes_scrubbed", report.bytes_scrubbed},
      {"blocks_scrubbed", report.blocks_scrubbed},
  };
  nlohmann::json problems = nlohmann::json::array();
  for (const fsck::Problem& p : report.problems) {
    nlohmann::json item;
    item["kind"] = fsck::ProblemKindName(p.kind);
    item["message"] = p.message;
    if (p.ino != 0) item["ino"] = p.ino;
    if (!p.path.empty()) item["path"] = p.path;
    if (p.file_offset) item["file_offset"] = *p.file_offset;
    if (p.physical) item["physical"] = *p.physical;
    if (p.length) item["length"] = *p.length;
    item["repaired"] = p.repaired;
    problems.push_back(std::move(item));
  }
  out["problems"] = std::move(problems);
  if (list_extents) {
    nlohmann::json files = nlohmann::json::array();
    for (const fsck::FileExtents& f : report.file_extents) {
      nlohmann::json extents = nlohmann::json::array();
      for (const auto& e : f.extents) {
        extents.push_back({{"file_offset", e.file_offset},
                           {"physical", e.physical},
                           {"length", e.length},
                           {"unwritten", (e.flags & kExtentUnwritten) != 0},
                           {"blob_id", e.blob_id}});
      }
      files.push_back({{"ino", f.ino}, {"path", f.path}, {"size", f.size}, {"extents", std::move(extents)}});
    }
    out["files"] = std::move(files);
  }
  return out;
}

std::string Counters(const fsck::Report& r) {
  std::string text = fmt::format(
      "{} inodes ({} directories, {} files, {} symlinks, {} special), {} extents, {} mapped, {} "
      "free of {}",
      r.inodes, r.directories, r.files, r.symlinks, r.specials, r.extents, HumanBytes(r.bytes_mapped),
      HumanBytes(r.bytes_free), HumanBytes(r.data_area_bytes));
  if (r.scrub) text += fmt::format(", {} scrubbed", HumanBytes(r.bytes_scrubbed));
  return text;
}

void PrintHuman(const std::string& volume, const fsck::Report& report) {
  if (report.problems_found == 0) {
    fmt::print("spillfs fsck: {}: clean: {}\n", volume, Counters(report));
    return;
  }
  std::string kinds;
  for (const auto& [kind, count] : report.problem_counts) {
    kinds += fmt::format("{}{} {}", kinds.empty() ? "" : ", ", count, kind);
  }
  std::string outcome;
  if (report.repair) {
    outcome = report.problems_remaining == 0 ? "all repaired"
                                             : fmt::format("{} remain unrepaired", report.problems_remaining);
  }
  fmt::print("spillfs fsck: {}: {} problem{} ({}){}{}; {}\n", volume, report.problems_found,
             report.problems_found == 1 ? "" : "s", kinds, outcome.empty() ? "" : ", ", outcome, Counters(report));
  for (const fsck::Problem& p : report.problems) {
    fmt::print("{}: {}{}\n", fsck::ProblemKindName(p.kind), p.message,
               report.repair ? (p.repaired ? " [repaired]" : " [not repaired]") : "");
  }
  uint64_t listed = report.problems.size();
  if (report.problems_found > listed) {
    fmt::print("... and {} more problems not listed\n", report.problems_found - listed);
  }
}

int RunFsck(const FsckArgs& args) {
  std::error_code ec;
  if (!stdfs::is_directory(args.volume, ec)) return CannotRun(fmt::format("{} is not a directory", args.volume));
  std::string volume = stdfs::canonical(args.volume, ec).string();
  if (!Volume::Exists(volume)) {
    return CannotRun(fmt::format("{} is not a spillfs volume (no index/CURRENT inside)", volume));
  }
  if (auto mounted = FindMountOfSource(control::kFsType, volume)) {
    return CannotRun(fmt::format("{} is mounted on {}; unmount it first", volume, mounted->mountpoint));
  }
  auto opened = Volume::Open(volume, Volume::OpenOptions{.read_only = !args.repair});
  if (!opened.ok()) return CannotRun(fmt::format("cannot open {}: {}", volume, opened.status().message()));

  ProgressLine progress;
  fsck::Checker::Options options;
  options.repair = args.repair;
  options.scrub = args.scrub;
  options.list_extents = args.list_extents;
  options.progress = [&](std::string_view phase, uint64_t done, uint64_t total) {
    progress.Update(phase, done, total);
  };
  fsck::Checker checker(**opened, options);
  auto report = checker.Run();
  progress.Clear();
  if (!report.ok()) return CannotRun(fmt::format("cannot check {}: {}", volume, report.status().message()));
  if (args.json) {
    fmt::print("{}\n", ToJson(volume, *report, args.list_extents).dump(2));
  } else {
    PrintHuman(volume, *report);
  }
  return report->clean() ? kExitClean : kExitProblems;
}

}  // namespace

void RegisterFsck(CLI::App& app, int* exit_code) {
  auto [cmd, args] = AddCommand<FsckArgs>(
      app, "fsck", "Check an unmounted volume (exit 0 clean, 1 problems found, 2 could not run)", exit_code, RunFsck);
  cmd->add_option("VOLUME", args->volume, "The volume directory")->required();
  cmd->add_flag("--repair", args->repair, "Fix what is safely fixable (leaks, link counts, orphans, ...)");
  cmd->add_flag("--scrub", args->scrub, "Also read every written extent and verify its checksums");
  cmd->add_flag("--json", args->json, "Print the report as JSON");
  cmd->add_flag("--list-extents", args->list_extents, "With --json: include every file's extent map");
}

}  // namespace spillfs::cli
