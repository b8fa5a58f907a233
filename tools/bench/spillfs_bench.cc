// spillfs-bench: measures, in one run on one directory's filesystem, the raw
// limit (io_uring O_DIRECT on a file of the filesystem that holds the volume),
// the host filesystem (write()/read() of 1 MiB, with and without O_DIRECT),
// spillfs through the mount (1 MiB, buffered and O_DIRECT), the direct path
// (libspillfs_client), torch.save/torch.load (tools/bench/torch_bench.py), the
// activation pattern (N files written, read back in reverse, unlinked; RAM
// tier large and capped) and 4 KiB random reads at several queue depths.
// Prints a table with each figure's ratio to raw, and writes JSON.
//
// Every write figure includes the fsync that makes the data durable; every
// read starts cold (page cache dropped, the volume remounted).
#include <fcntl.h>
#include <fmt/format.h>
#include <liburing.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "spillfs/client.h"
#include "spillfs/common/uring_transfers.h"

namespace {

using json = nlohmann::json;
using namespace spillfs::bench;
namespace stdfs = std::filesystem;

// ---- options and results ----

struct Options {
  std::string dir;
  std::string size = "1G";
  unsigned files = 4;
  std::string file_size = "256M";
  std::string rand_size = "1G";
  double rand_seconds = 3;
  std::vector<unsigned> rand_qds = {1, 32, 128};
  unsigned qd = 16;
  unsigned repeat = 1;         // rounds of the seq and random figures (the median is reported)
  std::string ram_tier_large;  // default: files * file_size * 4/3 + 256M
  std::string ram_tier_small = "64M";
  std::string mount_args;  // appended to every `spillfs mount`
  size_t rows_batch = 0;   // rows per spill_read_rows call (0: max(1024, 16 x QD))
  std::string spillfs_bin;
  std::string python;  // default: /usr/bin/python3 or python3, whichever imports torch
  std::string torch_script;
  std::string torch_size = "1G";
  std::string sections = "seq,torch,activation,random";
  std::string json_out;
  bool no_drop_caches = false;
  bool keep = false;
  unsigned mount_threads = 0;  // 0: spillfs default
};

struct Row {
  std::string section, name, op;
  double value = 0;
  std::string unit;
  std::optional<double> ratio;  // to raw (or to ext4 for torch, said in `vs`)
  std::string vs;
  std::string note;
};

class Bench {
 public:
  Bench(Options o, std::vector<std::string> argv) : o_(std::move(o)), argv_(std::move(argv)) {}
  int Main();

 private:
  // Environment.
  void Setup();
  void Cleanup();
  void Mkfs();
  void Mount(const std::string& ram_tier = "");
  void Unmount();
  void Remount() {
    Unmount();
    Mount();
  }
  void DropCaches();
  json SpillfsStat();
  spill_client* Client();
  void CloseClient();

  // Sections.
  void Sequential();
  void Torch();
  void Activation();
  void Random();

  // Measurements.
  double UringSequential(const std::string& path, bool write, uint64_t size, char* buf);
  double PosixSequential(const std::string& path, bool write, bool direct, uint64_t size, char* buf);
  double UringRandom(const std::string& path, uint64_t size, unsigned qd);
  double ThreadsRandom(const std::string& path, uint64_t size, unsigned threads);
  double RowsRandom(const std::string& rel, uint64_t size, unsigned qd);

  void Add(Row r);
  void Print() const;
  json Json() const;

  double MBps(uint64_t bytes, double s) const { return static_cast<double>(bytes) / s / 1e6; }

  Options o_;
  std::vector<std::string> argv_;
  uint64_t size_ = 0, file_size_ = 0, rand_size_ = 0;
  std::string work_, vol_, mnt_, host_;
  bool mounted_ = false;
  bool caches_dropped_ = false;
  spill_client* client_ = nullptr;
  std::vector<Row> rows_;
  std::map<std::string, double> raw_;  // raw figures by op
  json extra_ = json::object();
  std::string load_before_;
  json loads_ = json::object();  // load average at the start of each section
};

void Bench::Add(Row r) {
  fmt::print("  {:<34} {:<10} {:>10.1f} {:<5}{}\n", r.name, r.op, r.value, r.unit,
             r.ratio ? fmt::format("  x{:.2f} {}", *r.ratio, r.vs) : "");
  std::fflush(stdout);
  rows_.push_back(std::move(r));
}

void Bench::DropCaches() {
  sync();
  if (o_.no_drop_caches) return;
  int fd = open("/proc/sys/vm/drop_caches", O_WRONLY);
  if (fd >= 0 && write(fd, "3", 1) == 1) caches_dropped_ = true;
  if (fd >= 0) close(fd);
}

void Bench::Setup() {
  size_ = ParseSize(o_.size) / kMiB * kMiB;
  file_size_ = ParseSize(o_.file_size) / kMiB * kMiB;
  rand_size_ = ParseSize(o_.rand_size) / kMiB * kMiB;
  if (size_ == 0 || file_size_ == 0 || rand_size_ == 0) Die("sizes must be at least 1M");
  if (o_.spillfs_bin.empty()) {
    // build/bin/spillfs-bench -> build/bin/spillfs
    o_.spillfs_bin = (stdfs::path(stdfs::read_symlink("/proc/self/exe")).parent_path() / "spillfs").string();
  }
  if (!stdfs::exists(o_.spillfs_bin)) Die("no spillfs binary at " + o_.spillfs_bin + " (--spillfs)");
  if (o_.torch_script.empty()) {
    // build/bin/spillfs-bench -> tools/bench/torch_bench.py of the same tree,
    // else the source tree this was built from, else ./tools/bench.
    stdfs::path exe = stdfs::read_symlink("/proc/self/exe");
    for (stdfs::path candidate : {exe.parent_path().parent_path().parent_path() / "tools/bench/torch_bench.py",
                                  stdfs::path(__FILE__).parent_path() / "torch_bench.py",
                                  stdfs::current_path() / "tools/bench/torch_bench.py"}) {
      if (stdfs::exists(candidate)) {
        o_.torch_script = candidate.string();
        break;
      }
    }
  }
  work_ = MakeWorkDir(o_.dir, "spillfs-bench");
  vol_ = work_ + "/vol";
  mnt_ = work_ + "/mnt";
  host_ = work_ + "/host";
  stdfs::create_directories(mnt_);
  stdfs::create_directories(host_);
  Mkfs();
  Mount();
}

void Bench::Mkfs() {
  // Sparse: only what is written takes space. Room for every phase at once.
  uint64_t volume =
      3 * size_ + rand_size_ + static_cast<uint64_t>(o_.files) * file_size_ + ParseSize(o_.torch_size) + (2ull << 30);
  Run(fmt::format("{} mkfs {} --size {}M", Quote(o_.spillfs_bin), Quote(vol_), volume / kMiB));
}

void Bench::Mount(const std::string& ram_tier) {
  std::string args;
  if (!ram_tier.empty()) args += " --ram-tier " + ram_tier;
  if (o_.mount_threads > 0) args += fmt::format(" --threads {}", o_.mount_threads);
  if (!o_.mount_args.empty()) args += " " + o_.mount_args;
  Run(fmt::format("{} mount {} {}{}", Quote(o_.spillfs_bin), Quote(vol_), Quote(mnt_), args));
  mounted_ = true;
}

void Bench::Unmount() {
  CloseClient();
  if (!mounted_) return;
  Run(fmt::format("{} umount {}", Quote(o_.spillfs_bin), Quote(mnt_)));
  mounted_ = false;
}

spill_client* Bench::Client() {
  if (client_ == nullptr) {
    client_ = spill_client_open(mnt_.c_str());
    if (client_ == nullptr) Die(std::string("spill_client_open: ") + spill_last_error());
  }
  return client_;
}

void Bench::CloseClient() {
  if (client_ != nullptr) spill_client_close(client_);
  client_ = nullptr;
}

json Bench::SpillfsStat() {
  std::string out = Run(fmt::format("{} stat --json {}", Quote(o_.spillfs_bin), Quote(mnt_)));
  return json::parse(out);
}

void Bench::Cleanup() {
  try {
    Unmount();
  } catch (const std::exception& e) {
    fmt::print(stderr, "spillfs-bench: unmount: {}\n", e.what());
  }
  if (!o_.keep && !work_.empty()) {
    std::error_code ec;
    stdfs::remove_all(work_, ec);
  }
}

// ---- measurements ----

// io_uring O_DIRECT, `o_.qd` 1 MiB requests in flight; writes end with fdatasync.
double Bench::UringSequential(const std::string& path, bool write, uint64_t size, char* buf) {
  int flags = O_DIRECT | (write ? (O_WRONLY | O_CREAT | O_TRUNC) : O_RDONLY);
  Fd fd(path, flags);
  if (write && ftruncate(fd.get(), static_cast<off_t>(size)) != 0) DieErrno("ftruncate " + path);
  io_uring ring;
  unsigned qd = std::max(1u, std::min(o_.qd, 256u));
  if (int rc = io_uring_queue_init(qd, &ring, 0); rc < 0) Die(std::string("io_uring: ") + strerror(-rc));
  const uint64_t chunks = size / kMiB;
  uint64_t next = 0, done = 0;
  unsigned inflight = 0;
  auto t0 = Clock::now();
  while (done < chunks) {
    while (inflight < qd && next < chunks) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      if (sqe == nullptr) break;
      char* p = buf + next * kMiB;
      if (write)
        io_uring_prep_write(sqe, fd.get(), p, kMiB, next * kMiB);
      else
        io_uring_prep_read(sqe, fd.get(), p, kMiB, next * kMiB);
      ++next;
      ++inflight;
    }
    io_uring_submit_and_wait(&ring, 1);
    const unsigned seen = spillfs::uring::ReapAll(&ring, [&](const io_uring_cqe* cqe) {
      if (cqe->res != static_cast<int>(kMiB)) {
        io_uring_queue_exit(&ring);
        Die(fmt::format("raw {} of {}: {}", write ? "write" : "read", path,
                        cqe->res < 0 ? strerror(-cqe->res) : "short transfer"));
      }
    });
    inflight -= seen;
    done += seen;
  }
  if (write && fdatasync(fd.get()) != 0) DieErrno("fdatasync " + path);
  auto t1 = Clock::now();
  io_uring_queue_exit(&ring);
  return MBps(size, Seconds(t0, t1));
}

// write()/read() of 1 MiB; writes end with fsync.
double Bench::PosixSequential(const std::string& path, bool write, bool direct, uint64_t size, char* buf) {
  int flags = (direct ? O_DIRECT : 0) | (write ? (O_WRONLY | O_CREAT | O_TRUNC) : O_RDONLY);
  auto t0 = Clock::now();
  {
    Fd fd(path, flags);
    for (uint64_t at = 0; at < size; at += kMiB) {
      ssize_t n = write ? ::write(fd.get(), buf + at, kMiB) : ::read(fd.get(), buf + at, kMiB);
      if (n != static_cast<ssize_t>(kMiB)) {
        if (n < 0) DieErrno(fmt::format("{} {}", write ? "write" : "read", path));
        Die(fmt::format("short {} of {} at {}", write ? "write" : "read", path, at));
      }
    }
    if (write) fd.Fsync();
  }
  return MBps(size, Seconds(t0, Clock::now()));
}

// 4 KiB random O_DIRECT reads, `qd` in flight, for rand_seconds.
double Bench::UringRandom(const std::string& path, uint64_t size, unsigned qd) {
  Fd fd(path, O_RDONLY | O_DIRECT);
  io_uring ring;
  if (int rc = io_uring_queue_init(std::max(qd, 1u), &ring, 0); rc < 0) Die(std::string("io_uring: ") + strerror(-rc));
  Buffer bufs(static_cast<size_t>(qd) * kBlock);
  Rng rng(qd);
  const uint64_t blocks = size / kBlock;
  uint64_t ops = 0;
  unsigned inflight = 0;
  auto t0 = Clock::now();
  auto deadline = t0 + std::chrono::duration<double>(o_.rand_seconds);
  bool stop = false;
  std::vector<unsigned> free_slots(qd);
  for (unsigned i = 0; i < qd; ++i) free_slots[i] = i;
  while (!stop || inflight > 0) {
    while (!stop && !free_slots.empty()) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      if (sqe == nullptr) break;
      unsigned slot = free_slots.back();
      free_slots.pop_back();
      io_uring_prep_read(sqe, fd.get(), bufs.data + slot * kBlock, kBlock, (rng.Next() % blocks) * kBlock);
      io_uring_sqe_set_data64(sqe, slot);
      ++inflight;
    }
    io_uring_submit_and_wait(&ring, 1);
    const unsigned seen = spillfs::uring::ReapAll(&ring, [&](const io_uring_cqe* cqe) {
      if (cqe->res != static_cast<int>(kBlock)) {
        io_uring_queue_exit(&ring);
        Die("raw random read failed: " + std::string(cqe->res < 0 ? strerror(-cqe->res) : "short"));
      }
      free_slots.push_back(static_cast<unsigned>(io_uring_cqe_get_data64(cqe)));
    });
    inflight -= seen;
    ops += seen;
    if (Clock::now() >= deadline) stop = true;
  }
  double s = Seconds(t0, Clock::now());
  io_uring_queue_exit(&ring);
  return static_cast<double>(ops) / s;
}

// `threads` threads doing 4 KiB O_DIRECT pread() through the mount.
double Bench::ThreadsRandom(const std::string& path, uint64_t size, unsigned threads) {
  Fd fd(path, O_RDONLY | O_DIRECT);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> ops{0};
  std::atomic<int> failed{0};
  const uint64_t blocks = size / kBlock;
  std::vector<std::thread> pool;
  auto t0 = Clock::now();
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      Buffer buf(kBlock);
      Rng rng(1000 + t);
      uint64_t mine = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        if (pread(fd.get(), buf.data, kBlock, static_cast<off_t>((rng.Next() % blocks) * kBlock)) !=
            static_cast<ssize_t>(kBlock)) {
          failed = errno ? errno : EIO;
          break;
        }
        ++mine;
      }
      ops += mine;
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(o_.rand_seconds));
  stop = true;
  for (auto& th : pool) th.join();
  double s = Seconds(t0, Clock::now());
  if (failed) Die(std::string("pread through the mount failed: ") + strerror(failed));
  return static_cast<double>(ops.load()) / s;
}

// Rows per spill_read_rows call (a training batch's worth), unless --rows-batch.
size_t RowsBatch(unsigned qd, size_t fixed) {
  return fixed > 0 ? fixed : std::max<size_t>(1024, 16 * static_cast<size_t>(qd));
}

// spill_read_rows of 4 KiB rows, `qd` I/Os in flight within each batch.
double Bench::RowsRandom(const std::string& rel, uint64_t size, unsigned qd) {
  spill_client* c = Client();
  if (spill_client_set(c, "rows_queue_depth", qd) != 0) Die(spill_last_error());
  const size_t batch = RowsBatch(qd, o_.rows_batch);
  const uint64_t rows_in_file = size / kBlock;
  std::vector<uint64_t> rows(batch);
  Buffer out(batch * kBlock);
  Rng rng(7 + qd);
  uint64_t first = 0;
  if (spill_read_rows(c, rel.c_str(), kBlock, &first, 1, out.data) != 0) {
    Die(std::string("spill_read_rows: ") + spill_last_error());  // takes the layout, outside the timing
  }
  uint64_t ops = 0;
  auto t0 = Clock::now();
  auto deadline = t0 + std::chrono::duration<double>(o_.rand_seconds);
  while (Clock::now() < deadline) {
    for (auto& r : rows) r = rng.Next() % rows_in_file;
    if (spill_read_rows(c, rel.c_str(), kBlock, rows.data(), rows.size(), out.data) != 0) {
      Die(std::string("spill_read_rows: ") + spill_last_error());
    }
    ops += rows.size();
  }
  return static_cast<double>(ops) / Seconds(t0, Clock::now());
}

// ---- sections ----

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void Bench::Sequential() {
  fmt::print("sequential, {} per file, 1 MiB requests (raw: io_uring QD {}), {} round(s):\n", HumanSize(size_), o_.qd,
             o_.repeat);
  Buffer buf(size_);
  Buffer expect(size_);
  uint64_t seed = 1;
  // name -> samples, in the order first seen
  std::vector<std::pair<std::string, std::string>> order;  // (name, op)
  std::map<std::pair<std::string, std::string>, std::vector<double>> samples;
  std::map<std::pair<std::string, std::string>, std::string> notes;
  auto sample = [&](const std::string& name, const std::string& op, double v, const std::string& note) {
    auto key = std::make_pair(name, op);
    if (!samples.count(key)) order.push_back(key);
    samples[key].push_back(v);
    notes[key] = note;
    fmt::print("    {:<36} {:<6} {:>9.1f} MB/s\n", name, op, v);
    std::fflush(stdout);
  };
  // What the daemon spent syncing the data area during one write (outside
  // its timing): each flush batch is synced before it is mapped.
  auto syncs_since = [&](const json& before) {
    json after = SpillfsStat();
    auto count = [](const json& j) { return j.value("data_syncs", uint64_t{0}); };
    auto seconds = [](const json& j) { return j.value("data_sync_seconds", 0.0); };
    return fmt::format("+ fsync; {} data syncs, {:.0f} ms in them", count(after) - count(before),
                       (seconds(after) - seconds(before)) * 1e3);
  };
  for (unsigned round = 0; round < o_.repeat; ++round) {
    if (o_.repeat > 1) fmt::print("  round {} (load {})\n", round + 1, LoadAverage());
    // Writes (each with its own bytes, so dedup shares nothing).
    FillRandom(buf.data, size_, seed++);
    sample("raw io_uring O_DIRECT", "write", UringSequential(work_ + "/raw.bin", true, size_, buf.data),
           "the limit: a file on the filesystem that holds the volume");
    FillRandom(buf.data, size_, seed++);
    sample("host fs O_DIRECT write()", "write", PosixSequential(host_ + "/direct.bin", true, true, size_, buf.data),
           "+ fsync");
    FillRandom(buf.data, size_, seed++);
    sample("host fs buffered write()", "write", PosixSequential(host_ + "/buffered.bin", true, false, size_, buf.data),
           "+ fsync");
    FillRandom(buf.data, size_, seed++);
    json before = SpillfsStat();
    double mbps = PosixSequential(mnt_ + "/buffered.bin", true, false, size_, buf.data);
    sample("spillfs mount buffered write()", "write", mbps, syncs_since(before));
    FillRandom(buf.data, size_, seed++);
    before = SpillfsStat();
    mbps = PosixSequential(mnt_ + "/direct.bin", true, true, size_, buf.data);
    sample("spillfs mount O_DIRECT write()", "write", mbps, syncs_since(before));
    const uint64_t client_seed = seed++;
    FillRandom(buf.data, size_, client_seed);
    {
      spill_client* c = Client();
      before = SpillfsStat();
      auto t0 = Clock::now();
      if (spill_write(c, "/client.bin", buf.data, size_) != 0) Die(std::string("spill_write: ") + spill_last_error());
      Fd fd(mnt_ + "/client.bin", O_RDONLY);
      fd.Fsync();  // the daemon syncs the data area and its index
      mbps = MBps(size_, Seconds(t0, Clock::now()));
      sample("spillfs direct path spill_write", "write", mbps, syncs_since(before));
    }
    // Reads, cold: the volume remounted, page cache dropped before each.
    Remount();
    DropCaches();
    sample("raw io_uring O_DIRECT", "read", UringSequential(work_ + "/raw.bin", false, size_, buf.data), "");
    DropCaches();
    sample("host fs O_DIRECT read()", "read", PosixSequential(host_ + "/direct.bin", false, true, size_, buf.data), "");
    DropCaches();
    sample("host fs buffered read()", "read", PosixSequential(host_ + "/buffered.bin", false, false, size_, buf.data),
           "");
    DropCaches();
    sample("spillfs mount buffered read()", "read",
           PosixSequential(mnt_ + "/buffered.bin", false, false, size_, buf.data), "");
    DropCaches();
    sample("spillfs mount O_DIRECT read()", "read", PosixSequential(mnt_ + "/direct.bin", false, true, size_, buf.data),
           "");
    DropCaches();
    {
      spill_client* c = Client();
      auto t0 = Clock::now();
      int64_t n = spill_read(c, "/client.bin", buf.data, size_, 0);
      if (n != static_cast<int64_t>(size_)) Die(std::string("spill_read: ") + spill_last_error());
      sample("spillfs direct path spill_read", "read", MBps(size_, Seconds(t0, Clock::now())), "checksums verified");
      // Check what came back (outside the timing).
      FillRandom(expect.data, size_, client_seed);
      if (std::memcmp(expect.data, buf.data, size_) != 0) Die("spill_read returned other bytes than spill_write wrote");
    }
    unlink((work_ + "/raw.bin").c_str());
    for (const char* f : {"/direct.bin", "/buffered.bin"}) unlink((host_ + f).c_str());
    for (const char* f : {"/direct.bin", "/buffered.bin", "/client.bin"}) unlink((mnt_ + f).c_str());
  }
  raw_["write"] = Median(samples[{"raw io_uring O_DIRECT", "write"}]);
  raw_["read"] = Median(samples[{"raw io_uring O_DIRECT", "read"}]);
  fmt::print("  median of {} round(s):\n", o_.repeat);
  for (const auto& key : order) {
    double v = Median(samples[key]);
    std::string note = notes[key];
    if (o_.repeat > 1) {
      auto [lo, hi] = std::minmax_element(samples[key].begin(), samples[key].end());
      note += (note.empty() ? "" : "; ") + fmt::format("range {:.0f}-{:.0f}", *lo, *hi);
    }
    Add({"seq", key.first, key.second, v, "MB/s", v / raw_[key.second], "raw", note});
  }
}

void Bench::Torch() {
  // --python, else the first of /usr/bin/python3 and python3 that has torch.
  std::vector<std::string> pythons = {o_.python};
  if (o_.python.empty()) pythons = {"/usr/bin/python3", "python3"};
  std::string python;
  for (const std::string& p : pythons) {
    int status = 0;
    Run(Quote(p) + " -c 'import torch'", &status);
    if (status == 0) {
      python = p;
      break;
    }
  }
  if (python.empty() || o_.torch_script.empty()) {
    std::string why = python.empty() ? "no python that imports torch" : "torch_bench.py not found";
    fmt::print("torch: skipped ({})\n", why);
    extra_["torch"] = "skipped: " + why;
    return;
  }
  fmt::print("torch.save / torch.load of a {} tensor (+ fsync; load cold):\n", HumanSize(ParseSize(o_.torch_size)));
  std::string cmd =
      fmt::format("{} {} --host-dir {} --mount-dir {} --size {} --json{}", Quote(python), Quote(o_.torch_script),
                  Quote(host_), Quote(mnt_), o_.torch_size, o_.no_drop_caches ? " --no-drop-caches" : "");
  std::string out = Run(cmd);
  // The last line is the JSON object.
  std::string last;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line[0] == '{') last = line;
  }
  if (last.empty()) Die("torch_bench.py printed no JSON: " + out);
  json r = json::parse(last);
  extra_["torch"] = r;
  double host_save = r["host"]["save_GBps"], host_load = r["host"]["load_GBps"];
  double m_save = r["mount"]["save_GBps"], m_load = r["mount"]["load_GBps"];
  std::string dev = r.value("device", "cpu");
  Add({"torch", "torch.save host fs (" + dev + ")", "write", host_save * 1e3, "MB/s", 1.0, "host", "+ fsync"});
  Add({"torch", "torch.save spillfs mount (" + dev + ")", "write", m_save * 1e3, "MB/s", m_save / host_save, "host",
       "+ fsync"});
  Add({"torch", "torch.load host fs (" + dev + ")", "read", host_load * 1e3, "MB/s", 1.0, "host", ""});
  Add({"torch", "torch.load spillfs mount (" + dev + ")", "read", m_load * 1e3, "MB/s", m_load / host_load, "host",
       ""});
}

void Bench::Activation() {
  uint64_t large = o_.ram_tier_large.empty()
                       // The tier starts writing to the SSD when 3/4 full
                       // (RamTier's high watermark): large enough
                       // means every file fits below that.
                       ? static_cast<uint64_t>(o_.files) * file_size_ / 3 * 4 + 256 * kMiB
                       : ParseSize(o_.ram_tier_large);
  fmt::print(
      "activation pattern: {} files of {} written (1 MiB write()), read back in reverse, "
      "unlinked,\n"
      "  in an ephemeral directory (user.spillfs.ephemeral=1):\n",
      o_.files, HumanSize(file_size_));
  Buffer buf(file_size_);
  json runs = json::array();
  auto pattern = [&](const std::string& dir, const std::string& label, bool spillfs) {
    stdfs::create_directories(dir);
    if (spillfs && setxattr(dir.c_str(), "user.spillfs.ephemeral", "1", 1, 0) != 0) DieErrno("setxattr " + dir);
    json before = spillfs ? SpillfsStat() : json::object();
    double write_s = 0, read_s = 0;
    for (unsigned i = 0; i < o_.files; ++i) {
      FillRandom(buf.data, file_size_, 100 + i);  // outside the timing
      auto t0 = Clock::now();
      {
        Fd fd(fmt::format("{}/a{}", dir, i), O_WRONLY | O_CREAT | O_TRUNC);
        for (uint64_t at = 0; at < file_size_; at += kMiB) {
          if (write(fd.get(), buf.data + at, kMiB) != static_cast<ssize_t>(kMiB)) DieErrno("write " + dir);
        }
      }
      write_s += Seconds(t0, Clock::now());
    }
    for (unsigned i = o_.files; i-- > 0;) {
      auto t0 = Clock::now();
      std::string path = fmt::format("{}/a{}", dir, i);
      {
        Fd fd(path, O_RDONLY);
        for (uint64_t at = 0; at < file_size_; at += kMiB) {
          if (read(fd.get(), buf.data + at, kMiB) != static_cast<ssize_t>(kMiB)) DieErrno("read " + path);
        }
      }
      if (unlink(path.c_str()) != 0) DieErrno("unlink " + path);
      read_s += Seconds(t0, Clock::now());
    }
    const uint64_t total = static_cast<uint64_t>(o_.files) * file_size_;
    json run = {{"label", label},
                {"files", o_.files},
                {"file_bytes", file_size_},
                {"write_seconds", write_s},
                {"read_unlink_seconds", read_s}};
    std::string note;
    if (spillfs) {
      json after = SpillfsStat();
      uint64_t ssd = after["bytes_written_ssd"].get<uint64_t>() - before["bytes_written_ssd"].get<uint64_t>();
      uint64_t cancelled = after["bytes_cancelled"].get<uint64_t>() - before["bytes_cancelled"].get<uint64_t>();
      run["bytes_written_ssd"] = ssd;
      run["bytes_cancelled"] = cancelled;
      note = fmt::format("ssd written {} MiB, cancelled {} MiB", ssd / kMiB, cancelled / kMiB);
    }
    runs.push_back(run);
    Add({"activation", label, "write", MBps(total, write_s), "MB/s", MBps(total, write_s) / raw_["write"], "raw",
         note});
    Add({"activation", label, "read+unlink", MBps(total, read_s), "MB/s", MBps(total, read_s) / raw_["read"], "raw",
         ""});
  };
  if (!raw_.count("write")) {  // no seq section: take the raw figures here
    Buffer raw(file_size_);
    FillRandom(raw.data, file_size_, 99);
    raw_["write"] = UringSequential(work_ + "/raw.bin", true, file_size_, raw.data);
    DropCaches();
    raw_["read"] = UringSequential(work_ + "/raw.bin", false, file_size_, raw.data);
    unlink((work_ + "/raw.bin").c_str());
  }
  DropCaches();
  pattern(host_ + "/act", "host fs (page cache)", false);
  Unmount();
  Mount(HumanSize(large));
  pattern(mnt_ + "/act", "spillfs --ram-tier " + HumanSize(large), true);
  Unmount();
  Mount(o_.ram_tier_small);
  pattern(mnt_ + "/act", "spillfs --ram-tier " + o_.ram_tier_small, true);
  Unmount();
  Mount();
  extra_["activation"] = runs;
}

void Bench::Random() {
  fmt::print("4 KiB random reads of a {} file, {:.0f} s per figure:\n", HumanSize(rand_size_), o_.rand_seconds);
  {
    Buffer buf(rand_size_);
    FillRandom(buf.data, rand_size_, 42);
    UringSequential(work_ + "/rand.bin", true, rand_size_, buf.data);
    FillRandom(buf.data, rand_size_, 43);
    if (spill_write(Client(), "/rand.bin", buf.data, rand_size_) != 0) {
      Die(std::string("spill_write: ") + spill_last_error());
    }
    Fd fd(mnt_ + "/rand.bin", O_RDONLY);
    fd.Fsync();
  }
  Remount();
  DropCaches();
  for (unsigned qd : o_.rand_qds) {
    std::string q = fmt::format("QD{}", qd);
    std::vector<double> raw_s, mount_s, rows_s;
    for (unsigned round = 0; round < o_.repeat; ++round) {  // interleaved
      raw_s.push_back(UringRandom(work_ + "/rand.bin", rand_size_, qd));
      mount_s.push_back(ThreadsRandom(mnt_ + "/rand.bin", rand_size_, qd));
      rows_s.push_back(RowsRandom("/rand.bin", rand_size_, qd));
    }
    auto range = [&](const std::vector<double>& v, std::string note) {
      if (v.size() < 2) return note;
      auto [lo, hi] = std::minmax_element(v.begin(), v.end());
      return note + (note.empty() ? "" : "; ") + fmt::format("range {:.0f}-{:.0f}", *lo, *hi);
    };
    double raw = Median(raw_s), mount = Median(mount_s), rows = Median(rows_s);
    raw_["rand" + q] = raw;
    Add({"random", "raw io_uring O_DIRECT " + q, "randread", raw, "IOPS", 1.0, "raw", range(raw_s, "")});
    Add({"random", fmt::format("spillfs mount pread x{} threads", qd), "randread", mount, "IOPS", mount / raw, "raw",
         range(mount_s, "O_DIRECT")});
    Add({"random", "spillfs spill_read_rows " + q, "randread", rows, "IOPS", rows / raw, "raw",
         range(rows_s, fmt::format("batches of {}", RowsBatch(qd, o_.rows_batch)))});
  }
  unlink((work_ + "/rand.bin").c_str());
  unlink((mnt_ + "/rand.bin").c_str());
}

// ---- output ----

json Bench::Json() const {
  utsname u{};
  uname(&u);
  json results = json::array();
  for (const Row& r : rows_) {
    json j = {{"section", r.section}, {"name", r.name}, {"op", r.op}, {"value", r.value}, {"unit", r.unit}};
    if (r.ratio) {
      j["ratio"] = *r.ratio;
      j["ratio_to"] = r.vs;
    }
    if (!r.note.empty()) j["note"] = r.note;
    results.push_back(j);
  }
  std::string command;
  for (const auto& a : argv_) command += (command.empty() ? "" : " ") + a;
  return {{"command", command},
          {"machine",
           {{"kernel", std::string(u.release)},
            {"cpus", std::thread::hardware_concurrency()},
            {"cpu", CpuModel()},
            {"load_before", load_before_},
            {"load_after", LoadAverage()},
            {"load_by_section", loads_},
            {"caches_dropped", caches_dropped_}}},
          {"config",
           {{"dir", o_.dir},
            {"size", size_},
            {"files", o_.files},
            {"file_size", file_size_},
            {"rand_size", rand_size_},
            {"rand_seconds", o_.rand_seconds},
            {"qd", o_.qd},
            {"repeat", o_.repeat}}},
          {"results", results},
          {"details", extra_}};
}

void Bench::Print() const {
  fmt::print("\n{:<12} {:<38} {:<11} {:>11} {:<5} {:>8}  {}\n", "section", "what", "op", "value", "unit", "ratio",
             "note");
  fmt::print("{}\n", std::string(110, '-'));
  for (const Row& r : rows_) {
    std::string ratio = r.ratio ? fmt::format("{:.2f}", *r.ratio) + (r.vs == "raw" ? "" : " v" + r.vs) : "";
    fmt::print("{:<12} {:<38} {:<11} {:>11.1f} {:<5} {:>8}  {}\n", r.section, r.name, r.op, r.value, r.unit, ratio,
               r.note);
  }
  fmt::print(
      "ratio: to raw io_uring O_DIRECT on the same filesystem in this run (torch: to the host "
      "fs)\n");
}

int Bench::Main() {
  load_before_ = LoadAverage();
  fmt::print("spillfs-bench: load average {} on {} CPUs ({})\n", load_before_, std::thread::hardware_concurrency(),
             CpuModel());
  std::set<std::string> sections;
  {
    std::stringstream ss(o_.sections);
    for (std::string s; std::getline(ss, s, ',');) sections.insert(s);
  }
  for (const auto& s : sections) {
    if (s != "seq" && s != "torch" && s != "activation" && s != "random") Die("unknown section " + s);
  }
  int rc = 0;
  try {
    Setup();
    fmt::print("working in {}\n", work_);
    auto section = [&](const char* name, void (Bench::*run)()) {
      if (!sections.count(name)) return;
      std::string load = LoadAverage();
      loads_[name] = load;
      fmt::print("[{}] load average {}\n", name, load);
      (this->*run)();
    };
    section("seq", &Bench::Sequential);
    section("random", &Bench::Random);
    section("torch", &Bench::Torch);
    section("activation", &Bench::Activation);
  } catch (const std::exception& e) {
    fmt::print(stderr, "spillfs-bench: {}\n", e.what());
    rc = 1;
  }
  Cleanup();
  Print();
  if (!o_.json_out.empty()) {
    std::ofstream out(o_.json_out);
    out << Json().dump(2) << "\n";
    if (!out) {
      fmt::print(stderr, "spillfs-bench: cannot write {}\n", o_.json_out);
      rc = 1;
    }
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"spillfs-bench: raw vs host filesystem vs spillfs (mount and direct path), in one run"};
  Options o;
  app.add_option("--dir", o.dir, "Directory on the filesystem to measure (the volume, raw and host files go here)")
      ->required();
  app.add_option("--size", o.size, "Bytes per sequential test file")->capture_default_str();
  app.add_option("--files", o.files, "Files of the activation pattern")->capture_default_str();
  app.add_option("--file-size", o.file_size, "Size of each activation file (64M-512M)")->capture_default_str();
  app.add_option("--rand-size", o.rand_size, "Size of the random-read file")->capture_default_str();
  app.add_option("--rand-seconds", o.rand_seconds, "Seconds per random-read figure")->capture_default_str();
  app.add_option("--rand-qd", o.rand_qds, "Queue depths of the random reads")->capture_default_str();
  app.add_option("--qd", o.qd, "Queue depth of the raw sequential io_uring runs")->capture_default_str();
  app.add_option("--repeat", o.repeat, "Rounds of the seq and random figures (median reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 20));
  app.add_option("--ram-tier-large", o.ram_tier_large,
                 "Large RAM tier (default: files x file-size x 4/3 + 256M: all below the 3/4 high watermark)");
  app.add_option("--ram-tier-small", o.ram_tier_small, "Capped RAM tier")->capture_default_str();
  app.add_option("--threads", o.mount_threads, "spillfs mount --threads (default: its own)");
  app.add_option("--rows-batch", o.rows_batch, "Rows per spill_read_rows call (default: max(1024, 16 x QD))");
  app.add_option("--mount-args", o.mount_args, "Extra arguments of every `spillfs mount`, e.g. \"--dirty-share 0\"");
  app.add_option("--spillfs", o.spillfs_bin, "The spillfs binary (default: beside this one)");
  app.add_option("--python", o.python, "Python with torch for torch_bench.py")->capture_default_str();
  app.add_option("--torch-script", o.torch_script, "Path of torch_bench.py (default: from the source tree)");
  app.add_option("--torch-size", o.torch_size, "Tensor size for torch.save/torch.load")->capture_default_str();
  app.add_option("--sections", o.sections, "Comma list of seq,random,torch,activation")->capture_default_str();
  app.add_option("--json-out", o.json_out, "Write the results as JSON here");
  app.add_flag("--no-drop-caches", o.no_drop_caches, "Do not drop the page cache before reads");
  app.add_flag("--keep", o.keep, "Keep the working directory");
  CLI11_PARSE(app, argc, argv);
  std::vector<std::string> args(argv, argv + argc);
  Bench bench(o, args);
  signal(SIGPIPE, SIG_IGN);
  return bench.Main();
}
