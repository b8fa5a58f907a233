// The load test: many threads doing overlapping namespace and data operations
// on the same directories of one mount for a bounded time, then a clean
// unmount, `spillfs fsck` exit 0, a remount and a byte-for-byte check of every
// surviving file.
//
// Each thread owns the files it creates (their names carry its number) and
// keeps an exact model of them; directories are shared: four fixed ones
// (s0..s3) and, in each, subdirectories x0..x2 that every thread creates and
// removes at random, so creates and renames race with rmdir (a rename or
// create into a vanished subdirectory is ENOENT; rmdir of a non-empty one is
// ENOTEMPTY; both are expected), and e0..e2, always empty, that threads
// create, remove and rename onto each other. File contents are 8-byte words that name
// (thread, file sequence number, write version, word offset), so a wrong word
// says where it came from. Two kinds of files:
//   w<t>_<n>  mutable: written in pieces, overwritten at random offsets by
//             its owner; only its owner verifies it (exact model).
//   s<t>_<n>  sealed: written once under a hidden temporary name (.t...),
//             then renamed into place; self-describing (a header gives
//             thread, sequence and length), so any thread that finds one
//             in a directory listing verifies it.
// Operations: create, write, overwrite, truncate, read+verify (own files), read of
// any thread's file found by readdir, rename (across directories, onto an
// own file of the same kind), unlink, mkdir, rmdir, readdir+stat; some
// writes end with fsync.
//
// Environment:
//   SPILLFS_STRESS_SECONDS=N  length of the run (default 20)
//   SPILLFS_STRESS_THREADS=N  worker threads (default 12)
//   SPILLFS_STRESS_SEED=S     thread i uses seed S * 1000 + i (default 1)
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "support/env.h"
#include "support/file_io.h"
#include "support/mounted_volume.h"

namespace spillfs::testing {
namespace {

constexpr int kSharedDirs = 4;
constexpr int kSubdirs = 3;
constexpr size_t kMaxOwnFiles = 20;
constexpr size_t kMaxFileBytes = 512 << 10;
constexpr size_t kHeaderBytes = 32;
constexpr char kSealedMagic[8] = {'S', 'P', 'S', 'T', 'R', 'E', 'S', 'S'};

// The word at byte offset `word_offset` (a multiple of 8) of file (thread,
// seq) written at `version`: thread 8 bits, seq 20, version 8, word index 28.
uint64_t Word(uint64_t thread, uint64_t seq, uint64_t version, uint64_t word_offset) {
  return (thread & 0xff) << 56 | (seq & 0xfffff) << 36 | (version & 0xff) << 28 | ((word_offset / 8) & 0xfffffff);
}

// Bytes [offset, offset + length) of the pattern of (thread, seq, version).
std::string Pattern(uint64_t thread, uint64_t seq, uint64_t version, uint64_t offset, size_t length) {
  std::string out(length, '\0');
  for (size_t i = 0; i < length;) {
    uint64_t at = offset + i;
    uint64_t word = Word(thread, seq, version, at & ~uint64_t{7});
    size_t in_word = at & 7;
    size_t n = std::min<size_t>(8 - in_word, length - i);
    std::memcpy(&out[i], reinterpret_cast<const char*>(&word) + in_word, n);
    i += n;
  }
  return out;
}

// Describes the first difference between `actual` and `expected`.
std::string Difference(const std::string& actual, const std::string& expected) {
  if (actual.size() != expected.size()) {
    return "size " + std::to_string(actual.size()) + ", expected " + std::to_string(expected.size());
  }
  for (size_t i = 0; i < actual.size(); ++i) {
    if (actual[i] == expected[i]) continue;
    size_t at = i & ~size_t{7};
    uint64_t word = 0;
    std::memcpy(&word, actual.data() + at, std::min<size_t>(8, actual.size() - at));
    char text[200];
    snprintf(text, sizeof(text),
             "first difference at byte %zu; the word there names thread %" PRIu64 " seq %" PRIu64 " version %" PRIu64
             " offset %" PRIu64,
             i, word >> 56, (word >> 36) & 0xfffff, (word >> 28) & 0xff, (word & 0xfffffff) * 8);
    return text;
  }
  return "";
}

// A sealed file: header (magic, thread, seq, length) then the version-0 pattern.
std::string SealedContent(uint64_t thread, uint64_t seq, size_t length) {
  std::string out = Pattern(thread, seq, 0, 0, length);
  if (length >= kHeaderBytes) {
    std::memcpy(&out[0], kSealedMagic, 8);
    uint64_t fields[3] = {thread, seq, length};
    std::memcpy(&out[8], fields, sizeof(fields));
  }
  return out;
}

// Checks a sealed file from its bytes alone; "" when it is right.
std::string VerifySealed(const std::string& data) {
  if (data.size() < kHeaderBytes || std::memcmp(data.data(), kSealedMagic, 8) != 0) {
    return "no sealed-file header (" + std::to_string(data.size()) + " bytes)";
  }
  uint64_t fields[3];
  std::memcpy(fields, data.data() + 8, sizeof(fields));
  return Difference(data, SealedContent(fields[0], fields[1], fields[2]));
}

enum class ReadResult { kOk, kGone, kError };

ReadResult ReadWhole(const std::string& path, std::string* out, int* error) {
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) {
    *error = errno;
    return errno == ENOENT ? ReadResult::kGone : ReadResult::kError;
  }
  out->clear();
  char buf[64 << 10];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      *error = errno;
      close(fd);
      return ReadResult::kError;
    }
    if (n == 0) break;
    out->append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return ReadResult::kOk;
}

struct Counters {
  std::atomic<uint64_t> ops{0}, creates{0}, writes{0}, truncates{0}, reads{0}, foreign_reads{0}, renames{0}, unlinks{0};
  std::atomic<uint64_t> mkdirs{0}, rmdirs{0}, dir_renames{0}, readdirs{0}, fsyncs{0}, expected_errors{0};
  std::atomic<uint64_t> bytes_written{0}, bytes_verified{0};
};

class Worker {
 public:
  Worker(const MountedVolume& volume, uint64_t thread, uint64_t seed, Counters* counters)
      : volume_(volume), thread_(thread), rng_(seed), counters_(counters) {}

  // Runs until `deadline` or the first unexpected failure.
  void Run(std::chrono::steady_clock::time_point deadline) {
    while (failure_.empty() && std::chrono::steady_clock::now() < deadline) {
      Step();
      counters_->ops.fetch_add(1, std::memory_order_relaxed);
    }
  }

  const std::string& failure() const { return failure_; }
  struct File {
    std::string content;
    bool sealed = false;
  };
  const std::map<std::string, File>& files() const { return files_; }

 private:
  uint64_t Pick(uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng_); }
  size_t Size() {
    switch (Pick(4)) {
      case 0:
        return Pick(4096) + 1;
      case 1:
        return Pick(64 << 10) + 1;
      default:
        return Pick(kMaxFileBytes) + 1;
    }
  }
  std::string Top() { return "s" + std::to_string(Pick(kSharedDirs)); }
  std::string AnyDir() {
    std::string top = Top();
    return Pick(2) == 0 ? top : top + "/x" + std::to_string(Pick(kSubdirs));
  }
  std::string Name(char kind) { return std::string(1, kind) + std::to_string(thread_) + "_" + std::to_string(next_++); }
  std::string Abs(const std::string& rel) { return volume_.Path(rel); }
  void Fail(const std::string& what, int error) {
    failure_ = "thread " + std::to_string(thread_) + ": " + what + ": " + strerror(error);
  }
  void Fail(const std::string& what) { failure_ = "thread " + std::to_string(thread_) + ": " + what; }
  // An own file of the given kind (any kind when `kind` is 0), or "".
  std::string OwnFile(char kind = 0) {
    std::vector<const std::string*> candidates;
    for (const auto& [path, file] : files_) {
      if (kind == 0 || (kind == 's') == file.sealed) candidates.push_back(&path);
    }
    return candidates.empty() ? "" : *candidates[Pick(candidates.size())];
  }

  void Step() {
    uint64_t dice = Pick(100);
    if (files_.size() >= kMaxOwnFiles && dice < 25) return Unlink();
    if (dice < 15) return CreateMutable();
    if (dice < 25) return CreateSealed();
    if (dice < 40) return Overwrite();
    if (dice < 55) return ReadOwn();
    if (dice < 65) return ReadForeign();
    if (dice < 75) return Rename();
    if (dice < 83) return Unlink();
    if (dice < 86) return MakeDir();
    if (dice < 90) return RemoveDir();
    if (dice < 94) return RenameEmptyDir();
    return List();
  }

  void CreateMutable() {
    std::string path = AnyDir() + "/" + Name('w');
    uint64_t seq = next_ - 1;
    int fd = open(Abs(path).c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
    if (fd < 0) {
      if (errno == ENOENT) return Expected();  // the subdirectory was removed
      return Fail("create " + path, errno);
    }
    File& file = files_[path];
    counters_->creates++;
    file.content = Pattern(thread_, seq, 1, 0, Size());
    for (size_t at = 0; at < file.content.size();) {
      size_t piece = std::min(file.content.size() - at, static_cast<size_t>(Pick(128 << 10) + 1));
      if (!WriteAll(fd, file.content.substr(at, piece), at)) {
        close(fd);
        return Fail("write " + path, errno);
      }
      at += piece;
      counters_->writes++;
      counters_->bytes_written += piece;
    }
    seq_[path] = seq;
    version_[path] = 1;
    SyncSometimesAndClose(fd, path, 4, fsync, "fsync ");
  }

  // One time in ODDS syncs FD (of PATH) with SYNC, then closes it; false
  // (with the failure reported) where either fails.
  bool SyncSometimesAndClose(int fd, const std::string& path, uint64_t odds, int (*sync)(int), const char* what) {
    if (Pick(odds) == 0) {
      if (sync(fd) != 0) return close(fd), Fail(what + path, errno), false;
      counters_->fsyncs++;
    }
    if (close(fd) != 0) return Fail("close " + path, errno), false;
    return true;
  }

  void CreateSealed() {
    std::string dir = AnyDir();
    std::string name = Name('s');
    uint64_t seq = next_ - 1;
    std::string tmp = dir + "/.t" + std::to_string(thread_) + "_" + std::to_string(seq);
    int fd = open(Abs(tmp).c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
    if (fd < 0) {
      if (errno == ENOENT) return Expected();
      return Fail("create " + tmp, errno);
    }
    counters_->creates++;
    std::string content = SealedContent(thread_, seq, std::max(Size(), kHeaderBytes));
    files_[tmp] = File{"", true};  // present (empty) from here on
    if (!WriteAll(fd, content, 0)) return close(fd), Fail("write " + tmp, errno);
    files_[tmp].content = content;
    counters_->writes++;
    counters_->bytes_written += content.size();
    if (!SyncSometimesAndClose(fd, tmp, 4, fsync, "fsync ")) return;
    // Published under its final name, often in another shared directory.
    std::string target = (Pick(2) == 0 ? dir : AnyDir()) + "/" + name;
    if (rename(Abs(tmp).c_str(), Abs(target).c_str()) != 0) {
      if (errno == ENOENT) return Expected();  // target directory gone: stays hidden
      return Fail("rename " + tmp + " " + target, errno);
    }
    counters_->renames++;
    files_[target] = std::move(files_[tmp]);
    files_.erase(tmp);
  }

  void Overwrite() {
    std::string path = OwnFile('w');
    if (path.empty()) return CreateMutable();
    File& file = files_[path];
    uint64_t version = ++version_[path];
    size_t offset = Pick(std::min(file.content.size() + (64 << 10), kMaxFileBytes));
    size_t length = std::min(Size(), kMaxFileBytes + (64 << 10) - offset);
    std::string data = Pattern(thread_, seq_[path], version, offset, length);
    int fd = open(Abs(path).c_str(), O_WRONLY);
    if (fd < 0) return Fail("open " + path, errno);
    if (Pick(6) == 0) {  // truncate down (often inside an extent) or up instead
      size_t size = Pick(std::min(file.content.size() + (64 << 10), kMaxFileBytes) + 1);
      if (ftruncate(fd, static_cast<off_t>(size)) != 0) return close(fd), Fail("truncate " + path, errno);
      counters_->truncates++;
      file.content.resize(size, '\0');
      if (close(fd) != 0) Fail("close " + path, errno);
      return;
    }
    if (!WriteAll(fd, data, offset)) return close(fd), Fail("overwrite " + path, errno);
    counters_->writes++;
    counters_->bytes_written += data.size();
    if (file.content.size() < offset + length) file.content.resize(offset + length, '\0');
    file.content.replace(offset, length, data);
    SyncSometimesAndClose(fd, path, 5, fdatasync, "fdatasync ");
  }

  void ReadOwn() {
    std::string path = OwnFile();
    if (path.empty()) return;
    std::string data;
    int error = 0;
    if (ReadWhole(Abs(path), &data, &error) != ReadResult::kOk) return Fail("read " + path, error);
    std::string diff = Difference(data, files_[path].content);
    if (!diff.empty()) return Fail("read " + path + ": " + diff);
    counters_->reads++;
    counters_->bytes_verified += data.size();
  }

  // Reads a file of any thread found in a listing; sealed ones are verified.
  void ReadForeign() {
    std::string dir = AnyDir();
    std::vector<std::string> names;
    if (!Names(dir, &names)) return;
    if (names.empty()) return;
    std::string name = names[Pick(names.size())];
    if (name[0] != 's' && name[0] != 'w') return;
    std::string data;
    int error = 0;
    ReadResult r = ReadWhole(Abs(dir + "/" + name), &data, &error);
    if (r == ReadResult::kGone) return Expected();
    if (r == ReadResult::kError) {
      if (error == EISDIR) return;
      return Fail("read " + dir + "/" + name, error);
    }
    counters_->foreign_reads++;
    if (name[0] == 's') {
      std::string diff = VerifySealed(data);
      if (!diff.empty()) return Fail("sealed " + dir + "/" + name + ": " + diff);
      counters_->bytes_verified += data.size();
    }
  }

  void Rename() {
    std::string from = OwnFile();
    if (from.empty()) return;
    bool sealed = files_[from].sealed;
    if (sealed && from.find("/.t") != std::string::npos) return;  // left hidden by a vanished directory
    std::string to;
    if (Pick(4) == 0) {
      to = OwnFile(sealed ? 's' : 'w');  // replaces one of the same kind
      if (to == from || to.find("/.t") != std::string::npos) return;
    } else {
      to = AnyDir() + "/" + Name(sealed ? 's' : 'w');
    }
    if (rename(Abs(from).c_str(), Abs(to).c_str()) != 0) {
      if (errno == ENOENT) return Expected();
      return Fail("rename " + from + " " + to, errno);
    }
    counters_->renames++;
    File file = std::move(files_[from]);
    files_.erase(from);
    files_[to] = std::move(file);
    seq_[to] = seq_[from];
    version_[to] = version_[from];
    seq_.erase(from);
    version_.erase(from);
  }

  void Unlink() {
    std::string path = OwnFile();
    if (path.empty()) return;
    if (unlink(Abs(path).c_str()) != 0) return Fail("unlink " + path, errno);
    counters_->unlinks++;
    files_.erase(path);
    seq_.erase(path);
    version_.erase(path);
  }

  // A shared subdirectory: x<j> may hold files, e<j> stays empty (so rmdir
  // and rename of directories succeed often).
  std::string SharedSubdir() { return Top() + (Pick(2) == 0 ? "/x" : "/e") + std::to_string(Pick(kSubdirs)); }

  void MakeDir() {
    std::string path = SharedSubdir();
    if (mkdir(Abs(path).c_str(), 0755) != 0) {
      if (errno == EEXIST) return Expected();
      return Fail("mkdir " + path, errno);
    }
    counters_->mkdirs++;
  }

  void RemoveDir() {
    std::string path = SharedSubdir();
    if (rmdir(Abs(path).c_str()) != 0) {
      if (errno == ENOENT || errno == ENOTEMPTY) return Expected();
      return Fail("rmdir " + path, errno);
    }
    counters_->rmdirs++;
  }

  // Renames an empty shared directory, sometimes onto another (replacing it
  // when that one is empty too).
  void RenameEmptyDir() {
    std::string from = Top() + "/e" + std::to_string(Pick(kSubdirs));
    std::string to = Top() + "/e" + std::to_string(Pick(kSubdirs));
    if (from == to) return;
    if (rename(Abs(from).c_str(), Abs(to).c_str()) != 0) {
      if (errno == ENOENT || errno == ENOTEMPTY || errno == EEXIST) return Expected();
      return Fail("rename dir " + from + " " + to, errno);
    }
    counters_->dir_renames++;
  }

  void List() {
    std::string dir = AnyDir();
    std::vector<std::string> names;
    if (!Names(dir, &names)) return;
    for (const std::string& name : names) {
      struct stat st {};
      if (lstat(Abs(dir + "/" + name).c_str(), &st) != 0 && errno != ENOENT) {
        return Fail("stat " + dir + "/" + name, errno);
      }
    }
  }

  // Entries of a shared directory; false (and not a failure) when it is gone.
  bool Names(const std::string& dir, std::vector<std::string>* names) {
    DIR* d = opendir(Abs(dir).c_str());
    if (d == nullptr) {
      if (errno != ENOENT) Fail("opendir " + dir, errno);
      return false;
    }
    errno = 0;
    while (struct dirent* e = readdir(d)) {
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names->push_back(e->d_name);
    }
    int error = errno;
    closedir(d);
    if (error != 0) {
      Fail("readdir " + dir, error);
      return false;
    }
    counters_->readdirs++;
    return true;
  }

  void Expected() { counters_->expected_errors++; }

  const MountedVolume& volume_;
  uint64_t thread_;
  std::mt19937_64 rng_;
  Counters* counters_;
  uint64_t next_ = 0;
  std::map<std::string, File> files_;  // own files by volume path
  std::map<std::string, uint64_t> seq_, version_;
  std::string failure_;
};

// Every regular file under `rel` (volume paths).
void Walk(const MountedVolume& volume, const std::string& rel, std::vector<std::string>* files, int* dirs) {
  DIR* d = opendir(volume.Path(rel).c_str());
  ASSERT_NE(d, nullptr) << rel << ": " << strerror(errno);
  ++*dirs;
  std::vector<std::pair<std::string, bool>> entries;
  while (struct dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == ".." || (rel.empty() && name == ".spillfs")) continue;
    std::string path = rel.empty() ? name : rel + "/" + name;
    struct stat st {};
    ASSERT_EQ(lstat(volume.Path(path).c_str(), &st), 0) << path << ": " << strerror(errno);
    entries.emplace_back(path, S_ISDIR(st.st_mode));
  }
  closedir(d);
  for (const auto& [path, is_dir] : entries) {
    if (is_dir) {
      Walk(volume, path, files, dirs);
    } else {
      files->push_back(path);
    }
  }
}

TEST(StressTest, ManyThreadsOnSharedDirectoriesThenFsckCleanAndEveryFileIntact) {
  const uint64_t seconds = EnvU64("SPILLFS_STRESS_SECONDS", 20);
  const uint64_t threads = EnvU64("SPILLFS_STRESS_THREADS", 12);
  const uint64_t seed = EnvU64("SPILLFS_STRESS_SEED", 1);
  ASSERT_GE(threads, 1u);
  ASSERT_LE(threads, 255u);
  MountedVolume volume;
  for (int i = 0; i < kSharedDirs; ++i) {
    ASSERT_EQ(mkdir(volume.Path("s" + std::to_string(i)).c_str(), 0755), 0) << strerror(errno);
  }

  Counters counters;
  std::vector<std::unique_ptr<Worker>> workers;
  for (uint64_t i = 0; i < threads; ++i)
    workers.push_back(std::make_unique<Worker>(volume, i, seed * 1000 + i, &counters));
  auto start = std::chrono::steady_clock::now();
  auto deadline = start + std::chrono::seconds(seconds);
  std::vector<std::thread> running;
  for (auto& worker : workers) running.emplace_back([&worker, deadline] { worker->Run(deadline); });
  for (std::thread& t : running) t.join();
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (auto& worker : workers) EXPECT_EQ(worker->failure(), "");

  fprintf(stderr,
          "stress test: %" PRIu64 " threads, %.1f s: %" PRIu64 " ops (%" PRIu64 " creates, %" PRIu64 " writes, %" PRIu64
          " truncates, %" PRIu64 " verified reads of own files, %" PRIu64 " reads of others' files, %" PRIu64
          " renames, %" PRIu64 " unlinks, %" PRIu64 " mkdirs, %" PRIu64 " rmdirs, %" PRIu64
          " directory renames, %" PRIu64 " listings, %" PRIu64 " fsyncs, %" PRIu64
          " expected ENOENT/EEXIST/ENOTEMPTY); %" PRIu64 " bytes written, %" PRIu64 " bytes verified while running\n",
          threads, elapsed, counters.ops.load(), counters.creates.load(), counters.writes.load(),
          counters.truncates.load(), counters.reads.load(), counters.foreign_reads.load(), counters.renames.load(),
          counters.unlinks.load(), counters.mkdirs.load(), counters.rmdirs.load(), counters.dir_renames.load(),
          counters.readdirs.load(), counters.fsyncs.load(), counters.expected_errors.load(),
          counters.bytes_written.load(), counters.bytes_verified.load());
  ASSERT_TRUE(volume.mounted()) << "the daemon is gone";

  std::string error;
  ASSERT_TRUE(volume.Unmount(&error)) << error;
  std::string fsck;
  int rc = RunSpillfs("fsck " + volume.volume(), &fsck);
  ASSERT_EQ(rc, 0) << "spillfs fsck after the stress run:\n" << fsck;
  ASSERT_TRUE(volume.Mount(&error)) << error;

  // Every file of every model is there with its bytes, and nothing else is.
  std::map<std::string, const Worker::File*> expected;
  for (auto& worker : workers) {
    for (const auto& [path, file] : worker->files()) expected[path] = &file;
  }
  std::vector<std::string> found;
  int dirs = 0;
  Walk(volume, "", &found, &dirs);
  uint64_t bytes = 0;
  size_t sealed = 0;
  for (const std::string& path : found) EXPECT_TRUE(expected.count(path)) << "unexpected file " << path;
  for (const auto& [path, file] : expected) {
    std::string data;
    int read_error = 0;
    ASSERT_EQ(ReadWhole(volume.Path(path), &data, &read_error), ReadResult::kOk)
        << path << ": " << strerror(read_error);
    std::string diff = Difference(data, file->content);
    ASSERT_EQ(diff, "") << path << " after the remount";
    if (file->sealed) {
      ASSERT_EQ(VerifySealed(data), "") << path;
      ++sealed;
    }
    bytes += data.size();
  }
  fprintf(stderr,
          "stress test: fsck clean; after the remount %zu files (%zu sealed) in %d directories, "
          "%" PRIu64 " bytes verified\n",
          expected.size(), sealed, dirs, bytes);
  RecordProperty("ops", std::to_string(counters.ops.load()));
  RecordProperty("bytes_verified", std::to_string(bytes + counters.bytes_verified.load()));
  ASSERT_TRUE(volume.Unmount(&error)) << error;
}

}  // namespace
}  // namespace spillfs::testing
