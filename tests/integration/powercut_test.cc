// The power-cut simulation below the daemon: every data-area write that was
// not made durable (fdatasync) when the daemon dies is undone, and the volume
// must still come back consistent with every fsync'd byte.
//
// The daemon is mounted with SPILLFS_POWERCUT_JOURNAL set (block_store.h):
// its BlockStore journals the pre-image of every write and empties the
// journal at each Flush (fdatasync), so the journal holds the old bytes of
// exactly the writes that are not durable. A seeded writer workload (creates,
// writes, overwrites at random offsets, truncates, renames, unlinks, mkdirs, fsync /
// fdatasync of files, fsync of files written earlier and of directories, and
// phases without any fsync) records the content of each file at its last
// fsync; the daemon is SIGKILLed
// at a seeded moment; the pre-images are written back into VOLUME/data.img
// in reverse order, which is what a power cut at that instant could leave of
// the data area. Then `spillfs fsck` must find the volume consistent (orphans
// pending for mount allowed, as in crash_test), the volume must mount, every
// fsync'd file must read back byte for byte, every other file must read as
// some bytes or EIO (never hang or kill the daemon), and the daemon must
// unmount cleanly.
//
// Only the data area loses writes here: the index (RocksDB) WAL written
// without sync survives a SIGKILL in the page cache, so metadata that was
// committed but not synced is kept. A real power cut could lose that too.
//
// Environment:
//   SPILLFS_POWERCUT_ITERATIONS=N  iterations (default 8)
//   SPILLFS_POWERCUT_SEED=S        first seed (default 1); iteration i uses S + i
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dirent.h>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "mounted_volume.h"

namespace spillfs::testing {
namespace {

constexpr uint64_t kDefaultIterations = 8;
constexpr uint64_t kMaxFiles = 40;
constexpr int kMinKillMs = 200;
constexpr int kMaxKillMs = 1800;
// The journal format of fs/include/spillfs/fs/block_store.h.
constexpr const char* kJournalEnv = "SPILLFS_POWERCUT_JOURNAL";
constexpr uint32_t kRecordMagic = 0x50434a31;
struct RecordHeader {
  uint32_t magic;
  uint32_t reserved;
  uint64_t offset;
  uint64_t length;
};

uint64_t EnvU64(const char* name, uint64_t fallback) {
  const char* value = getenv(name);
  return value != nullptr && *value != '\0' ? std::strtoull(value, nullptr, 10) : fallback;
}

std::string RandomBytes(std::mt19937_64& rng, size_t n) {
  std::string out(n, '\0');
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = rng();
    std::memcpy(&out[i], &v, 8);
  }
  for (; i < n; ++i) out[i] = static_cast<char>(rng());
  return out;
}

bool WriteAll(int fd, const char* data, size_t size, off_t offset) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = pwrite(fd, data + done, size - done, offset + static_cast<off_t>(done));
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// Reads a whole file; false (errno set) when it cannot be opened or read.
bool ReadWhole(const std::string& path, std::string* out) {
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return false;
  out->clear();
  std::string buf(1 << 20, '\0');
  for (;;) {
    ssize_t n = read(fd, buf.data(), buf.size());
    if (n < 0) {
      int error = errno;
      close(fd);
      errno = error;
      return false;
    }
    if (n == 0) break;
    out->append(buf.data(), static_cast<size_t>(n));
  }
  close(fd);
  return true;
}

// The writer workload and its model of what is durable.
class Writer {
 public:
  Writer(const MountedVolume& volume, uint64_t seed) : rng_(seed) {
    root_ = open(volume.mountpoint().c_str(), O_RDONLY | O_DIRECTORY);
  }
  ~Writer() {
    if (root_ >= 0) close(root_);
  }

  // Runs operations until one fails (the daemon was killed). Paths are
  // resolved from a descriptor of the mounted root, so nothing lands in the
  // directory under the mountpoint once the mount is detached.
  void Run(const std::atomic<bool>& killed) {
    dirs_ = {""};
    if (root_ < 0) {
      early_failure_ = "cannot open the mount root";
      return;
    }
    while (!failed_ && ops_ < 100000) {
      Step();
      if (failed_ && !killed.load()) {
        std::lock_guard lock(mu_);
        early_failure_ = last_op_ + ": " + strerror(last_errno_);
      }
    }
  }

  std::map<std::string, std::string> durable() const { return durable_; }
  std::set<std::string> known() const {
    std::set<std::string> paths;
    for (const auto& [path, content] : files_) paths.insert(path);
    return paths;
  }
  uint64_t ops() const { return ops_; }
  uint64_t fsyncs() const { return fsyncs_; }
  std::string early_failure() {
    std::lock_guard lock(mu_);
    return early_failure_;
  }
  const std::string& last_op() const { return last_op_; }

 private:
  bool Check(bool ok, const std::string& what) {
    if (!ok) {
      last_errno_ = errno;
      last_op_ = what;
      failed_ = true;
    }
    return ok;
  }
  uint64_t Pick(uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng_); }
  size_t WriteSize() {
    switch (Pick(4)) {
      case 0:
        return Pick(512) + 1;
      case 1:
        return Pick(64 << 10) + 1;
      case 2:
        return Pick(256 << 10) + 1;
      default:
        return Pick(2 << 20) + 1;
    }
  }
  std::string RandomDir() { return dirs_[Pick(dirs_.size())]; }
  std::string Join(const std::string& dir, const std::string& name) {
    return dir.empty() ? name : dir + "/" + name;
  }
  // In a phase without fsync, files that are durable now are left alone
  // (when there are others), so that the kill finds them next to lost writes.
  std::string RandomFile() {
    std::vector<const std::string*> candidates;
    if (unsynced_phase_ > 0) {
      for (const auto& [path, content] : files_) {
        if (!durable_.count(path)) candidates.push_back(&path);
      }
    }
    if (!candidates.empty()) return *candidates[Pick(candidates.size())];
    auto it = files_.begin();
    std::advance(it, static_cast<long>(Pick(files_.size())));
    return it->first;
  }
  bool Sync(int fd, const std::string& path) {
    if (unsynced_phase_ > 0) return true;  // data reaches the SSD at close, not durably
    if (!Check((Pick(2) == 0 ? fsync(fd) : fdatasync(fd)) == 0, "fsync " + path)) return false;
    ++fsyncs_;
    durable_[path] = files_[path];
    return true;
  }

  void Step() {
    ++ops_;
    // Phases without any fsync (every fsync makes all earlier data writes
    // durable), so that a kill often finds many writes to undo.
    if (unsynced_phase_ > 0) {
      --unsynced_phase_;
    } else if (Pick(8) == 0) {
      unsynced_phase_ = 5 + Pick(40);
    }
    uint64_t dice = Pick(100);
    if (files_.size() < 4 || (dice < 30 && files_.size() < kMaxFiles)) return Create();
    if (dice < 52) return Overwrite();
    if (dice < 62) return SyncLater();
    if (dice < 72) return Rename();
    if (dice < 84 || files_.size() >= kMaxFiles) return Unlink();
    if (dice < 90) return MakeDir();
    if (dice < 94) return SyncDir();
    return Create();
  }

  void Create() {
    std::string path = Join(RandomDir(), "f" + std::to_string(next_name_++));
    durable_.erase(path);
    std::string content = RandomBytes(rng_, WriteSize());
    int fd = openat(root_, path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
    if (!Check(fd >= 0, "create " + path)) return;
    files_[path] = "";
    for (size_t at = 0; at < content.size();) {
      size_t piece = std::min(content.size() - at, WriteSize());
      if (!Check(WriteAll(fd, content.data() + at, piece, static_cast<off_t>(at)),
                 "write " + path)) {
        close(fd);
        return;
      }
      at += piece;
      files_[path] = content.substr(0, at);
    }
    if (Pick(100) < 40 && !Sync(fd, path)) {
      close(fd);
      return;
    }
    close(fd);  // writes the cached data (not durably) when not synced
  }

  void Overwrite() {
    std::string path = RandomFile();
    std::string& content = files_[path];
    durable_.erase(path);
    int fd = openat(root_, path.c_str(), O_WRONLY);
    if (!Check(fd >= 0, "open " + path)) return;
    if (Pick(5) == 0) {  // truncate down (often inside an extent) or up
      size_t size = Pick(3) == 0 ? content.size() + Pick(1 << 20) : Pick(content.size() + 1);
      if (!Check(ftruncate(fd, static_cast<off_t>(size)) == 0, "truncate " + path)) {
        close(fd);
        return;
      }
      content.resize(size, '\0');
      if (Pick(100) < 35 && !Sync(fd, path)) {
        close(fd);
        return;
      }
      close(fd);
      return;
    }
    size_t offset = Pick(content.size() + (64 << 10));
    std::string data = RandomBytes(rng_, WriteSize());
    if (!Check(WriteAll(fd, data.data(), data.size(), static_cast<off_t>(offset)),
               "overwrite " + path)) {
      close(fd);
      return;
    }
    if (content.size() < offset + data.size()) content.resize(offset + data.size(), '\0');
    content.replace(offset, data.size(), data);
    if (Pick(100) < 35 && !Sync(fd, path)) {
      close(fd);
      return;
    }
    close(fd);
  }

  // fsync of a file whose data was written (by close) some time before.
  void SyncLater() {
    if (unsynced_phase_ > 0) return;
    std::string path = RandomFile();
    int fd = openat(root_, path.c_str(), O_RDONLY);
    if (!Check(fd >= 0, "open " + path)) return;
    Sync(fd, path);
    close(fd);
  }

  void Rename() {
    std::string from = RandomFile();
    std::string to =
        Pick(3) == 0 ? RandomFile() : Join(RandomDir(), "r" + std::to_string(next_name_++));
    if (to == from) return;
    durable_.erase(from);
    durable_.erase(to);
    if (!Check(renameat(root_, from.c_str(), root_, to.c_str()) == 0, "rename " + from + " " + to))
      return;
    files_[to] = std::move(files_[from]);
    files_.erase(from);
  }

  void Unlink() {
    std::string path = RandomFile();
    durable_.erase(path);
    if (!Check(unlinkat(root_, path.c_str(), 0) == 0, "unlink " + path)) return;
    files_.erase(path);
  }

  void MakeDir() {
    if (dirs_.size() >= 8) return;
    std::string path = Join(RandomDir(), "d" + std::to_string(next_name_++));
    if (!Check(mkdirat(root_, path.c_str(), 0755) == 0, "mkdir " + path)) return;
    dirs_.push_back(path);
  }

  void SyncDir() {
    if (unsynced_phase_ > 0) return;
    std::string dir = RandomDir();
    int fd = openat(root_, dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (!Check(fd >= 0, "open dir " + dir)) return;
    bool ok = fsync(fd) == 0;
    close(fd);
    Check(ok, "fsync dir " + dir);
  }

  int root_ = -1;
  std::mt19937_64 rng_;
  std::vector<std::string> dirs_;
  std::map<std::string, std::string> files_;  // path -> content now
  std::map<std::string, std::string>
      durable_;  // path -> content at its last fsync, untouched since
  uint64_t next_name_ = 0;
  uint64_t unsynced_phase_ = 0;  // operations left in a phase without fsync
  uint64_t ops_ = 0;
  uint64_t fsyncs_ = 0;
  bool failed_ = false;
  int last_errno_ = 0;
  std::string last_op_;
  std::mutex mu_;
  std::string early_failure_;
};

struct Revert {
  uint64_t records = 0;
  uint64_t bytes = 0;
  bool torn_tail = false;  // a record cut short by the kill (its write was never issued)
};

// Writes the journal's pre-images back into `image`, newest first.
Revert ApplyJournal(const std::string& journal, const std::string& image, std::string* error) {
  Revert revert;
  std::string bytes;
  if (!ReadWhole(journal, &bytes)) {
    *error = "cannot read the journal " + journal + ": " + strerror(errno);
    return revert;
  }
  struct Record {
    uint64_t offset;
    uint64_t length;
    size_t at;
  };
  std::vector<Record> records;
  size_t at = 0;
  while (at < bytes.size()) {
    RecordHeader header;
    if (bytes.size() - at < sizeof(header)) {
      revert.torn_tail = true;
      break;
    }
    std::memcpy(&header, bytes.data() + at, sizeof(header));
    if (header.magic != kRecordMagic) {
      *error = "journal record at " + std::to_string(at) + " has a bad magic";
      return revert;
    }
    if (bytes.size() - at - sizeof(header) < header.length) {
      revert.torn_tail = true;
      break;
    }
    records.push_back({header.offset, header.length, at + sizeof(header)});
    at += sizeof(header) + header.length;
  }
  int fd = open(image.c_str(), O_WRONLY);
  if (fd < 0) {
    *error = "cannot open " + image + ": " + strerror(errno);
    return revert;
  }
  for (auto it = records.rbegin(); it != records.rend(); ++it) {
    if (!WriteAll(fd, bytes.data() + it->at, it->length, static_cast<off_t>(it->offset))) {
      *error = "cannot write " + image + ": " + strerror(errno);
      break;
    }
    ++revert.records;
    revert.bytes += it->length;
  }
  if (fsync(fd) != 0 && error->empty()) *error = "fsync of " + image + ": " + strerror(errno);
  close(fd);
  return revert;
}

struct FsckResult {
  int rc = -1;
  std::string output;
  std::set<std::string> kinds;
};

FsckResult RunFsck(const std::string& volume) {
  FsckResult result;
  result.rc = RunSpillfs("fsck " + volume + " --json", &result.output);
  size_t start = result.output.find('{');
  if (start != std::string::npos) {
    auto report = nlohmann::json::parse(result.output.substr(start), nullptr, false);
    if (!report.is_discarded() && report.contains("problems")) {
      for (const auto& p : report["problems"]) result.kinds.insert(p.value("kind", "?"));
    }
  }
  return result;
}

// Every regular file under the mount (volume paths).
void Walk(const MountedVolume& volume, const std::string& rel, std::vector<std::string>* files) {
  DIR* d = opendir(volume.Path(rel).c_str());
  ASSERT_NE(d, nullptr) << rel << ": " << strerror(errno);
  std::vector<std::string> names;
  while (struct dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name != "." && name != ".." && !(rel.empty() && name == ".spillfs")) names.push_back(name);
  }
  closedir(d);
  for (const std::string& name : names) {
    std::string path = rel.empty() ? name : rel + "/" + name;
    struct stat st {};
    ASSERT_EQ(lstat(volume.Path(path).c_str(), &st), 0) << path << ": " << strerror(errno);
    if (S_ISDIR(st.st_mode)) {
      Walk(volume, path, files);
    } else if (S_ISREG(st.st_mode)) {
      files->push_back(path);
    }
  }
}

struct Totals {
  uint64_t survived = 0;
  uint64_t files_verified = 0;
  uint64_t bytes_verified = 0;
  uint64_t records_reverted = 0;
  uint64_t bytes_reverted = 0;
  uint64_t unsynced_eio = 0;
  uint64_t unsynced_read = 0;
  uint64_t ops = 0;
  uint64_t fsyncs = 0;
  std::vector<uint64_t> failed_seeds;
};

// Sets SPILLFS_POWERCUT_JOURNAL for the children started while it lives.
class JournalEnv {
 public:
  explicit JournalEnv(const std::string& path) { setenv(kJournalEnv, path.c_str(), 1); }
  ~JournalEnv() { unsetenv(kJournalEnv); }
};

void RunIteration(uint64_t seed, Totals* totals) {
  std::mt19937_64 timing(seed * 104729);
  const int kill_ms = std::uniform_int_distribution<int>(kMinKillMs, kMaxKillMs)(timing);
  char tmpl[] = "/tmp/spillfs-powercut-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string scratch = tmpl;
  const std::string journal = scratch + "/journal";
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{scratch};

  std::unique_ptr<MountedVolume> volume;
  {
    JournalEnv env(journal);  // inherited by mkfs and the daemon, not by later commands
    volume = std::make_unique<MountedVolume>();
  }
  Writer writer(*volume, seed);
  std::atomic<bool> killed{false};
  std::thread thread([&] { writer.Run(killed); });
  std::this_thread::sleep_for(std::chrono::milliseconds(kill_ms));
  killed = true;
  volume->Kill();
  thread.join();
  totals->ops += writer.ops();
  totals->fsyncs += writer.fsyncs();
  ASSERT_EQ(writer.early_failure(), "") << "an operation failed before the kill";

  // The power cut: every data write since the last fdatasync is lost.
  std::string error;
  Revert revert = ApplyJournal(journal, volume->volume() + "/data.img", &error);
  ASSERT_EQ(error, "");
  totals->records_reverted += revert.records;
  totals->bytes_reverted += revert.bytes;

  FsckResult fsck = RunFsck(volume->volume());
  if (!(fsck.rc == 1 && fsck.kinds == std::set<std::string>{"orphan"})) {
    ASSERT_EQ(fsck.rc, 0) << "fsck after the power cut (killed after " << kill_ms << " ms, op "
                          << writer.ops() << ", last op " << writer.last_op() << ", "
                          << revert.records << " writes undone):\n"
                          << fsck.output.substr(0, 4000);
  }

  ASSERT_TRUE(volume->Mount(&error)) << "mount after the power cut: " << error;
  uint64_t bytes = 0;
  auto durable = writer.durable();
  for (const auto& [path, content] : durable) {
    std::string actual;
    ASSERT_TRUE(ReadWhole(volume->Path(path), &actual))
        << path << " (fsync'd): " << strerror(errno);
    ASSERT_EQ(actual.size(), content.size())
        << path << " (fsync'd, then untouched) has the wrong size";
    ASSERT_TRUE(actual == content)
        << path << " (fsync'd, then untouched) differs after the power cut";
    bytes += content.size();
  }
  // Files not fsync'd since their last change: some bytes or EIO, nothing worse.
  std::vector<std::string> files;
  Walk(*volume, "", &files);
  for (const std::string& path : files) {
    if (durable.count(path)) continue;
    std::string actual;
    if (ReadWhole(volume->Path(path), &actual)) {
      ++totals->unsynced_read;
    } else {
      ASSERT_EQ(errno, EIO) << path << " (not fsync'd): " << strerror(errno);
      ++totals->unsynced_eio;
    }
  }
  struct stat st {};
  ASSERT_EQ(stat(volume->mountpoint().c_str(), &st), 0)
      << "the daemon died reading the damaged files";
  ASSERT_TRUE(volume->Unmount(&error)) << error;

  ++totals->survived;
  totals->files_verified += durable.size();
  totals->bytes_verified += bytes;
  fprintf(stderr,
          "powercut test: seed %" PRIu64 ": killed after %d ms at op %" PRIu64 "; %" PRIu64
          " writes (%" PRIu64 " bytes) undone%s; fsck clean; %zu fsync'd files, %" PRIu64
          " bytes verified\n",
          seed, kill_ms, writer.ops(), revert.records, revert.bytes,
          revert.torn_tail ? " (torn last record)" : "", durable.size(), bytes);
}

TEST(PowercutTest, LosingEveryUnflushedDataWriteKeepsTheVolumeConsistentWithEveryFsyncedByte) {
  const uint64_t iterations = EnvU64("SPILLFS_POWERCUT_ITERATIONS", kDefaultIterations);
  const uint64_t first_seed = EnvU64("SPILLFS_POWERCUT_SEED", 1);
  Totals totals;
  for (uint64_t i = 0; i < iterations; ++i) {
    const uint64_t seed = first_seed + i;
    SCOPED_TRACE("seed " + std::to_string(seed));
    uint64_t before = totals.survived;
    RunIteration(seed, &totals);
    if (totals.survived == before) totals.failed_seeds.push_back(seed);
  }
  std::string failed;
  for (uint64_t seed : totals.failed_seeds) failed += " " + std::to_string(seed);
  fprintf(stderr,
          "powercut test: %" PRIu64 " of %" PRIu64 " power cuts survived; %" PRIu64
          " data writes (%" PRIu64 " bytes) undone; %" PRIu64 " fsync'd files, %" PRIu64
          " bytes verified; unsynced files: %" PRIu64 " read, %" PRIu64 " EIO; %" PRIu64
          " ops, %" PRIu64 " fsyncs; failed seeds:%s\n",
          totals.survived, iterations, totals.records_reverted, totals.bytes_reverted,
          totals.files_verified, totals.bytes_verified, totals.unsynced_read, totals.unsynced_eio,
          totals.ops, totals.fsyncs, failed.empty() ? " none" : failed.c_str());
  RecordProperty("iterations_survived", static_cast<int>(totals.survived));
  RecordProperty("bytes_verified", std::to_string(totals.bytes_verified));
  EXPECT_EQ(totals.survived, iterations);
  // The simulation must have had something to undo, or it tested nothing.
  EXPECT_GT(totals.bytes_reverted, 0u) << "no write was ever undone: is the journal written?";
}

}  // namespace
}  // namespace spillfs::testing
