// dedup-units-bench: the cost per unit of the dedup control op's "units" form
// (Filesystem::DirectDedup), as a dedup'd second save of a checkpoint meets it.
//
// A fresh volume in a temporary directory; file "a" gets N whole dedup units
// by one direct commit with their hashes, so the volume holds N blobs (no data
// is written: DirectDedup reads a blob only where its record lacks checksums).
// Then, timed: DirectDedup of N units of a new file "b" with a's hashes (the
// core alone), and the same as one control request {"op":"dedup","units":...}
// on a new file "c" (JSON parse and reply included), and again over "c"
// (every unit already mapped to its blob: a save over the same file). Not a
// test: it prints figures, in-process, no mount.
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

#include "control/control_plane.h"
#include "core/filesystem.h"
#include "spillfs/fs/volume.h"

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

int Run(uint64_t n, const std::string& dir, bool reopen, int repeat) {
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

  // Each repeat maps a new file (one more reference a blob); the best of them
  // is reported, as the machine may be busy.
  std::vector<double> walls, cpus;
  for (int r = 0; r < repeat; ++r) {
    auto b = fs->MakeNode(kRootInode, fmt::format("b{}", r), S_IFREG | 0644, 0, Caller{});
    if (!b.ok()) return 1;
    t = std::chrono::steady_clock::now();
    double cpu = CpuNow();
    auto mapped = fs->DirectDedup(b->ino, units);
    walls.push_back(Seconds(t));
    cpus.push_back(CpuNow() - cpu);
    if (!mapped.ok() || std::count(mapped->begin(), mapped->end(), true) != static_cast<long>(n)) {
      fmt::print(stderr, "dedup: {}\n", mapped.ok() ? "not all mapped" : mapped.status().ToString());
      return 1;
    }
  }
  std::sort(walls.begin(), walls.end());
  std::sort(cpus.begin(), cpus.end());
  fmt::print(
      "DirectDedup (core), best of {}: {} units in {:.4f} s, {:.2f} us a unit ({:.2f} us CPU; median {:.2f} us)\n",
      repeat, n, walls[0], walls[0] / n * 1e6, cpus[0] / n * 1e6, walls[walls.size() / 2] / n * 1e6);

  ControlPlane control(fs.get());
  auto c = fs->MakeNode(kRootInode, "c", S_IFREG | 0644, 0, Caller{});
  if (!c.ok()) return 1;
  std::string request = R"({"op":"dedup","path":"/c","units":[)";
  for (uint64_t i = 0; i < n; ++i) {
    fmt::format_to(std::back_inserter(request), "{}{},{},{}", i ? "," : "", i * unit, words[2 * i], words[2 * i + 1]);
  }
  request += "]}";
  for (const char* what : {"control op, new file", "control op, same units again"}) {
    auto handle = control.Open(ControlPlane::kControlIno, O_RDWR, 0);
    if (!handle.ok()) return 1;
    t = std::chrono::steady_clock::now();
    double cpu_op = CpuNow();
    if (!control.Write(*handle, 0, request).ok()) return 1;
    std::string reply;
    for (;;) {
      ControlPlane::ReplyBytes part = control.Read(*handle, reply.size(), 1 << 20);
      reply.append(part.bytes);
      if (part.bytes.size() < (1u << 20)) break;
    }
    double whole = Seconds(t);
    cpu_op = CpuNow() - cpu_op;
    control.Release(*handle);
    if (reply.find(fmt::format(R"("mapped_bytes":{})", n * unit)) == std::string::npos) {
      fmt::print(stderr, "control: {}\n", reply.substr(0, 300));
      return 1;
    }
    fmt::print("{}: {} units ({} request bytes) in {:.4f} s, {:.2f} us a unit ({:.2f} us CPU)\n", what, n,
               request.size(), whole, whole / n * 1e6, cpu_op / n * 1e6);
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
  app.add_option("-n,--units", n, "dedup units (256 KiB each)");
  app.add_option("--dir", dir, "where the temporary volume goes (sparse: N x 256 KiB)");
  app.add_flag("--reopen", reopen, "reopen the volume after the first file's commit");
  app.add_option("-r,--repeat", repeat, "DirectDedup runs, each on a new file (the best is reported)")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  return spillfs::Run(n, dir + "/dedup-units-bench", reopen, repeat);
}
