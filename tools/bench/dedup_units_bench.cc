// dedup-units-bench: the cost per unit of the dedup control op's "units" form
// (Filesystem::DirectDedup), as a dedup'd second save of a checkpoint meets it.
//
// A fresh volume in a temporary directory; file "a" gets N whole dedup units
// by one direct commit with their hashes, so the volume holds them as one blob
// of N units (one run: a checkpoint's tensors are a blob each; no data is
// written: DirectDedup reads a blob only where a one-unit record lacks
// checksums).
// Then, timed: DirectDedup of N units of a new file "b" with a's hashes (the
// core alone), and the same as one control request {"op":"dedup","units":...}
// on a new file "c" (JSON parse and reply included), and again over "c"
// (every unit already mapped to its blob: a save over the same file); both
// for the "units" form and for the compact one ("unit_runs", "unit_hashes"),
// on files "c" and "d". Not a test: it prints figures, in-process, no mount.
#include <fmt/format.h>
#include <sys/stat.h>
#include <time.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "spillfs/control/control_plane.h"
#include "spillfs/core/filesystem.h"
#include "spillfs/store/volume.h"

namespace spillfs {
namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// CPU seconds of this thread (the op runs on it; robust to a busy machine).
double CpuNow() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

int Run(uint64_t n, const std::string& dir, bool reopen, int repeat, uint64_t run_units) {
  const uint64_t unit = Filesystem::dedup_unit();
  const std::string vol = dir + "/vol";
  std::filesystem::remove_all(vol);
  Volume::CreateOptions create;
  create.size = n * unit + (256ull << 20);
  if (auto sb = Volume::Create(vol, create); !sb.ok()) {
    fmt::print(stderr, "create: {}\n", sb.status().ToString());
    return 1;
  }
  auto open = [&]() -> std::unique_ptr<Filesystem> {
    auto volume = Volume::Open(vol, Volume::OpenOptions{});
    if (!volume.ok()) return nullptr;
    auto fs = Filesystem::Open(std::move(volume).value(), FilesystemOptions{});
    return fs.ok() ? std::move(fs).value() : nullptr;
  };
  std::unique_ptr<Filesystem> fs = open();
  if (!fs) return 1;
  std::mt19937_64 rng(23);
  std::vector<DirectUnit> units(n);
  std::vector<uint64_t> words(2 * n);
  for (uint64_t i = 0; i < n; ++i) {
    words[2 * i] = rng();
    words[2 * i + 1] = rng();
    units[i].file_offset = i * unit;
    units[i].hash.assign(reinterpret_cast<const char*>(&words[2 * i]), 16);
  }
  auto a = fs->MakeNode(kRootInode, "a", S_IFREG | 0644, 0, Caller{});
  auto space = fs->DirectReserve(n * unit);
  if (!a.ok() || !space.ok()) return 1;
  std::vector<uint32_t> sums(n * unit / Volume::kBlockSize, 7);
  auto t = std::chrono::steady_clock::now();
  if (Status s = fs->DirectCommit(a->ino, 0, *space, sums, n * unit, units); !s.ok()) {
    fmt::print(stderr, "commit: {}\n", s.ToString());
    return 1;
  }
  fmt::print("commit of a: {} units as new blobs in {:.3f} s\n", n, Seconds(t));
  if (reopen) {
    fs.reset();
    fs = open();
    if (!fs) return 1;
  }

  // The control request in both forms: "units" (three decimal numbers a
  // unit) and the compact "unit_runs" (runs of `run_units` units, as a
  // checkpoint's tensors give) with "unit_hashes" (32 hex digits a unit).
  ControlPlane control(fs.get());
  auto request_text = [&](const std::string& path, bool compact) {
    std::string text = fmt::format(R"({{"op":"dedup","path":"{}",)", path);
    if (!compact) {
      text += R"("units":[)";
      for (uint64_t i = 0; i < n; ++i) {
        fmt::format_to(std::back_inserter(text), "{}{},{},{}", i ? "," : "", i * unit, words[2 * i], words[2 * i + 1]);
      }
      return text + "]}";
    }
    text += R"("unit_runs":[)";
    for (uint64_t i = 0; i < n; i += run_units) {
      fmt::format_to(std::back_inserter(text), "{}{},{}", i ? "," : "", i * unit, std::min(run_units, n - i));
    }
    text += R"(],"unit_hashes":")";
    const auto* bytes = reinterpret_cast<const unsigned char*>(words.data());
    for (uint64_t i = 0; i < 16 * n; ++i) fmt::format_to(std::back_inserter(text), "{:02x}", bytes[i]);
    return text + "\"}";
  };
  // One control request: wall and CPU seconds, and the reply's parse (as
  // the client does it, a json DOM) in CPU seconds.
  struct Timing {
    double wall = 0, cpu = 0, reply_parse = 0;
    size_t reply_bytes = 0;
  };
  auto ask = [&](const std::string& request, Timing* out) -> bool {
    auto handle = control.Open(ControlPlane::kControlIno, O_RDWR, /*opener_uid=*/0);
    if (!handle.ok()) return false;
    auto t = std::chrono::steady_clock::now();
    double cpu = CpuNow();
    if (!control.Write(*handle, 0, request, ControlPlane::RequestCaller{}).ok()) return false;
    std::string reply;
    for (;;) {
      ControlPlane::ReplyBytes part = control.Read(*handle, reply.size(), 1 << 20);
      reply.append(part.bytes);
      if (part.bytes.size() < (1u << 20)) break;
    }
    out->wall = Seconds(t);
    out->cpu = CpuNow() - cpu;
    control.Release(*handle);
    if (reply.find(fmt::format(R"("mapped_bytes":{})", n * unit)) == std::string::npos) {
      fmt::print(stderr, "control: {}\n", reply.substr(0, 300));
      return false;
    }
    cpu = CpuNow();
    auto parsed = nlohmann::json::parse(reply);
    out->reply_parse = CpuNow() - cpu;
    out->reply_bytes = reply.size();
    return true;
  };

  // Each repeat maps three new files (one more reference a blob each): "b"
  // by DirectDedup itself, "c" by a "units" request, "d" by a compact one,
  // in turn, so each meets an index of the same size; the best and the
  // median of each are reported, as the machine may be busy.
  struct Series {
    explicit Series(const char* name) : what(name) {}
    const char* what;
    std::vector<double> walls, cpus;
    Timing last;
    void Print(uint64_t n) {
      std::sort(walls.begin(), walls.end());
      std::sort(cpus.begin(), cpus.end());
      fmt::print("{}, best of {}: {} units in {:.4f} s, {:.2f} us a unit ({:.2f} us CPU; median {:.2f} us)", what,
                 walls.size(), n, walls[0], walls[0] / n * 1e6, cpus[0] / n * 1e6, walls[walls.size() / 2] / n * 1e6);
      if (last.reply_bytes)
        fmt::print("; reply {} bytes, parsed in {:.2f} ms CPU", last.reply_bytes, last.reply_parse * 1e3);
      fmt::print("\n");
    }
  };
  Series core{"DirectDedup (core)"}, old_op{"control op (\"units\"), new file"},
      compact_op{"control op (\"unit_runs\"), new file"};
  std::string last_old, last_compact;
  for (int r = 0; r < repeat; ++r) {
    InodeNumber b = 0;
    for (const char* name : {"b", "c", "d"}) {
      auto node = fs->MakeNode(kRootInode, fmt::format("{}{}", name, r), S_IFREG | 0644, 0, Caller{});
      if (!node.ok()) return 1;
      if (b == 0) b = node->ino;
    }
    t = std::chrono::steady_clock::now();
    double cpu = CpuNow();
    auto mapped = fs->DirectDedup(b, units);
    core.walls.push_back(Seconds(t));
    core.cpus.push_back(CpuNow() - cpu);
    if (!mapped.ok() || std::count(mapped->begin(), mapped->end(), true) != static_cast<long>(n)) {
      fmt::print(stderr, "dedup: {}\n", mapped.ok() ? "not all mapped" : mapped.status().ToString());
      return 1;
    }
    for (Series* series : {&old_op, &compact_op}) {
      const bool compact = series == &compact_op;
      std::string& request = compact ? last_compact : last_old;
      request = request_text(fmt::format("/{}{}", compact ? "d" : "c", r), compact);
      if (!ask(request, &series->last)) return 1;
      series->walls.push_back(series->last.wall);
      series->cpus.push_back(series->last.cpu);
    }
  }
  core.Print(n);
  for (Series* series : {&old_op, &compact_op}) {
    const std::string& request = series == &compact_op ? last_compact : last_old;
    double parse = 1e9;
    for (int r = 0; r < repeat; ++r) {
      double cpu = CpuNow();
      auto parsed = nlohmann::json::parse(request);
      parse = std::min(parse, CpuNow() - cpu);
    }
    series->Print(n);
    fmt::print("  request {} bytes, parsed alone (a json DOM, as the daemon does) in {:.2f} ms CPU\n", request.size(),
               parse * 1e3);
  }
  // The request's handling alone, without DirectDedup's work: the same
  // request spoilt at its last unit (a misaligned offset, which DirectDedup
  // refuses before any look-up; a bad hex digit), so the whole request is
  // parsed and its units built, then refused.
  for (bool compact : {false, true}) {
    std::string request = request_text("/c0", compact);
    if (compact) {
      request[request.size() - 3] = 'x';
    } else {
      const std::string last = fmt::format("{},{},{}", (n - 1) * unit, words[2 * n - 2], words[2 * n - 1]);
      request.replace(request.rfind(last), last.size(),
                      fmt::format("{},{},{}", (n - 1) * unit + 4096, words[2 * n - 2], words[2 * n - 1]));
    }
    std::vector<double> cpus;
    for (int r = 0; r < repeat; ++r) {
      auto handle = control.Open(ControlPlane::kControlIno, O_RDWR, /*opener_uid=*/0);
      if (!handle.ok()) return 1;
      double cpu = CpuNow();
      if (!control.Write(*handle, 0, request, ControlPlane::RequestCaller{}).ok()) return 1;
      std::string reply(control.Read(*handle, 0, 1 << 20).bytes);
      cpus.push_back(CpuNow() - cpu);
      control.Release(*handle);
      if (reply.find(fmt::format("unit {}", n - 1)) == std::string::npos) {
        fmt::print(stderr, "spoilt request: {}\n", reply.substr(0, 300));
        return 1;
      }
    }
    fmt::print("control op (\"{}\") refused at its last unit (the request's handling alone): best {:.2f} ms CPU\n",
               compact ? "unit_runs" : "units", *std::min_element(cpus.begin(), cpus.end()) * 1e3);
  }
  // Again over the last files: every unit already mapped to its blob (a
  // save over the same file).
  for (Series* series : {&old_op, &compact_op}) {
    Timing again;
    if (!ask(series == &compact_op ? last_compact : last_old, &again)) return 1;
    fmt::print("{}, same units again: {:.4f} s, {:.2f} us a unit ({:.2f} us CPU)\n",
               series == &compact_op ? "control op (\"unit_runs\")" : "control op (\"units\")", again.wall,
               again.wall / n * 1e6, again.cpu / n * 1e6);
  }
  return 0;
}

}  // namespace
}  // namespace spillfs

int main(int argc, char** argv) {
  CLI::App app{"dedup-units-bench: the cost per unit of DirectDedup and the dedup control op"};
  uint64_t n = 10000;
  std::string dir = "/tmp";
  bool reopen = false;
  int repeat = 5;
  uint64_t run_units = 32;
  app.add_option("-n,--units", n, "dedup units (256 KiB each)");
  app.add_option("--dir", dir, "where the temporary volume goes (sparse: N x 256 KiB)");
  app.add_flag("--reopen", reopen, "reopen the volume after the first file's commit");
  app.add_option("-r,--repeat", repeat, "DirectDedup runs, each on a new file (the best is reported)")
      ->check(CLI::PositiveNumber);
  app.add_option("--run-units", run_units, "units a run in the compact form (a tensor's units)")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  return spillfs::Run(n, dir + "/dedup-units-bench", reopen, repeat, run_units);
}
