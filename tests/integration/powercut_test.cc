// The power-cut simulation: the daemon is killed, and everything it wrote
// that was not durable at that moment is lost, in the data area and in the
// index alike; the volume must come back consistent, with every byte that was
// durable.
//
// The daemon is the test-only spillfs-faulty (testing/), mounted with two
// journals in its environment (testing/include/spillfs/testing/powercut.h):
//  - SPILLFS_POWERCUT_JOURNAL: its data area journals the pre-image of every
//    write and empties the journal at each Flush (fdatasync), so the journal
//    holds the old bytes of exactly the writes that are not durable;
//  - SPILLFS_POWERCUT_INDEX_JOURNAL: RocksDB's files journal their durable
//    lengths (what a Sync covered).
// A seeded writer workload (creates, writes, overwrites at random offsets,
// truncates, renames, unlinks, mkdirs, fsync / fdatasync of files, fsync of
// files written earlier and of directories, and phases without any fsync)
// keeps, for every file name, each state it had since the last fsync. The
// daemon is SIGKILLed while its data area holds a write that is not durable,
// however fast or slow the build (CutWhenUnflushed): after a seeded delay the
// data journal is looked at (the daemon runs on) until it holds a record;
// if it holds none for kNaturalWait, the writer is told to hold writes
// unflushed (only ephemeral files, no fsync: their data, written out under
// RAM-tier pressure, is mapped without a data flush and stays unflushed), so
// one comes within a bounded amount of writing. The journal is read again
// once the daemon is gone, which says exactly whether the cut had a data
// write to undo (a flush may have emptied it between the look and the kill);
// a cut that had none (the look was stale) is tried again with the next
// delay, kMaxCutTries in all, and every seed must have had one. Then the cut: the index directory
// loses what was not synced (powercut::ApplyIndexCut: files truncated to
// their durable length, never-synced files removed; RocksDB's point-in-time
// recovery opens it at a batch no older than the last sync), and the data
// area loses the writes since the last fdatasync (powercut::ApplyDataCut):
// all of them (LosingEvery...), or a seeded random subset of them (a device
// may have written any of its cached writes: RandomSubset...).
//
// Nothing here stops the daemon (SIGSTOP) to look at it. A try that did
// (reverted in efce1ed) hung: the group stop never completed because a
// daemon thread was exiting (a flush batch's spillfs-write thread, which had
// submitted to io_uring) and waited uninterruptibly in io_wq_put_and_exit
// for its io_uring worker thread, which the stop had already stopped
// (docs/reliability.md, "Sanitizers"). Every wait here is bounded: the look
// (kMaxUnflushedWait), the kill (MountedVolume::Kill), the writer (its
// operations fail once the daemon is gone).
//
// A third test keeps the whole index instead (WalWrittenBack...): the kernel
// may write RocksDB's WAL back to the media at any moment, before any sync,
// so every committed batch may survive a cut. Crash order rule 2 (a mapping
// reaches the index only after its data is durable) then means no block may
// read EIO at all: every mapping the index holds names data that was flushed.
//
// What must hold afterwards: `spillfs fsck` finds the volume consistent
// (orphans pending for mount allowed, as in crash_test); it mounts; every name
// is in one of the states it had since the last fsync (present or absent,
// size between their sizes), every 4 KiB block of a file equals that block in
// one of its states, and reads EIO only where some state wrote it after the
// last fsync (that data may be lost; a block that every state had at the last
// fsync must read back). A file untouched since the last fsync therefore reads
// back byte for byte. The daemon must survive the reads and unmount cleanly.
//
// Every fsync or fdatasync of any file, and every fsync of a directory, is a
// point at which everything done before it is durable: spillfs's fsync
// flushes the file's RAM-tier data, the whole data area and the whole index
// WAL (Filesystem::SyncAll; docs/design.md, "Crash order"), and the writer has
// every other file closed (close writes the RAM tier out) when it syncs.
//
// Environment:
//   SPILLFS_POWERCUT_ITERATIONS=N  iterations of each test (default 8)
//   SPILLFS_POWERCUT_SEED=S        first seed (default 1); iteration i uses S + i
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <dirent.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "spillfs/testing/powercut.h"
#include "support/env.h"
#include "support/file_io.h"
#include "support/killable_workload.h"
#include "support/mounted_volume.h"
#include "support/random_bytes.h"
#include "support/run_fsck.h"
#include "support/temp_dir.h"

namespace spillfs::testing {
namespace {

constexpr uint64_t kDefaultIterations = 8;
constexpr uint64_t kMaxFiles = 40;
constexpr int kMinKillMs = 200;
constexpr int kMaxKillMs = 1800;
// After the seeded delay: how often the data journal is looked at, how long
// the workload runs as it is before it is told to hold writes unflushed, and
// how long at most the cut waits for an unflushed write (a workload that
// makes none this long is broken: the cut then lands anyway, and the test
// fails).
constexpr auto kLookInterval = std::chrono::milliseconds(1);
constexpr auto kNaturalWait = std::chrono::milliseconds(200);
constexpr auto kMaxUnflushedWait = std::chrono::seconds(20);
// Cuts per seed at most, until one lands while a data write is unflushed.
constexpr int kMaxCutTries = 3;
constexpr uint64_t kBlock = 4096;  // the volume's block size (mkfs default)
// Files created under this directory (user.spillfs.ephemeral=1, inherited by
// its subdirectories) are never flushed by fsync or close, only when the RAM
// tier is short (it is kept small, kRamTier): their data is mapped without a
// data flush, so the cut finds unflushed writes to undo, and every such file
// must be gone after it.
constexpr const char* kEphemeralDir = "eph";
constexpr const char* kRamTier = "12M";
// Flush batches this small keep several in flight, each mapped only after a
// data sync that covers it (Filesystem::FlushChunks), within the small tier.
constexpr const char* kFlushBatch = "1M";

uint64_t Blocks(uint64_t size) { return (size + kBlock - 1) / kBlock; }

// A file's content and, per 4 KiB block, whether it was written after the
// last fsync (then a power cut may have lost it).
struct FileState {
  std::string content;
  std::vector<bool> fresh;
  bool ephemeral = false;  // created under kEphemeralDir: reclaimed at the mount after the cut

  void Resize(uint64_t size) {
    content.resize(size, '\0');
    fresh.resize(Blocks(size), false);
  }
  void MarkFresh(uint64_t offset, uint64_t length) {
    for (uint64_t b = offset / kBlock; b < Blocks(offset + length) && b < fresh.size(); ++b) {
      fresh[b] = true;
    }
  }
};

// One state a file name had since the last fsync: absent, or a file.
struct Version {
  std::shared_ptr<const FileState> file;  // null: absent
};

// The writer workload and its model of what a power cut may leave.
class Writer : public KillableWorkload {
 public:
  // While `hold_unflushed` is set, the writer touches ephemeral files only
  // and never syncs (CutWhenUnflushed).
  Writer(const MountedVolume& volume, uint64_t seed, const std::atomic<bool>& hold_unflushed)
      : KillableWorkload(volume.mountpoint(), seed), hold_unflushed_(hold_unflushed) {}

  // Every state each name had since the last fsync, oldest first (the
  // effect of the operation cut short by the kill included). A name that is
  // not here was absent throughout.
  const std::map<std::string, std::vector<Version>>& history() const { return history_; }

 private:
  std::string Prepare() override {
    dirs_ = {"", kEphemeralDir};
    ephemeral_dirs_ = {kEphemeralDir};
    if (mkdirat(root_, kEphemeralDir, 0755) != 0 ||
        setxattr(MountPath(kEphemeralDir).c_str(), "user.spillfs.ephemeral", "1", 1, 0) != 0) {
      return std::string("cannot make the ephemeral directory: ") + strerror(errno);
    }
    return "";
  }
  // In a phase without fsync, two picks in three go to files changed since
  // the last fsync (when there are any), so that a kill finds lost writes
  // next to durable files, and the third may unlink, overwrite or truncate a
  // durable one (whose old blocks must survive the cut).
  // In an ephemeral phase, only ephemeral files (Step makes sure there is one).
  std::string RandomFile() {
    std::vector<const std::string*> candidates;
    if (ephemeral_phase_) {
      for (const auto& [path, state] : files_) {
        if (state.ephemeral) candidates.push_back(&path);
      }
    } else if (unsynced_phase_ > 0 && Pick(3) != 0) {
      for (const auto& [path, state] : files_) {
        auto it = history_.find(path);
        if (it == history_.end() || it->second.size() > 1) candidates.push_back(&path);
      }
    }
    if (!candidates.empty()) return *candidates[Pick(candidates.size())];
    auto it = files_.begin();
    std::advance(it, static_cast<long>(Pick(files_.size())));
    return it->first;
  }

  // Records the current state of `path` (after files_ was changed, before the
  // system call that makes the change, so a change cut short by the kill is
  // among the candidates).
  void Note(const std::string& path) {
    auto [it, inserted] = history_.try_emplace(path);
    if (inserted) it->second.push_back(Version{});  // absent at the last fsync
    auto file = files_.find(path);
    it->second.push_back(Version{file == files_.end() ? nullptr : std::make_shared<const FileState>(file->second)});
  }
  // An fsync returned: everything before it is durable.
  void AllDurable() {
    ++fsyncs_;
    history_.clear();
    for (auto& [path, state] : files_) {
      state.fresh.assign(state.fresh.size(), false);
      history_[path].push_back(Version{std::make_shared<const FileState>(state)});
    }
  }
  bool Sync(int fd, const std::string& path) {
    if (unsynced_phase_ > 0) return true;  // data reaches the SSD at close, not durably
    if (!Check((Pick(2) == 0 ? fsync(fd) : fdatasync(fd)) == 0, "fsync " + path)) return false;
    AllDurable();
    return true;
  }
  bool Close(int fd, const std::string& path) {
    return Check(close(fd) == 0, "close " + path);  // close writes the RAM tier out
  }
  // The end of a change made through `fd`: an fsync `percent` times in 100,
  // then the close (only the close of the descriptor after a failed fsync).
  void SyncSometimesAndClose(int fd, const std::string& path, int percent) {
    if (Pick(100) < static_cast<uint64_t>(percent) && !Sync(fd, path)) {
      close(fd);
      return;
    }
    Close(fd, path);
  }

  void Step() override {
    // The cut is due and the data area holds no write that is not durable:
    // an ephemeral phase without fsync until the kill (the countdown below
    // never reaches 0).
    if (hold_unflushed_.load()) {
      unsynced_phase_ = 2;
      ephemeral_phase_ = true;
    }
    // Phases without any fsync (every fsync makes all earlier data writes
    // durable), so that a kill often finds many writes to undo.
    // Half of them touch ephemeral files only: no durable file's flush then
    // flushes the data area, so ephemeral data written under RAM-tier
    // pressure is still unflushed when the kill comes.
    if (unsynced_phase_ > 0) {
      if (--unsynced_phase_ == 0) ephemeral_phase_ = false;
    } else if (Pick(8) == 0) {
      unsynced_phase_ = 5 + Pick(40);
      ephemeral_phase_ = Pick(2) == 0;
    }
    bool no_ephemeral_file =
        std::none_of(files_.begin(), files_.end(), [](const auto& entry) { return entry.second.ephemeral; });
    uint64_t dice = Pick(100);
    if (ephemeral_phase_ && no_ephemeral_file) return Create();
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
    std::string dir = RandomDir();
    while (ephemeral_phase_ && !ephemeral_dirs_.count(dir)) dir = RandomDir();
    std::string path = Join(dir, "f" + std::to_string(next_name_++));
    std::string content = RandomBytes(rng_, WriteSize());
    files_[path] = FileState{};
    files_[path].ephemeral = ephemeral_dirs_.count(dir) > 0;
    Note(path);
    int fd = openat(root_, path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
    if (!Check(fd >= 0, "create " + path)) return;
    for (size_t at = 0; at < content.size();) {
      size_t piece = std::min(content.size() - at, WriteSize());
      FileState& state = files_[path];
      state.Resize(at + piece);
      state.content.replace(at, piece, content, at, piece);
      state.MarkFresh(at, piece);
      Note(path);
      if (!Check(WriteAll(fd, content.data() + at, piece, static_cast<off_t>(at)), "write " + path)) {
        close(fd);
        return;
      }
      at += piece;
    }
    SyncSometimesAndClose(fd, path, 40);
  }

  void Overwrite() {
    std::string path = RandomFile();
    FileState& state = files_[path];
    int fd = openat(root_, path.c_str(), O_WRONLY);
    if (!Check(fd >= 0, "open " + path)) return;
    const uint64_t old_size = state.content.size();
    if (Pick(5) == 0) {  // truncate down (often inside an extent) or up
      size_t size = Pick(3) == 0 ? old_size + Pick(1 << 20) : Pick(old_size + 1);
      state.Resize(size);
      // The block holding the new (shrinking) or old (growing) end may be
      // rewritten to zero its tail.
      uint64_t edge = std::min<uint64_t>(size, old_size);
      if (edge % kBlock != 0) state.MarkFresh(edge, 1);
      Note(path);
      if (!Check(ftruncate(fd, static_cast<off_t>(size)) == 0, "truncate " + path)) {
        close(fd);
        return;
      }
      SyncSometimesAndClose(fd, path, 35);
      return;
    }
    size_t offset = Pick(old_size + (64 << 10));
    std::string data = RandomBytes(rng_, WriteSize());
    if (state.content.size() < offset + data.size()) state.Resize(offset + data.size());
    state.content.replace(offset, data.size(), data);
    state.MarkFresh(offset, data.size());
    if (offset > old_size && old_size % kBlock != 0) state.MarkFresh(old_size, 1);
    Note(path);
    if (!Check(WriteAll(fd, data.data(), data.size(), static_cast<off_t>(offset)), "overwrite " + path)) {
      close(fd);
      return;
    }
    SyncSometimesAndClose(fd, path, 35);
  }

  // fsync of a file whose data was written (by close) some time before.
  void SyncLater() {
    if (unsynced_phase_ > 0) return;
    std::string path = RandomFile();
    int fd = openat(root_, path.c_str(), O_RDONLY);
    if (!Check(fd >= 0, "open " + path)) return;
    if (!Sync(fd, path)) {
      close(fd);
      return;
    }
    Close(fd, path);
  }

  void Rename() {
    std::string from = RandomFile();
    std::string to = Pick(3) == 0 ? RandomFile() : Join(RandomDir(), "r" + std::to_string(next_name_++));
    if (to == from) return;
    files_[to] = std::move(files_[from]);
    files_.erase(from);
    Note(from);
    Note(to);
    Check(renameat(root_, from.c_str(), root_, to.c_str()) == 0, "rename " + from + " " + to);
  }

  void Unlink() {
    std::string path = RandomFile();
    files_.erase(path);
    Note(path);
    Check(unlinkat(root_, path.c_str(), 0) == 0, "unlink " + path);
  }

  void MakeDir() {
    if (dirs_.size() >= 8) return;
    std::string parent = RandomDir();
    std::string path = Join(parent, "d" + std::to_string(next_name_++));
    if (!Check(mkdirat(root_, path.c_str(), 0755) == 0, "mkdir " + path)) return;
    dirs_.push_back(path);
    if (ephemeral_dirs_.count(parent)) ephemeral_dirs_.insert(path);
  }

  void SyncDir() {
    if (unsynced_phase_ > 0) return;
    std::string dir = RandomDir();
    int fd = openat(root_, dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (!Check(fd >= 0, "open dir " + dir)) return;
    bool ok = fsync(fd) == 0;
    close(fd);
    if (Check(ok, "fsync dir " + dir)) AllDurable();
  }

  const std::atomic<bool>& hold_unflushed_;
  std::set<std::string> ephemeral_dirs_;
  std::map<std::string, FileState> files_;  // path -> file now
  std::map<std::string, std::vector<Version>> history_;
  uint64_t next_name_ = 0;
  uint64_t unsynced_phase_ = 0;   // operations left in a phase without fsync
  bool ephemeral_phase_ = false;  // that phase touches ephemeral files only
};

// Every regular file under the mount (volume paths).
void Walk(const MountedVolume& volume, const std::string& rel, std::set<std::string>* files) {
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
      files->insert(path);
    }
  }
}

struct Totals {
  uint64_t cuts = 0;  // every try of every seed
  uint64_t survived = 0;
  uint64_t durable_files = 0;  // untouched since the last fsync: byte for byte
  uint64_t durable_bytes = 0;
  uint64_t changed_files = 0;  // changed since: each block in one of its states
  uint64_t changed_bytes = 0;
  uint64_t eio_blocks = 0;   // blocks of changed files written after the fsync, lost
  uint64_t rolled_back = 0;  // names whose presence or size is not what it was at the kill
  uint64_t data_undone = 0;
  uint64_t data_undone_bytes = 0;
  uint64_t data_survived = 0;
  uint64_t data_survived_bytes = 0;
  uint64_t index_truncated = 0;
  uint64_t index_removed = 0;
  uint64_t index_bytes_dropped = 0;
  uint64_t ops = 0;
  uint64_t fsyncs = 0;
  uint64_t ephemeral_at_kill = 0;     // ephemeral files that existed at the kill (all must be gone)
  uint64_t cuts_while_unflushed = 0;  // cuts whose data journal held a write at the kill
  uint64_t cuts_held = 0;             // cuts for which the writer was told to hold writes unflushed
  uint64_t cut_ms = 0;                // time from the seeded delay to the kill, all cuts
  std::vector<uint64_t> failed_seeds;
  std::string missed;  // seeds whose every try found no data write unflushed, and why
};

// What checking one file found.
struct FileCheck {
  uint64_t size = 0;
  uint64_t bytes = 0;
  uint64_t eio_blocks = 0;
  std::string problem;  // empty: fine
};

// "absent, 12345 bytes (durable), 20000 bytes" for failure messages.
std::string Describe(const std::vector<Version>& versions) {
  std::string out;
  for (const Version& v : versions) {
    if (!out.empty()) out += ", ";
    if (!v.file) {
      out += "absent";
      continue;
    }
    bool fresh = std::find(v.file->fresh.begin(), v.file->fresh.end(), true) != v.file->fresh.end();
    out += std::to_string(v.file->content.size()) + " bytes" + (fresh ? "" : " (durable)");
  }
  return out;
}

// Checks `path` (present after the cut) against the states it had since the
// last fsync.
FileCheck CheckFile(const std::string& mounted_path, const std::vector<Version>& versions) {
  FileCheck check;
  std::vector<const FileState*> states;
  for (const Version& v : versions) {
    if (v.file && !v.file->ephemeral) states.push_back(v.file.get());  // ephemeral: reclaimed
  }
  if (states.empty()) {
    check.problem =
        "exists, but had no state since the last fsync in which it existed (ephemeral files "
        "are reclaimed after a crash)";
    return check;
  }
  int fd = open(mounted_path.c_str(), O_RDONLY);
  if (fd < 0) {
    check.problem = std::string("cannot be opened: ") + strerror(errno);
    return check;
  }
  posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);  // one EIO block must not fail its neighbours
  struct stat st {};
  fstat(fd, &st);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  check.size = size;
  uint64_t min_size = UINT64_MAX, max_size = 0;
  for (const FileState* s : states) {
    min_size = std::min<uint64_t>(min_size, s->content.size());
    max_size = std::max<uint64_t>(max_size, s->content.size());
  }
  if (size < min_size || size > max_size) {
    check.problem = "size " + std::to_string(size) + " is outside its sizes since the last fsync [" +
                    std::to_string(min_size) + ", " + std::to_string(max_size) + "]";
    close(fd);
    return check;
  }
  std::string chunk(1 << 20, '\0');
  for (uint64_t start = 0; start < size && check.problem.empty(); start += chunk.size()) {
    uint64_t length = std::min<uint64_t>(chunk.size(), size - start);
    ssize_t n = pread(fd, chunk.data(), length, static_cast<off_t>(start));
    bool whole = n == static_cast<ssize_t>(length);
    if (n < 0 && errno != EIO) {
      check.problem = "read at " + std::to_string(start) + ": " + strerror(errno);
      break;
    }
    for (uint64_t b = start / kBlock; b < Blocks(start + length); ++b) {
      uint64_t at = b * kBlock;
      uint64_t len = std::min<uint64_t>(kBlock, size - at);
      const char* got = chunk.data() + (at - start);
      bool eio = false;
      if (!whole) {  // some block of the chunk failed: read block by block
        ssize_t m = pread(fd, chunk.data() + (at - start), len, static_cast<off_t>(at));
        if (m < 0 && errno == EIO) {
          eio = true;
        } else if (m != static_cast<ssize_t>(len)) {
          check.problem = "read of block " + std::to_string(b) + " failed: " + (m < 0 ? strerror(errno) : "short");
          break;
        }
      }
      if (eio) {
        bool may_be_lost = false;
        for (const FileState* s : states) may_be_lost |= b < s->fresh.size() && s->fresh[b];
        if (!may_be_lost) {
          check.problem = "block " + std::to_string(b) + " (offset " + std::to_string(at) +
                          ") reads EIO, but it was durable in every state since the last fsync "
                          "(" +
                          std::to_string(states.size()) + " states): data lost";
          break;
        }
        ++check.eio_blocks;
        continue;
      }
      bool matches = false;
      for (const FileState* s : states) {
        std::string want(len, '\0');
        if (at < s->content.size()) {
          s->content.copy(want.data(), std::min<uint64_t>(len, s->content.size() - at), at);
        }
        if (std::memcmp(want.data(), got, len) == 0) {
          matches = true;
          break;
        }
      }
      if (!matches) {
        check.problem = "block " + std::to_string(b) + " (offset " + std::to_string(at) +
                        ") holds bytes of none of its " + std::to_string(states.size()) +
                        " states since the last fsync";
        break;
      }
      check.bytes += len;
    }
  }
  close(fd);
  return check;
}

// Sets both power-cut journals for the children started while it lives.
class JournalEnv {
 public:
  JournalEnv(const std::string& data, const std::string& index) {
    setenv(powercut::kDataJournalEnv, data.c_str(), 1);
    setenv(powercut::kIndexJournalEnv, index.c_str(), 1);
  }
  ~JournalEnv() {
    unsetenv(powercut::kDataJournalEnv);
    unsetenv(powercut::kIndexJournalEnv);
  }
};

// How a cut was timed, and what it found (CutWhenUnflushed).
struct CutMoment {
  int64_t waited_ms = 0;        // after the seeded delay
  int looks = 0;                // at the data journal, before the kill
  bool held = false;            // the writer was told to hold writes unflushed
  bool seen_unflushed = false;  // a look found a whole record
  bool unflushed = false;       // the journal held one once the daemon was gone
  std::string error;            // not empty: the kill did not complete
};

// Kills the daemon after `delay`, at the first look that finds a whole
// record in its data journal (a write that is not durable); after
// kNaturalWait without one, the writer is told to hold writes unflushed
// (`hold`), and after kMaxUnflushedWait, or once the writer has stopped, the
// daemon is killed anyway. The daemon runs on throughout (nothing stops it),
// so a look may be stale by the time of the kill: the journal is read again
// once the daemon has been reaped, and that says whether the cut landed while
// a data write was unflushed.
CutMoment CutWhenUnflushed(MountedVolume& volume, const std::string& journal, std::chrono::milliseconds delay,
                           const std::atomic<bool>& writer_done, std::atomic<bool>& hold, std::atomic<bool>& killed) {
  CutMoment moment;
  std::this_thread::sleep_for(delay);
  const auto start = std::chrono::steady_clock::now();
  while (true) {
    ++moment.looks;
    if (powercut::DataJournalHoldsAWrite(journal)) {
      moment.seen_unflushed = true;
      break;
    }
    const auto waited = std::chrono::steady_clock::now() - start;
    if (writer_done.load() || waited > kMaxUnflushedWait) break;
    if (waited > kNaturalWait && !moment.held) {
      moment.held = true;
      hold = true;
    }
    std::this_thread::sleep_for(kLookInterval);
  }
  killed = true;  // before the kill: the writer's next failure is the kill's
  volume.Kill(&moment.error);
  moment.waited_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
  moment.unflushed = moment.error.empty() && powercut::DataJournalHoldsAWrite(journal);
  return moment;
}

enum class DataLoss { kAll, kRandomSubset };
// What the index keeps: what a sync covered, or every byte RocksDB wrote (the
// kernel wrote the WAL back before its sync).
enum class IndexLoss { kUnsynced, kNothing };

// One cut of `seed` (try `attempt`: each try has its own delay); *moment says
// how it was timed.
void RunIteration(uint64_t seed, int attempt, DataLoss loss, IndexLoss index_loss, Totals* totals, CutMoment* moment) {
  std::mt19937_64 timing(seed * 104729 + static_cast<uint64_t>(attempt));
  const int kill_ms = std::uniform_int_distribution<int>(kMinKillMs, kMaxKillMs)(timing);
  TempDir scratch_dir("spillfs-powercut");
  const std::string scratch = scratch_dir.path();
  const std::string data_journal = scratch + "/journal";
  const std::string index_journal = scratch + "/index-journal";

  std::unique_ptr<MountedVolume> volume;
  {
    JournalEnv env(data_journal, index_journal);  // the first daemon, not the remount after the cut
    MountedVolume::Options options;
    options.daemon_binary = SPILLFS_FAULTY_BINARY;
    options.mount_args = {"--ram-tier", kRamTier, "--flush-batch", kFlushBatch};
    volume = std::make_unique<MountedVolume>(options);
  }
  std::atomic<bool> hold{false};
  Writer writer(*volume, seed, hold);
  std::atomic<bool> killed{false};
  std::atomic<bool> writer_done{false};
  std::thread thread([&] {
    writer.Run(killed);
    writer_done = true;
  });
  *moment = CutWhenUnflushed(*volume, data_journal, std::chrono::milliseconds(kill_ms), writer_done, hold, killed);
  thread.join();
  ++totals->cuts;
  totals->ops += writer.ops();
  totals->fsyncs += writer.fsyncs();
  totals->cuts_while_unflushed += moment->unflushed;
  totals->cuts_held += moment->held;
  totals->cut_ms += static_cast<uint64_t>(moment->waited_ms);
  ASSERT_EQ(moment->error, "") << "the kill";
  ASSERT_EQ(writer.early_failure(), "") << "an operation failed before the kill";

  // The power cut: the index loses what was not synced, the data area the
  // writes since the last fdatasync (all, or a random subset).
  auto index_cut = index_loss == IndexLoss::kUnsynced
                       ? powercut::ApplyIndexCut(index_journal, volume->volume() + "/index")
                       : Result<powercut::IndexCut>(powercut::IndexCut{});
  ASSERT_TRUE(index_cut.ok()) << index_cut.status().ToString();
  totals->index_truncated += index_cut->files_truncated;
  totals->index_removed += index_cut->files_removed;
  totals->index_bytes_dropped += index_cut->bytes_dropped;
  std::string error;
  std::mt19937_64 survive(seed * 7919 + 17);
  auto cut = powercut::ApplyDataCut(
      data_journal, volume->volume() + "/data.img",
      loss == DataLoss::kAll ? std::function<bool()>() : [&survive] { return survive() % 2 == 0; });
  ASSERT_TRUE(cut.ok()) << cut.status().ToString();
  const powercut::DataCut& data_cut = *cut;
  totals->data_undone += data_cut.undone;
  totals->data_undone_bytes += data_cut.undone_bytes;
  totals->data_survived += data_cut.survived;
  totals->data_survived_bytes += data_cut.survived_bytes;
  const std::string where =
      "try " + std::to_string(attempt + 1) + ", killed after " + std::to_string(kill_ms) + " + " +
      std::to_string(moment->waited_ms) + " ms (" + std::to_string(moment->looks) + " looks" +
      (moment->held ? ", writes held unflushed" : "") + ", " +
      (moment->unflushed ? "a data write unflushed" : "no data write unflushed") + ") at op " +
      std::to_string(writer.ops()) + " (" + writer.last_op() + "); " + std::to_string(data_cut.undone) +
      " data writes undone, " + std::to_string(data_cut.survived) +
      " kept; index: " + std::to_string(index_cut->files_truncated) + " files truncated (" +
      std::to_string(index_cut->bytes_dropped) + " bytes), " + std::to_string(index_cut->files_removed) + " removed";

  FsckResult fsck = RunFsck(volume->volume());
  if (!(fsck.rc == 1 && fsck.kinds == std::set<std::string>{"orphan"})) {
    ASSERT_EQ(fsck.rc, 0) << "fsck after the power cut (" << where << "):\n" << fsck.output.substr(0, 4000);
  }

  ASSERT_TRUE(volume->Mount(&error)) << "mount after the power cut (" << where << "): " << error;
  std::set<std::string> present;
  ASSERT_NO_FATAL_FAILURE(Walk(*volume, "", &present));
  const auto& history = writer.history();
  for (const auto& [path, versions] : history) {
    totals->ephemeral_at_kill += versions.back().file && versions.back().file->ephemeral;
  }
  std::set<std::string> names = present;
  for (const auto& [path, versions] : history) names.insert(path);
  std::vector<std::string> problems;
  uint64_t durable_files = 0, durable_bytes = 0, changed_files = 0, changed_bytes = 0, eio = 0;
  uint64_t rolled_back = 0;
  for (const std::string& path : names) {
    auto it = history.find(path);
    const std::vector<Version> absent_only{Version{}};
    const std::vector<Version>& versions = it == history.end() ? absent_only : it->second;
    if (!present.count(path)) {
      bool may_be_absent = false;
      for (const Version& v : versions) may_be_absent |= !v.file || v.file->ephemeral;
      if (!may_be_absent) {
        problems.push_back(path + ": lost (it existed in every state since the last fsync)");
      }
      if (versions.back().file) ++rolled_back;
      continue;
    }
    FileCheck check = CheckFile(volume->Path(path), versions);
    if (check.problem.empty() && index_loss == IndexLoss::kNothing && check.eio_blocks > 0) {
      check.problem = std::to_string(check.eio_blocks) +
                      " blocks read EIO: the index kept a mapping whose data was not flushed before it";
    }
    if (!check.problem.empty()) {
      problems.push_back(path + ": " + check.problem + "; its states: " + Describe(versions));
      continue;
    }
    const FileState* at_kill = versions.back().file.get();
    if (!at_kill || at_kill->content.size() != check.size) ++rolled_back;
    bool durable = versions.size() == 1;  // untouched since the last fsync
    (durable ? durable_files : changed_files) += 1;
    (durable ? durable_bytes : changed_bytes) += check.bytes;
    eio += check.eio_blocks;
  }
  struct stat st {};
  ASSERT_EQ(stat(volume->mountpoint().c_str(), &st), 0)
      << "the daemon died reading the files after the power cut (" << where << ")";
  ASSERT_TRUE(volume->Unmount(&error)) << error;
  std::string listing;
  for (size_t i = 0; i < problems.size() && i < 10; ++i) listing += "\n  " + problems[i];
  ASSERT_TRUE(problems.empty()) << problems.size() << " files are wrong after the power cut (" << where
                                << "):" << listing;

  ++totals->survived;
  totals->durable_files += durable_files;
  totals->durable_bytes += durable_bytes;
  totals->changed_files += changed_files;
  totals->changed_bytes += changed_bytes;
  totals->eio_blocks += eio;
  totals->rolled_back += rolled_back;
  fprintf(stderr,
          "powercut test: seed %" PRIu64 ": %s%s; fsck clean; %" PRIu64 " untouched files (%" PRIu64
          " bytes) exact, %" PRIu64 " changed files (%" PRIu64 " bytes) in a state they had, %" PRIu64
          " lost blocks read EIO, %" PRIu64 " names not as at the kill\n",
          seed, where.c_str(), data_cut.torn_tail ? " (torn last data record)" : "", durable_files, durable_bytes,
          changed_files, changed_bytes, eio, rolled_back);
}

void RunAll(DataLoss loss, IndexLoss index_loss = IndexLoss::kUnsynced) {
  const uint64_t iterations = EnvU64("SPILLFS_POWERCUT_ITERATIONS", kDefaultIterations);
  const uint64_t first_seed = EnvU64("SPILLFS_POWERCUT_SEED", 1);
  Totals totals;
  for (uint64_t i = 0; i < iterations; ++i) {
    const uint64_t seed = first_seed + i;
    SCOPED_TRACE("seed " + std::to_string(seed));
    // A cut that found no data write unflushed still tested what it could,
    // but not what the test is for: the seed is cut again (its next delay).
    std::string misses;
    for (int attempt = 0; attempt < kMaxCutTries; ++attempt) {
      const uint64_t before = totals.survived;
      CutMoment moment;
      RunIteration(seed, attempt, loss, index_loss, &totals, &moment);
      if (totals.survived == before) {
        totals.failed_seeds.push_back(seed);
        break;
      }
      if (moment.unflushed) break;
      misses += std::string(misses.empty() ? "" : "; ") + "try " + std::to_string(attempt + 1) + ": " +
                (moment.seen_unflushed ? "a write seen unflushed was flushed before the kill"
                                       : "none seen in " + std::to_string(moment.waited_ms) + " ms");
      // None seen at all: the workload is broken, and another try would wait as long.
      if (!moment.seen_unflushed || attempt + 1 == kMaxCutTries) {
        totals.missed += "\n  seed " + std::to_string(seed) + ": " + misses;
        break;
      }
    }
  }
  std::string failed;
  for (uint64_t seed : totals.failed_seeds) failed += " " + std::to_string(seed);
  fprintf(stderr,
          "powercut test (%s%s): %" PRIu64 " of %" PRIu64 " power cuts survived (%" PRIu64 " seeds; %" PRIu64
          " cuts while a data write was unflushed, %" PRIu64 " with writes held unflushed, %" PRIu64
          " ms from the seeded delays to the kills); data writes: %" PRIu64 " undone (%" PRIu64 " bytes), %" PRIu64
          " kept (%" PRIu64 " bytes); index: %" PRIu64 " files truncated (%" PRIu64 " bytes), %" PRIu64
          " removed; %" PRIu64 " untouched files (%" PRIu64 " bytes) exact, %" PRIu64 " changed files (%" PRIu64
          " bytes) checked, %" PRIu64 " lost blocks EIO, %" PRIu64 " names not as at the kill; %" PRIu64
          " ephemeral files at the kills; %" PRIu64 " ops, %" PRIu64 " fsyncs; failed seeds:%s\n",
          loss == DataLoss::kAll ? "every unflushed data write lost" : "a random subset lost",
          index_loss == IndexLoss::kNothing ? ", the whole index kept" : "", totals.survived, totals.cuts, iterations,
          totals.cuts_while_unflushed, totals.cuts_held, totals.cut_ms, totals.data_undone, totals.data_undone_bytes,
          totals.data_survived, totals.data_survived_bytes, totals.index_truncated, totals.index_bytes_dropped,
          totals.index_removed, totals.durable_files, totals.durable_bytes, totals.changed_files, totals.changed_bytes,
          totals.eio_blocks, totals.rolled_back, totals.ephemeral_at_kill, totals.ops, totals.fsyncs,
          failed.empty() ? " none" : failed.c_str());
  ::testing::Test::RecordProperty("iterations_survived", static_cast<int>(totals.survived));
  ::testing::Test::RecordProperty("bytes_verified", std::to_string(totals.durable_bytes + totals.changed_bytes));
  EXPECT_EQ(totals.survived, totals.cuts);
  // The simulation must have had something to undo, or it tested nothing:
  // every seed must have been cut while a data write was unflushed.
  EXPECT_EQ(totals.missed, "") << "seeds never cut while a data write was unflushed (the workload must make one "
                               << "within " << kMaxUnflushedWait.count() << " s of the seeded delay; a cut whose "
                               << "write was flushed before the kill is tried again, " << kMaxCutTries
                               << " tries in all)";
  EXPECT_GT(totals.data_undone_bytes, 0u) << "no data write was ever undone: is the journal written?";
  if (index_loss == IndexLoss::kUnsynced) {
    EXPECT_GT(totals.index_bytes_dropped + totals.index_removed, 0u)
        << "the index never lost anything: is its journal written?";
  }
  if (loss == DataLoss::kRandomSubset) {
    EXPECT_GT(totals.data_survived, 0u);
  }
  EXPECT_GT(totals.ephemeral_at_kill, 0u) << "no ephemeral file existed at any kill: the workload did not test them";
}

TEST(PowercutTest, LosingEveryUnflushedWriteKeepsEveryDurableByte) { RunAll(DataLoss::kAll); }

TEST(PowercutTest, LosingARandomSubsetOfUnflushedWritesKeepsEveryDurableByte) { RunAll(DataLoss::kRandomSubset); }

TEST(PowercutTest, WalWrittenBackBeforeItsSyncNeverNamesLostData) { RunAll(DataLoss::kAll, IndexLoss::kNothing); }

}  // namespace
}  // namespace spillfs::testing
