// spillfs-meta-bench: metadata, small files, a tree and mmap, on the host
// filesystem and through the mount, in one run (issue 40's benchmark). For
// each of the two, in this order:
//   - mdtest-like phases, --threads threads each in a directory of its own,
//     --files files each: create (open O_CREAT|O_EXCL, close), stat, unlink,
//     of empty files and of 4 KiB files (one write before the close);
//   - the tree of --tree (default /usr/include), as a tar made once: untar
//     then sync (and an fsync, which spillfs needs), `ls -lR` cold, read every file cold (`tar c | cat`), `rm -rf`;
//   - a --mmap-size file, written and fsync'd, then mapped and read cold:
//     sequentially (every page in order) and at random (4 KiB pages, for
//     --random-seconds).
// Cold means the page cache dropped and, for the mount, the volume remounted.
// Prints each figure with spillfs's ratio to the host's (speed over speed:
// above 1 spillfs is faster), and writes JSON (--json). Needs root (mounts,
// drop_caches).
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"

namespace {

using json = nlohmann::json;
using namespace spillfs::bench;
namespace stdfs = std::filesystem;

struct Options {
  std::string dir = "/var/tmp";
  std::string spillfs_bin;
  unsigned threads = 4;
  unsigned files = 2000;
  std::string tree = "/usr/include";
  std::string mmap_size = "1G";
  double random_seconds = 3;
  std::string mount_args;
  std::string json_out;
};

struct Figure {
  std::string what;
  double value;
  std::string unit;  // "s": lower is better; otherwise a rate
};

class MetaBench {
 public:
  explicit MetaBench(Options o) : o_(std::move(o)) {}
  int Main();

 private:
  // One side of the comparison: a directory, and how to make it cold.
  struct Side {
    std::string name, dir;
    std::function<void()> cold;
  };
  void Setup();
  void Cleanup();
  void Mount();
  void Unmount();
  void DropCaches();
  void Measure(const Side& side, std::vector<Figure>* out);

  // Each returns its figure (ops/s, seconds or MB/s).
  double Parallel(const std::string& dir, const std::function<void(const std::string&, unsigned)>& one);
  double MmapSequential(const std::string& path, uint64_t size);
  double MmapRandom(const std::string& path, uint64_t size);

  Options o_;
  std::string work_, vol_, mnt_, host_, tar_;
  bool mounted_ = false;
};

void MetaBench::DropCaches() {
  sync();
  int fd = open("/proc/sys/vm/drop_caches", O_WRONLY);
  if (fd < 0 || write(fd, "3", 1) != 1) DieErrno("drop_caches (run as root)");
  close(fd);
}

void MetaBench::Mount() {
  Run(fmt::format("{} mount {} {} {}", Quote(o_.spillfs_bin), Quote(vol_), Quote(mnt_), o_.mount_args));
  mounted_ = true;
}

void MetaBench::Unmount() {
  if (!mounted_) return;
  Run(fmt::format("{} umount {}", Quote(o_.spillfs_bin), Quote(mnt_)));
  mounted_ = false;
}

void MetaBench::Setup() {
  if (o_.spillfs_bin.empty()) {
    o_.spillfs_bin = (stdfs::read_symlink("/proc/self/exe").parent_path() / "spillfs").string();
  }
  if (!stdfs::exists(o_.spillfs_bin)) Die("no spillfs binary at " + o_.spillfs_bin + " (--spillfs)");
  if (!stdfs::is_directory(o_.tree)) Die("no directory " + o_.tree + " (--tree)");
  work_ = MakeWorkDir(o_.dir, "spillfs-meta-bench");
  vol_ = work_ + "/vol";
  mnt_ = work_ + "/mnt";
  host_ = work_ + "/host";
  tar_ = work_ + "/tree.tar";
  stdfs::create_directories(mnt_);
  stdfs::create_directories(host_);
  stdfs::path tree(o_.tree);
  Run(fmt::format("tar cf {} -C {} {}", Quote(tar_), Quote(tree.parent_path().string()),
                  Quote(tree.filename().string())));
  const uint64_t room = 4 * stdfs::file_size(tar_) + 2 * ParseSize(o_.mmap_size) + (2ull << 30);
  Run(fmt::format("{} mkfs {} --size {}M", Quote(o_.spillfs_bin), Quote(vol_), room >> 20));
  Mount();
}

void MetaBench::Cleanup() {
  try {
    Unmount();
  } catch (const std::exception& e) {
    fmt::print(stderr, "spillfs-meta-bench: unmount: {}\n", e.what());
  }
  std::error_code ec;
  if (!work_.empty()) stdfs::remove_all(work_, ec);
}

// Runs one(dir_of_thread, thread) on --threads threads; ops/s over all of them.
double MetaBench::Parallel(const std::string& dir, const std::function<void(const std::string&, unsigned)>& one) {
  std::vector<std::thread> threads;
  std::atomic<bool> failed{false};
  std::string error;
  auto t0 = Clock::now();
  for (unsigned t = 0; t < o_.threads; ++t) {
    threads.emplace_back([&, t] {
      try {
        one(fmt::format("{}/t{}", dir, t), t);
      } catch (const std::exception& e) {
        if (!failed.exchange(true)) error = e.what();
      }
    });
  }
  for (auto& th : threads) th.join();
  if (failed) Die(error);
  return static_cast<double>(o_.threads) * o_.files / Seconds(t0, Clock::now());
}

double MetaBench::MmapSequential(const std::string& path, uint64_t size) {
  Fd fd(path, O_RDONLY);
  void* p = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) DieErrno("mmap " + path);
  const auto* bytes = static_cast<const volatile uint8_t*>(p);
  uint64_t sum = 0;
  auto t0 = Clock::now();
  for (uint64_t off = 0; off < size; off += kBlock) sum += bytes[off];
  const double s = Seconds(t0, Clock::now());
  munmap(p, size);
  if (sum == 0xffffffffffffffffull) fmt::print("");  // keeps the reads
  return static_cast<double>(size) / s / 1e6;
}

// Pages read per second, one page at a time at random offsets.
double MetaBench::MmapRandom(const std::string& path, uint64_t size) {
  Fd fd(path, O_RDONLY);
  void* p = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) DieErrno("mmap " + path);
  madvise(p, size, MADV_RANDOM);
  const auto* bytes = static_cast<const volatile uint8_t*>(p);
  Rng rng(7);
  uint64_t sum = 0, pages = 0;
  auto t0 = Clock::now();
  const uint64_t n = size / kBlock;
  while (Seconds(t0, Clock::now()) < o_.random_seconds) {
    for (int i = 0; i < 64; ++i, ++pages) sum += bytes[(rng.Next() % n) * kBlock];
  }
  const double s = Seconds(t0, Clock::now());
  munmap(p, size);
  if (sum == 0xffffffffffffffffull) fmt::print("");
  return static_cast<double>(pages) / s;
}

// The figures of one side, each side in the same order.
void MetaBench::Measure(const Side& side, std::vector<Figure>* out) {
  fmt::print("== {} ({})\n", side.name, side.dir);
  DropCaches();  // what setup (the tar, mkfs) or the other side left dirty is written before the first phase
  auto add = [&](const std::string& what, double v, const char* unit) {
    fmt::print("  {:<34} {:>12.2f} {}\n", what, v, unit);
    std::fflush(stdout);
    out->push_back({what, v, unit});
  };
  const std::string md = side.dir + "/md";
  for (uint64_t bytes : {uint64_t{0}, kBlock}) {
    const std::string kind = bytes == 0 ? "empty" : "4 KiB";
    std::vector<char> data(bytes, 'x');
    add("create " + kind,
        Parallel(md,
                 [&](const std::string& d, unsigned) {
                   stdfs::create_directories(d);
                   for (unsigned i = 0; i < o_.files; ++i) {
                     Fd fd(fmt::format("{}/f{}", d, i), O_WRONLY | O_CREAT | O_EXCL);
                     if (bytes > 0 && write(fd.get(), data.data(), bytes) != static_cast<ssize_t>(bytes)) {
                       DieErrno("write " + d);
                     }
                   }
                 }),
        "ops/s");
    add("stat " + kind,
        Parallel(md,
                 [&](const std::string& d, unsigned) {
                   struct stat st;
                   for (unsigned i = 0; i < o_.files; ++i) {
                     if (stat(fmt::format("{}/f{}", d, i).c_str(), &st) != 0) DieErrno("stat " + d);
                   }
                 }),
        "ops/s");
    add("unlink " + kind,
        Parallel(md,
                 [&](const std::string& d, unsigned) {
                   for (unsigned i = 0; i < o_.files; ++i) {
                     if (unlink(fmt::format("{}/f{}", d, i).c_str()) != 0) DieErrno("unlink " + d);
                   }
                 }),
        "ops/s");
  }
  stdfs::remove_all(md);

  auto timed = [](const std::string& command) {
    auto t0 = Clock::now();
    Run(command);
    return Seconds(t0, Clock::now());
  };
  const std::string name = stdfs::path(o_.tree).filename().string();
  const std::string tree = side.dir + "/" + name;
  // sync(2) reaches no FUSE daemon (the kernel sends FUSE_SYNCFS to virtiofs
  // only): an fsync of one file on the side makes it durable as a whole, as
  // spillfs's fsync writes every file closed before it (on ext4 it adds ~0).
  add("untar + sync",
      timed(fmt::format("tar xf {} -C {} && sync && dd if=/dev/null of={}/.synced conv=fsync status=none", Quote(tar_),
                        Quote(side.dir), Quote(side.dir))),
      "s");
  side.cold();
  add("ls -lR, cold", timed(fmt::format("ls -lR {} >/dev/null", Quote(tree))), "s");
  side.cold();
  add("read all, cold", timed(fmt::format("tar cf - -C {} {} | cat >/dev/null", Quote(side.dir), Quote(name))), "s");
  add("rm -rf", timed(fmt::format("rm -rf {}", Quote(tree))), "s");

  const uint64_t size = ParseSize(o_.mmap_size) / kMiB * kMiB;
  const std::string big = side.dir + "/mmap.bin";
  {
    Buffer buf(kMiB);
    Fd fd(big, O_WRONLY | O_CREAT | O_TRUNC);
    for (uint64_t off = 0; off < size; off += kMiB) {
      FillRandom(buf.data, kMiB, off / kMiB + 1);
      if (pwrite(fd.get(), buf.data, kMiB, static_cast<off_t>(off)) != static_cast<ssize_t>(kMiB)) {
        DieErrno("write " + big);
      }
    }
    fd.Fsync();
  }
  side.cold();
  add("mmap sequential, cold", MmapSequential(big, size), "MB/s");
  side.cold();
  add("mmap random 4 KiB, cold", MmapRandom(big, size), "pages/s");
  stdfs::remove(big);
}

int MetaBench::Main() {
  Setup();
  try {
    std::vector<Figure> host, mount;
    Measure({"host filesystem", host_, [this] { DropCaches(); }}, &host);
    Measure({"spillfs mount", mnt_,
             [this] {
               Unmount();
               DropCaches();
               Mount();
             }},
            &mount);
    json rows = json::array();
    fmt::print("\n{:<26} {:>12} {:>12} {:<8} {:>8}\n", "what", "host", "spillfs", "unit", "ratio");
    for (size_t i = 0; i < host.size(); ++i) {
      const Figure &h = host[i], &m = mount[i];
      const double ratio = h.unit == "s" ? h.value / m.value : m.value / h.value;
      fmt::print("{:<26} {:>12.2f} {:>12.2f} {:<8} {:>8.2f}\n", h.what, h.value, m.value, h.unit, ratio);
      rows.push_back({{"what", h.what}, {"unit", h.unit}, {"host", h.value}, {"spillfs", m.value}, {"ratio", ratio}});
    }
    fmt::print("(ratio: spillfs's speed over the host's; above 1 spillfs is faster)\n");
    if (!o_.json_out.empty()) {
      json j = {{"threads", o_.threads}, {"files_per_thread", o_.files},
                {"tree", o_.tree},       {"mmap_size", o_.mmap_size},
                {"cpu", CpuModel()},     {"rows", rows}};
      std::ofstream(o_.json_out) << j.dump(2) << "\n";
    }
  } catch (...) {
    Cleanup();
    throw;
  }
  Cleanup();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"spillfs-meta-bench: metadata, small files, a tree and mmap, host filesystem against the mount"};
  app.add_option("--dir", o.dir, "where the host side and the volume go (the host filesystem measured)");
  app.add_option("--spillfs", o.spillfs_bin, "spillfs binary (default: beside this one)");
  app.add_option("--threads", o.threads, "threads of the create/stat/unlink phases")->check(CLI::Range(1, 256));
  app.add_option("--files", o.files, "files per thread")->check(CLI::Range(1, 10000000));
  app.add_option("--tree", o.tree, "directory whose copy is untarred, listed, read and removed");
  app.add_option("--mmap-size", o.mmap_size, "size of the mmap'd file (e.g. 1G)");
  app.add_option("--random-seconds", o.random_seconds, "length of the random mmap phase");
  app.add_option("--mount-args", o.mount_args, "appended to `spillfs mount`");
  app.add_option("--json", o.json_out, "write the figures as JSON here");
  CLI11_PARSE(app, argc, argv);
  try {
    return MetaBench(o).Main();
  } catch (const std::exception& e) {
    fmt::print(stderr, "spillfs-meta-bench: {}\n", e.what());
    return 1;
  }
}
