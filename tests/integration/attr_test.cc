// Attributes on a mounted spillfs volume, driven through system calls: chmod,
// chown, truncate, utimensat, the rules for when atime/mtime/ctime change,
// st_blocks, setgid directories, xattrs, fallocate and SEEK_DATA/SEEK_HOLE.
// Every expected value and errno is what ext4 gives for the same calls.
#include <fcntl.h>
#include <linux/falloc.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "support/errno_names.h"
#include "support/eventually.h"
#include "support/file_io.h"
#include "support/mounted_volume.h"
#include "support/random_bytes.h"
#include "support/shared_volume.h"

namespace spillfs::testing {
namespace {

// Reads LEN bytes at OFFSET (fewer at end of file).
std::string ReadAt(int fd, off_t offset, size_t len) {
  std::string out(len, '\0');
  size_t done = 0;
  while (done < len) {
    ssize_t n = pread(fd, out.data() + done, len - done, offset + done);
    if (n < 0) {
      ADD_FAILURE() << "pread: " << ErrnoName(errno);
      break;
    }
    if (n == 0) break;
    done += n;
  }
  out.resize(done);
  return out;
}

// Drops the kernel's cached pages of FD, so that the next reads ask the
// filesystem (the daemon) instead of being served from the page cache.
void DropCache(int fd) {
  ASSERT_EQ(fdatasync(fd), 0) << ErrnoName(errno);
  ASSERT_EQ(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
}

// Opens (creating) PATH read-write into *FD, writes DATA and fsyncs it.
void CreateSynced(const std::string& path, std::string_view data, Fd* fd) {
  fd->Reset(open(path.c_str(), O_CREAT | O_RDWR, 0644));
  ASSERT_TRUE(fd->valid());
  ASSERT_TRUE(WriteAll(fd->get(), data));
  ASSERT_EQ(fsync(fd->get()), 0);
}

struct stat Fstat(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) ADD_FAILURE() << "fstat: " << ErrnoName(errno);
  return st;
}

// ------------------------------------------------------------------ time helpers

int64_t Ns(const timespec& t) { return int64_t{t.tv_sec} * 1000000000 + t.tv_nsec; }

int64_t NowNs(clockid_t clock) {
  timespec t{};
  clock_gettime(clock, &t);
  return Ns(t);
}

int64_t Latest(const struct stat& st) { return std::max({Ns(st.st_atim), Ns(st.st_mtim), Ns(st.st_ctim)}); }

// Waits (spinning on the clock, for at most one timer tick) until the coarse
// real-time clock has passed T, so that a timestamp taken from then on by the
// kernel or the daemon, coarse or fine-grained, is later than T. This is what
// makes "ctime changed" observable without sleeping.
void WaitForClockPast(int64_t t) {
  while (NowNs(CLOCK_REALTIME_COARSE) <= t) sched_yield();
}

// The time window of an operation: a timestamp set "now" by the operation lies
// within [start, end].
struct Window {
  int64_t start = 0;
  int64_t end = 0;
};

// Marks the start of an operation that follows the state in BEFORE.
Window Begin(const struct stat& before) {
  WaitForClockPast(Latest(before));
  return Window{NowNs(CLOCK_REALTIME_COARSE), 0};
}
void End(Window* w) { w->end = NowNs(CLOCK_REALTIME); }

#define EXPECT_TIME_IN(ts, window)                                                       \
  do {                                                                                   \
    EXPECT_GE(Ns(ts), (window).start) << #ts << " was not updated by the operation";     \
    EXPECT_LE(Ns(ts), (window).end) << #ts << " is later than the end of the operation"; \
  } while (0)

#define EXPECT_TIME_EQ(ts, expected_ts) EXPECT_EQ(Ns(ts), Ns(expected_ts)) << #ts << " must not change"

constexpr timespec kOldAtime = {1000000000, 111111111};  // 2001-09-09
constexpr timespec kOldMtime = {1000000100, 222222222};

// Sets a file's atime and mtime to fixed values in 2001.
void SetOldTimes(const std::string& path, int flags = 0) {
  timespec times[2] = {kOldAtime, kOldMtime};
  ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, flags), 0) << path << ": " << ErrnoName(errno);
}

// Sets PATH's atime and mtime to 2001, then runs OP (which makes its own
// checks) within a Window; *BEFORE gets PATH's state from just before OP.
template <typename Op>
Window WithOldTimes(const std::string& path, struct stat* before, Op op) {
  SetOldTimes(path);
  *before = Stat(path);
  Window w = Begin(*before);
  op();
  End(&w);
  return w;
}

std::set<std::string> ListXattrs(const std::string& path) {
  std::set<std::string> names;
  ssize_t size = listxattr(path.c_str(), nullptr, 0);
  if (size < 0) {
    ADD_FAILURE() << "listxattr " << path << ": " << ErrnoName(errno);
    return names;
  }
  std::string buf(size, '\0');
  ssize_t n = listxattr(path.c_str(), buf.data(), buf.size());
  if (n != size) {
    ADD_FAILURE() << "listxattr returned " << n << ", size probe said " << size;
    return names;
  }
  for (size_t pos = 0; pos < buf.size();) {
    size_t end = buf.find('\0', pos);
    if (end == std::string::npos) {
      ADD_FAILURE() << "listxattr list is not NUL-terminated";
      break;
    }
    names.insert(buf.substr(pos, end - pos));
    pos = end + 1;
  }
  return names;
}

std::string GetXattr(const std::string& path, const std::string& name) {
  std::string buf(65536, '\0');
  ssize_t n = getxattr(path.c_str(), name.c_str(), buf.data(), buf.size());
  if (n < 0) {
    ADD_FAILURE() << "getxattr " << path << " " << name << ": " << ErrnoName(errno);
    return "";
  }
  buf.resize(n);
  return buf;
}

constexpr off_t kKiB = 1024;
constexpr off_t kMiB = 1024 * 1024;

class AttrTest : public SharedVolumeTest {};

// ---------------------------------------------------------------------- chmod

TEST_F(AttrTest, ChmodChangesModeAndCtimeOnly) {
  WriteFile(P("f"), "data", 0644);
  struct stat before {};
  Window w = WithOldTimes(P("f"), &before, [&] { EXPECT_ERRNO(0, chmod(P("f").c_str(), 0600)); });
  struct stat after = Stat(P("f"));
  EXPECT_TRUE(S_ISREG(after.st_mode));
  EXPECT_EQ(after.st_mode & 07777, 0600u);
  EXPECT_TIME_IN(after.st_ctim, w);
  EXPECT_TIME_EQ(after.st_mtim, before.st_mtim);
  EXPECT_TIME_EQ(after.st_atim, before.st_atim);
  EXPECT_EQ(after.st_size, 4);

  // Every permission bit, special bits included, is kept for root.
  EXPECT_ERRNO(0, chmod(P("f").c_str(), 07777));
  EXPECT_EQ(Stat(P("f")).st_mode & 07777, 07777u);
  EXPECT_ERRNO(0, chmod(P("f").c_str(), 0));
  EXPECT_EQ(Stat(P("f")).st_mode & 07777, 0u);
  EXPECT_TRUE(S_ISREG(Stat(P("f")).st_mode));

  // fchmod and directories.
  Fd fd(open(P("f").c_str(), O_RDONLY));
  ASSERT_TRUE(fd.valid());
  EXPECT_ERRNO(0, fchmod(fd.get(), 0751));
  EXPECT_EQ(Fstat(fd.get()).st_mode & 07777, 0751u);
  ASSERT_EQ(mkdir(P("d").c_str(), 0755), 0);
  EXPECT_ERRNO(0, chmod(P("d").c_str(), 01700));
  EXPECT_EQ(Stat(P("d")).st_mode & 07777, 01700u);
  EXPECT_TRUE(S_ISDIR(Stat(P("d")).st_mode));
  EXPECT_ERRNO(ENOENT, chmod(P("missing").c_str(), 0644));
}

TEST_F(AttrTest, ChmodThroughSymlinkChangesTarget) {
  WriteFile(P("target"), "", 0644);
  ASSERT_EQ(symlink("target", P("link").c_str()), 0);
  EXPECT_ERRNO(0, chmod(P("link").c_str(), 0600));
  EXPECT_EQ(Stat(P("target")).st_mode & 07777, 0600u);
  EXPECT_EQ(Lstat(P("link")).st_mode & 07777, 0777u);
}

// ---------------------------------------------------------------------- chown

TEST_F(AttrTest, ChownChangesOwnerGroupAndCtime) {
  WriteFile(P("f"), "data", 0644);
  struct stat before {};
  Window w = WithOldTimes(P("f"), &before, [&] { EXPECT_ERRNO(0, chown(P("f").c_str(), 1234, 5678)); });
  struct stat after = Stat(P("f"));
  EXPECT_EQ(after.st_uid, 1234u);
  EXPECT_EQ(after.st_gid, 5678u);
  EXPECT_EQ(after.st_mode & 07777, 0644u);
  EXPECT_TIME_IN(after.st_ctim, w);
  EXPECT_TIME_EQ(after.st_mtim, before.st_mtim);

  // -1 leaves that id alone.
  EXPECT_ERRNO(0, chown(P("f").c_str(), static_cast<uid_t>(-1), 42));
  EXPECT_EQ(Stat(P("f")).st_uid, 1234u);
  EXPECT_EQ(Stat(P("f")).st_gid, 42u);
  EXPECT_ERRNO(0, chown(P("f").c_str(), 7, static_cast<gid_t>(-1)));
  EXPECT_EQ(Stat(P("f")).st_uid, 7u);
  EXPECT_EQ(Stat(P("f")).st_gid, 42u);

  Fd fd(open(P("f").c_str(), O_RDONLY));
  ASSERT_TRUE(fd.valid());
  EXPECT_ERRNO(0, fchown(fd.get(), 0, 0));
  EXPECT_EQ(Fstat(fd.get()).st_uid, 0u);
  EXPECT_EQ(Fstat(fd.get()).st_gid, 0u);
  EXPECT_ERRNO(ENOENT, chown(P("missing").c_str(), 1, 1));
}

TEST_F(AttrTest, ChownClearsSetuidAndGroupExecutableSetgid) {
  // Since Linux 2.2.13 root is treated like other users: chown of a regular
  // file drops S_ISUID, and S_ISGID when group-execute is set.
  WriteFile(P("suid"), "", 0644);
  ASSERT_EQ(chmod(P("suid").c_str(), 06755), 0);
  EXPECT_ERRNO(0, chown(P("suid").c_str(), 1, 1));
  EXPECT_EQ(Stat(P("suid")).st_mode & 07777, 0755u);

  // S_ISGID without group-execute (the mandatory-locking marker) stays.
  WriteFile(P("sgid"), "", 0644);
  ASSERT_EQ(chmod(P("sgid").c_str(), 02644), 0);
  EXPECT_ERRNO(0, chown(P("sgid").c_str(), 1, 1));
  EXPECT_EQ(Stat(P("sgid")).st_mode & 07777, 02644u);

  // Directories keep both bits.
  ASSERT_EQ(mkdir(P("d").c_str(), 0755), 0);
  ASSERT_EQ(chmod(P("d").c_str(), 06755), 0);
  EXPECT_ERRNO(0, chown(P("d").c_str(), 1, 1));
  EXPECT_EQ(Stat(P("d")).st_mode & 07777, 06755u);
}

TEST_F(AttrTest, LchownChangesTheSymlinkNotItsTarget) {
  WriteFile(P("target"), "");
  ASSERT_EQ(symlink("target", P("link").c_str()), 0);
  EXPECT_ERRNO(0, lchown(P("link").c_str(), 11, 22));
  EXPECT_EQ(Lstat(P("link")).st_uid, 11u);
  EXPECT_EQ(Lstat(P("link")).st_gid, 22u);
  EXPECT_EQ(Stat(P("target")).st_uid, 0u);
  EXPECT_ERRNO(0, chown(P("link").c_str(), 33, 44));
  EXPECT_EQ(Stat(P("target")).st_uid, 33u);
  EXPECT_EQ(Lstat(P("link")).st_uid, 11u);
}

// ------------------------------------------------------------------- truncate

TEST_F(AttrTest, TruncateUpMakesASparseZeroTail) {
  WriteFile(P("f"), "head");
  EXPECT_ERRNO(0, truncate(P("f").c_str(), kMiB + 3));
  struct stat st = Stat(P("f"));
  EXPECT_EQ(st.st_size, kMiB + 3);
  std::string data = ReadFile(P("f"));  // (ReadFile drops cached pages first)
  ASSERT_EQ(data.size(), static_cast<size_t>(kMiB + 3));
  EXPECT_EQ(data.substr(0, 4), "head");
  EXPECT_EQ(data.find_first_not_of('\0', 4), std::string::npos) << "the extension reads as zeros";

  // Truncating an empty file up allocates nothing.
  WriteFile(P("empty"), "");
  EXPECT_ERRNO(0, truncate(P("empty").c_str(), 1024 * kMiB));
  EXPECT_EQ(Stat(P("empty")).st_size, 1024 * kMiB);
  EXPECT_EQ(Stat(P("empty")).st_blocks, 0);
}

TEST_F(AttrTest, TruncateDownDiscardsDataForGood) {
  std::string data = RandomBytes(64 * kKiB, 1);
  Fd fd;
  ASSERT_NO_FATAL_FAILURE(CreateSynced(P("f"), data, &fd));

  EXPECT_ERRNO(0, ftruncate(fd.get(), 1000));
  EXPECT_EQ(Fstat(fd.get()).st_size, 1000);
  DropCache(fd.get());
  EXPECT_EQ(ReadAt(fd.get(), 0, 64 * kKiB), data.substr(0, 1000));

  // Growing it again must not bring back the old bytes, not even within the
  // block that held byte 1000.
  EXPECT_ERRNO(0, ftruncate(fd.get(), 64 * kKiB));
  DropCache(fd.get());
  std::string expected = data.substr(0, 1000) + std::string(64 * kKiB - 1000, '\0');
  std::string got = ReadAt(fd.get(), 0, 64 * kKiB);
  EXPECT_TRUE(got == expected) << "stale data after truncate down+up: first differing byte at "
                               << std::mismatch(got.begin(), got.end(), expected.begin()).first - got.begin();

  // Nor does writing past the end after a truncate down.
  EXPECT_ERRNO(0, ftruncate(fd.get(), 1000));
  ASSERT_TRUE(WriteAll(fd.get(), "tail", 20000));
  expected = data.substr(0, 1000) + std::string(19000, '\0') + "tail";
  EXPECT_EQ(Fstat(fd.get()).st_size, 20004);
  DropCache(fd.get());
  EXPECT_TRUE(ReadAt(fd.get(), 0, 64 * kKiB) == expected) << "stale data in the gap";

  EXPECT_ERRNO(0, ftruncate(fd.get(), 0));
  EXPECT_EQ(Fstat(fd.get()).st_size, 0);
  EXPECT_EQ(ReadAt(fd.get(), 0, 100), "");
  // And a later extension of the empty file is all zeros.
  EXPECT_ERRNO(0, ftruncate(fd.get(), 64 * kKiB));
  DropCache(fd.get());
  EXPECT_TRUE(ReadAt(fd.get(), 0, 64 * kKiB) == std::string(64 * kKiB, '\0'))
      << "stale data after truncate to 0 and up";
}

TEST_F(AttrTest, TruncateWithinAnExtentKeepsFreeSpaceHonest) {
  // Truncating into the middle of a large extent, then unlinking, must give
  // back exactly what was used: free space never exceeds the total.
  struct statvfs sv {};
  ASSERT_EQ(statvfs(dir_.c_str(), &sv), 0);
  const uint64_t before = sv.f_bfree;
  {
    Fd fd;
    ASSERT_NO_FATAL_FAILURE(CreateSynced(P("f"), RandomBytes(2 * kMiB, 12), &fd));
    ASSERT_EQ(ftruncate(fd.get(), 5000), 0);
    ASSERT_EQ(ftruncate(fd.get(), 3 * kMiB), 0);
    ASSERT_EQ(ftruncate(fd.get(), 100), 0);
    ASSERT_EQ(fsync(fd.get()), 0);
  }
  ASSERT_EQ(unlink(P("f").c_str()), 0);
  // FUSE sends RELEASE after close() returns: wait (bounded) until the space
  // is back, then check that no more than that came back.
  Eventually([&] { return statvfs(dir_.c_str(), &sv) == 0 && sv.f_bfree + 16 >= before; });
  ASSERT_EQ(statvfs(dir_.c_str(), &sv), 0);
  EXPECT_GE(sv.f_bfree + 16, before) << "the file's space did not come back";
  EXPECT_LE(sv.f_bfree, sv.f_blocks) << "more blocks free than exist: space was freed twice";
  EXPECT_LE(sv.f_bfree, before + 16) << "unlink freed more than the file ever used";
}

TEST_F(AttrTest, TruncateUpdatesMtimeAndCtime) {
  WriteFile(P("f"), RandomBytes(10000, 2));
  struct stat before {};
  Window w = WithOldTimes(P("f"), &before, [&] { EXPECT_ERRNO(0, truncate(P("f").c_str(), 5000)); });
  struct stat after = Stat(P("f"));
  EXPECT_TIME_IN(after.st_mtim, w);
  EXPECT_TIME_IN(after.st_ctim, w);
  EXPECT_TIME_EQ(after.st_atim, before.st_atim);

  // ftruncate up.
  SetOldTimes(P("f"));
  before = Stat(P("f"));
  Fd fd(open(P("f").c_str(), O_WRONLY));
  ASSERT_TRUE(fd.valid());
  w = Begin(before);
  EXPECT_ERRNO(0, ftruncate(fd.get(), 50000));
  End(&w);
  after = Fstat(fd.get());
  EXPECT_TIME_IN(after.st_mtim, w);
  EXPECT_TIME_IN(after.st_ctim, w);

  // O_TRUNC of a non-empty file.
  SetOldTimes(P("f"));
  before = Stat(P("f"));
  w = Begin(before);
  Fd trunc(open(P("f").c_str(), O_WRONLY | O_TRUNC));
  End(&w);
  ASSERT_TRUE(trunc.valid());
  after = Stat(P("f"));
  EXPECT_EQ(after.st_size, 0);
  EXPECT_TIME_IN(after.st_mtim, w);
  EXPECT_TIME_IN(after.st_ctim, w);
}

TEST_F(AttrTest, TruncateErrors) {
  WriteFile(P("f"), "abc");
  ASSERT_EQ(mkdir(P("d").c_str(), 0755), 0);
  EXPECT_ERRNO(EISDIR, truncate(P("d").c_str(), 0));
  EXPECT_ERRNO(EINVAL, truncate(P("f").c_str(), -1));
  EXPECT_ERRNO(ENOENT, truncate(P("missing").c_str(), 0));
  Fd ro(open(P("f").c_str(), O_RDONLY));
  ASSERT_TRUE(ro.valid());
  EXPECT_ERRNO(EINVAL, ftruncate(ro.get(), 0));
  EXPECT_EQ(ReadFile(P("f")), "abc");
}

// ------------------------------------------------------------------ utimensat

TEST_F(AttrTest, UtimensatSetsExactNanosecondTimes) {
  WriteFile(P("f"), "x");
  struct stat before = Stat(P("f"));
  timespec times[2] = {{1234567890, 123456789}, {1500000000, 987654321}};
  Window w = Begin(before);
  EXPECT_ERRNO(0, utimensat(AT_FDCWD, P("f").c_str(), times, 0));
  End(&w);
  struct stat st = Stat(P("f"));
  EXPECT_EQ(st.st_atim.tv_sec, 1234567890);
  EXPECT_EQ(st.st_atim.tv_nsec, 123456789);
  EXPECT_EQ(st.st_mtim.tv_sec, 1500000000);
  EXPECT_EQ(st.st_mtim.tv_nsec, 987654321);
  EXPECT_TIME_IN(st.st_ctim, w);

  // futimens on a descriptor, and a directory.
  Fd fd(open(P("f").c_str(), O_RDONLY));
  ASSERT_TRUE(fd.valid());
  timespec t2[2] = {{10, 1}, {20, 2}};
  EXPECT_ERRNO(0, futimens(fd.get(), t2));
  EXPECT_EQ(Ns(Fstat(fd.get()).st_atim), 10000000001);
  EXPECT_EQ(Ns(Fstat(fd.get()).st_mtim), 20000000002);
  ASSERT_EQ(mkdir(P("d").c_str(), 0755), 0);
  EXPECT_ERRNO(0, utimensat(AT_FDCWD, P("d").c_str(), times, 0));
  EXPECT_EQ(Ns(Stat(P("d")).st_mtim), 1500000000987654321);
}

TEST_F(AttrTest, UtimensatBeforeEpochAndAfter2038) {
  // ext4 (256-byte inodes) stores 1901..2446 with nanoseconds.
  WriteFile(P("f"), "x");
  timespec times[2] = {{-1000000000, 5}, {4102444800, 999999999}};  // 1938 and 2100
  EXPECT_ERRNO(0, utimensat(AT_FDCWD, P("f").c_str(), times, 0));
  struct stat st = Stat(P("f"));
  EXPECT_EQ(st.st_atim.tv_sec, -1000000000);
  EXPECT_EQ(st.st_atim.tv_nsec, 5);
  EXPECT_EQ(st.st_mtim.tv_sec, 4102444800);
  EXPECT_EQ(st.st_mtim.tv_nsec, 999999999);
}

TEST_F(AttrTest, UtimensatNowAndOmit) {
  WriteFile(P("f"), "x");

  // NULL times: both now.
  struct stat before {};
  Window w = WithOldTimes(P("f"), &before, [&] { EXPECT_ERRNO(0, utimensat(AT_FDCWD, P("f").c_str(), nullptr, 0)); });
  struct stat st = Stat(P("f"));
  EXPECT_TIME_IN(st.st_atim, w);
  EXPECT_TIME_IN(st.st_mtim, w);
  EXPECT_TIME_IN(st.st_ctim, w);

  // Omit atime, set mtime.
  SetOldTimes(P("f"));
  timespec omit_atime[2] = {{0, UTIME_OMIT}, {1600000000, 42}};
  EXPECT_ERRNO(0, utimensat(AT_FDCWD, P("f").c_str(), omit_atime, 0));
  st = Stat(P("f"));
  EXPECT_TIME_EQ(st.st_atim, kOldAtime);
  EXPECT_EQ(Ns(st.st_mtim), 1600000000000000042);

  // Now for mtime, omit atime.
  before = Stat(P("f"));
  timespec now_mtime[2] = {{0, UTIME_OMIT}, {0, UTIME_NOW}};
  w = Begin(before);
  EXPECT_ERRNO(0, utimensat(AT_FDCWD, P("f").c_str(), now_mtime, 0));
  End(&w);
  st = Stat(P("f"));
  EXPECT_TIME_EQ(st.st_atim, kOldAtime);
  EXPECT_TIME_IN(st.st_mtim, w);
  EXPECT_TIME_IN(st.st_ctim, w);

  // Now for atime, explicit mtime.
  before = Stat(P("f"));
  timespec now_atime[2] = {{0, UTIME_NOW}, {1700000000, 7}};
  w = Begin(before);
  EXPECT_ERRNO(0, utimensat(AT_FDCWD, P("f").c_str(), now_atime, 0));
  End(&w);
  st = Stat(P("f"));
  EXPECT_TIME_IN(st.st_atim, w);
  EXPECT_EQ(Ns(st.st_mtim), 1700000000000000007);
}

TEST_F(AttrTest, UtimensatNoFollowSetsTheSymlinksTimes) {
  WriteFile(P("target"), "x");
  SetOldTimes(P("target"));
  ASSERT_EQ(symlink("target", P("link").c_str()), 0);
  timespec times[2] = {{1111111111, 1}, {1222222222, 2}};
  EXPECT_ERRNO(0, utimensat(AT_FDCWD, P("link").c_str(), times, AT_SYMLINK_NOFOLLOW));
  struct stat link = Lstat(P("link"));
  EXPECT_EQ(Ns(link.st_atim), 1111111111000000001);
  EXPECT_EQ(Ns(link.st_mtim), 1222222222000000002);
  struct stat target = Stat(P("target"));
  EXPECT_TIME_EQ(target.st_atim, kOldAtime);
  EXPECT_TIME_EQ(target.st_mtim, kOldMtime);
}

// -------------------------------------------------- which operations touch times

TEST_F(AttrTest, NewFileHasEqualTimesAndUpdatesItsParent) {
  SetOldTimes(dir_);
  struct stat parent_before = Stat(dir_);
  Window w = Begin(parent_before);
  Fd fd(open(P("f").c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644));
  End(&w);
  ASSERT_TRUE(fd.valid());
  struct stat st = Fstat(fd.get());
  EXPECT_TIME_IN(st.st_ctim, w);
  EXPECT_TIME_EQ(st.st_mtim, st.st_ctim);
  EXPECT_TIME_EQ(st.st_atim, st.st_ctim);
  struct stat parent = Stat(dir_);
  EXPECT_TIME_IN(parent.st_mtim, w);
  EXPECT_TIME_IN(parent.st_ctim, w);
  EXPECT_TIME_EQ(parent.st_atim, kOldAtime);

  SetOldTimes(dir_);
  parent_before = Stat(dir_);
  w = Begin(parent_before);
  ASSERT_EQ(mkdir(P("d").c_str(), 0755), 0);
  End(&w);
  st = Stat(P("d"));
  EXPECT_TIME_IN(st.st_ctim, w);
  EXPECT_TIME_EQ(st.st_mtim, st.st_ctim);
  EXPECT_TIME_EQ(st.st_atim, st.st_ctim);
  parent = Stat(dir_);
  EXPECT_TIME_IN(parent.st_mtim, w);
  EXPECT_TIME_IN(parent.st_ctim, w);
}

TEST_F(AttrTest, WriteUpdatesMtimeAndCtimeButNotAtime) {
  Fd fd(open(P("f").c_str(), O_CREAT | O_RDWR, 0644));
  ASSERT_TRUE(fd.valid());
  ASSERT_TRUE(WriteAll(fd.get(), "initial"));
  SetOldTimes(P("f"));
  struct stat before = Stat(P("f"));
  Window w = Begin(before);
  ASSERT_TRUE(WriteAll(fd.get(), "more", 7));
  End(&w);
  struct stat after = Fstat(fd.get());
  EXPECT_TIME_IN(after.st_mtim, w);
  EXPECT_TIME_IN(after.st_ctim, w);
  EXPECT_TIME_EQ(after.st_atim, kOldAtime);
  EXPECT_EQ(after.st_size, 11);
  // Through a path as well (a fresh lookup).
  struct stat by_path = Stat(P("f"));
  EXPECT_TIME_EQ(by_path.st_mtim, after.st_mtim);
}

TEST_F(AttrTest, ReadUpdatesAtimeUnlessMountedNoatime) {
  WriteFile(P("f"), "some data");
  SetOldTimes(P("f"));
  struct statvfs sv {};
  ASSERT_EQ(statvfs(dir_.c_str(), &sv), 0);
  struct stat before = Stat(P("f"));
  Window w = Begin(before);
  EXPECT_EQ(ReadFile(P("f")), "some data");
  End(&w);
  struct stat after = Stat(P("f"));
  if (sv.f_flag & ST_NOATIME) {
    EXPECT_TIME_EQ(after.st_atim, before.st_atim);
  } else {
    // relatime (the default) and strictatime both update an atime that is
    // not newer than mtime.
    EXPECT_TIME_IN(after.st_atim, w);
  }
  EXPECT_TIME_EQ(after.st_mtim, before.st_mtim);
  EXPECT_TIME_EQ(after.st_ctim, before.st_ctim) << "reading must not change ctime";
}

TEST_F(AttrTest, RenameUpdatesCtimeOfFileAndBothParents) {
  ASSERT_EQ(mkdir(P("from").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(P("to").c_str(), 0755), 0);
  WriteFile(P("from/f"), "x");
  SetOldTimes(P("from/f"));
  SetOldTimes(P("from"));
  SetOldTimes(P("to"));
  struct stat before = Stat(P("from/f"));
  Window w = Begin(before);
  ASSERT_EQ(rename(P("from/f").c_str(), P("to/g").c_str()), 0);
  End(&w);
  struct stat after = Stat(P("to/g"));
  EXPECT_TIME_IN(after.st_ctim, w);
  EXPECT_TIME_EQ(after.st_mtim, kOldMtime);
  EXPECT_TIME_EQ(after.st_atim, kOldAtime);
  for (const char* d : {"from", "to"}) {
    SCOPED_TRACE(d);
    struct stat parent = Stat(P(d));
    EXPECT_TIME_IN(parent.st_mtim, w);
    EXPECT_TIME_IN(parent.st_ctim, w);
  }
}

TEST_F(AttrTest, LinkAndUnlinkUpdateCtimeOfFileAndMtimeOfParent) {
  WriteFile(P("f"), "x");
  SetOldTimes(P("f"));
  SetOldTimes(dir_);
  struct stat before = Stat(P("f"));
  Window w = Begin(before);
  ASSERT_EQ(link(P("f").c_str(), P("g").c_str()), 0);
  End(&w);
  struct stat after = Stat(P("f"));
  EXPECT_EQ(after.st_nlink, 2u);
  EXPECT_TIME_IN(after.st_ctim, w);
  EXPECT_TIME_EQ(after.st_mtim, kOldMtime);
  struct stat parent = Stat(dir_);
  EXPECT_TIME_IN(parent.st_mtim, w);
  EXPECT_TIME_IN(parent.st_ctim, w);

  SetOldTimes(dir_);
  before = Stat(P("g"));
  w = Begin(before);
  ASSERT_EQ(unlink(P("f").c_str()), 0);
  End(&w);
  after = Stat(P("g"));
  EXPECT_EQ(after.st_nlink, 1u);
  EXPECT_TIME_IN(after.st_ctim, w);
  EXPECT_TIME_EQ(after.st_mtim, kOldMtime);
  parent = Stat(dir_);
  EXPECT_TIME_IN(parent.st_mtim, w);
  EXPECT_TIME_IN(parent.st_ctim, w);
}

TEST_F(AttrTest, SetxattrUpdatesCtimeOnly) {
  WriteFile(P("f"), "x");
  struct stat before {};
  Window w = WithOldTimes(P("f"), &before,
                          [&] { ASSERT_EQ(setxattr(P("f").c_str(), "user.k", "v", 1, 0), 0) << ErrnoName(errno); });
  ASSERT_FALSE(HasFatalFailure());
  struct stat after = Stat(P("f"));
  EXPECT_TIME_IN(after.st_ctim, w);
  EXPECT_TIME_EQ(after.st_mtim, kOldMtime);
  EXPECT_TIME_EQ(after.st_atim, kOldAtime);
}

// ------------------------------------------------------------------- st_blocks

TEST_F(AttrTest, BlocksCountAllocatedSpace) {
  WriteFile(P("empty"), "");
  EXPECT_EQ(Stat(P("empty")).st_blocks, 0);

  // Counted as soon as the data is written (ext4 counts delayed allocations).
  Fd fd(open(P("one").c_str(), O_CREAT | O_WRONLY, 0644));
  ASSERT_TRUE(fd.valid());
  ASSERT_TRUE(WriteAll(fd.get(), "x"));
  struct stat st = Fstat(fd.get());
  EXPECT_GT(st.st_blocks, 0);
  EXPECT_LE(st.st_blocks * 512, 64 * kKiB);

  Fd big(open(P("mib").c_str(), O_CREAT | O_WRONLY, 0644));
  ASSERT_TRUE(big.valid());
  ASSERT_TRUE(WriteAll(big.get(), RandomBytes(kMiB, 3)));
  st = Fstat(big.get());
  EXPECT_GE(st.st_blocks, 2048) << "1 MiB of data is at least 2048 512-byte blocks";
  EXPECT_LE(st.st_blocks, 2048 + 128);
  ASSERT_EQ(fsync(big.get()), 0);
  st = Fstat(big.get());
  EXPECT_GE(st.st_blocks, 2048);
  EXPECT_LE(st.st_blocks, 2048 + 128);

  // A sparse file counts only its data.
  Fd sparse(open(P("sparse").c_str(), O_CREAT | O_WRONLY, 0644));
  ASSERT_TRUE(sparse.valid());
  ASSERT_TRUE(WriteAll(sparse.get(), RandomBytes(4 * kKiB, 4), 512 * kMiB));
  ASSERT_EQ(fsync(sparse.get()), 0);
  st = Fstat(sparse.get());
  EXPECT_EQ(st.st_size, 512 * kMiB + 4 * kKiB);
  EXPECT_GT(st.st_blocks, 0);
  EXPECT_LE(st.st_blocks * 512, 128 * kKiB);
}

// ------------------------------------------------------------- setgid directory

TEST_F(AttrTest, SetgidDirectoryPassesOnItsGroup) {
  ASSERT_EQ(mkdir(P("sgid").c_str(), 0755), 0);
  ASSERT_EQ(chown(P("sgid").c_str(), 0, 4321), 0);
  ASSERT_EQ(chmod(P("sgid").c_str(), 02775), 0);

  WriteFile(P("sgid/file"), "x", 0644);
  struct stat st = Stat(P("sgid/file"));
  EXPECT_EQ(st.st_gid, 4321u) << "files take the directory's group";
  EXPECT_EQ(st.st_uid, 0u);
  EXPECT_EQ(st.st_mode & 07777, 0644u);

  ASSERT_EQ(mkdir(P("sgid/sub").c_str(), 0755), 0);
  st = Stat(P("sgid/sub"));
  EXPECT_EQ(st.st_gid, 4321u) << "subdirectories take the directory's group";
  EXPECT_EQ(st.st_mode & 07777, 02755u) << "and inherit S_ISGID";
  WriteFile(P("sgid/sub/deeper"), "x", 0600);
  EXPECT_EQ(Stat(P("sgid/sub/deeper")).st_gid, 4321u);

  ASSERT_EQ(symlink("file", P("sgid/link").c_str()), 0);
  EXPECT_EQ(Lstat(P("sgid/link")).st_gid, 4321u);
  ASSERT_EQ(mknod(P("sgid/fifo").c_str(), S_IFIFO | 0644, 0), 0);
  EXPECT_EQ(Lstat(P("sgid/fifo")).st_gid, 4321u);

  // Without S_ISGID the creator's group is used.
  ASSERT_EQ(mkdir(P("plain").c_str(), 0755), 0);
  ASSERT_EQ(chown(P("plain").c_str(), 0, 4321), 0);
  WriteFile(P("plain/file"), "x");
  EXPECT_EQ(Stat(P("plain/file")).st_gid, 0u);
  ASSERT_EQ(mkdir(P("plain/sub").c_str(), 0755), 0);
  EXPECT_EQ(Stat(P("plain/sub")).st_gid, 0u);
  EXPECT_EQ(Stat(P("plain/sub")).st_mode & 07777, 0755u);
}

// ---------------------------------------------------------------------- xattrs

TEST_F(AttrTest, XattrSetGetListRemove) {
  WriteFile(P("f"), "x");
  const std::string f = P("f");
  EXPECT_EQ(ListXattrs(f), std::set<std::string>{});
  EXPECT_ERRNO(0, setxattr(f.c_str(), "user.alpha", "hello", 5, 0));
  std::string binary("\0\1\2\xff\0tail", 9);
  EXPECT_ERRNO(0, setxattr(f.c_str(), "user.binary", binary.data(), binary.size(), 0));
  EXPECT_ERRNO(0, setxattr(f.c_str(), "user.empty", "", 0, 0));
  std::string big = RandomBytes(2000, 5);
  EXPECT_ERRNO(0, setxattr(f.c_str(), "user.big", big.data(), big.size(), 0));
  EXPECT_ERRNO(0, setxattr(f.c_str(), "trusted.root_only", "t", 1, 0));

  EXPECT_EQ(GetXattr(f, "user.alpha"), "hello");
  EXPECT_EQ(GetXattr(f, "user.binary"), binary);
  EXPECT_EQ(GetXattr(f, "user.empty"), "");
  EXPECT_EQ(GetXattr(f, "user.big"), big);
  EXPECT_EQ(GetXattr(f, "trusted.root_only"), "t");
  EXPECT_EQ(ListXattrs(f),
            (std::set<std::string>{"user.alpha", "user.binary", "user.empty", "user.big", "trusted.root_only"}));

  // Overwrite without flags.
  EXPECT_ERRNO(0, setxattr(f.c_str(), "user.alpha", "bye", 3, 0));
  EXPECT_EQ(GetXattr(f, "user.alpha"), "bye");

  EXPECT_ERRNO(0, removexattr(f.c_str(), "user.alpha"));
  EXPECT_ERRNO(0, removexattr(f.c_str(), "trusted.root_only"));
  char buf[16];
  EXPECT_ERRNO(ENODATA, getxattr(f.c_str(), "user.alpha", buf, sizeof buf));
  EXPECT_EQ(ListXattrs(f), (std::set<std::string>{"user.binary", "user.empty", "user.big"}));

  // Descriptor variants.
  Fd fd(open(f.c_str(), O_RDONLY));
  ASSERT_TRUE(fd.valid());
  EXPECT_ERRNO(0, fsetxattr(fd.get(), "user.fd", "via fd", 6, 0));
  char value[16] = {};
  EXPECT_EQ(fgetxattr(fd.get(), "user.fd", value, sizeof value), 6);
  EXPECT_STREQ(value, "via fd");
  EXPECT_EQ(GetXattr(f, "user.fd"), "via fd");
  EXPECT_ERRNO(0, fremovexattr(fd.get(), "user.fd"));
  EXPECT_EQ(ListXattrs(f), (std::set<std::string>{"user.binary", "user.empty", "user.big"}));
}

TEST_F(AttrTest, XattrCreateReplaceAndMissing) {
  WriteFile(P("f"), "x");
  std::string path = P("f");
  const char* f = path.c_str();
  char buf[64];
  EXPECT_ERRNO(ENODATA, getxattr(f, "user.missing", buf, sizeof buf));
  EXPECT_ERRNO(ENODATA, getxattr(f, "user.missing", nullptr, 0));
  EXPECT_ERRNO(ENODATA, removexattr(f, "user.missing"));
  EXPECT_ERRNO(ENODATA, setxattr(f, "user.k", "v", 1, XATTR_REPLACE));
  EXPECT_EQ(ListXattrs(path), std::set<std::string>{});

  EXPECT_ERRNO(0, setxattr(f, "user.k", "first", 5, XATTR_CREATE));
  EXPECT_ERRNO(EEXIST, setxattr(f, "user.k", "second", 6, XATTR_CREATE));
  EXPECT_EQ(GetXattr(path, "user.k"), "first");
  EXPECT_ERRNO(0, setxattr(f, "user.k", "third", 5, XATTR_REPLACE));
  EXPECT_EQ(GetXattr(path, "user.k"), "third");
}

TEST_F(AttrTest, XattrSizeProbeAndERANGE) {
  WriteFile(P("f"), "x");
  std::string path = P("f");
  const char* f = path.c_str();
  ASSERT_EQ(setxattr(f, "user.k", "0123456789", 10, 0), 0) << ErrnoName(errno);
  ASSERT_EQ(setxattr(f, "user.second", "v", 1, 0), 0);
  EXPECT_EQ(getxattr(f, "user.k", nullptr, 0), 10) << "a zero-size buffer asks for the size";
  char buf[64];
  EXPECT_ERRNO(ERANGE, getxattr(f, "user.k", buf, 9));
  EXPECT_EQ(getxattr(f, "user.k", buf, 10), 10);
  EXPECT_EQ(std::string(buf, 10), "0123456789");

  const ssize_t list_size = sizeof("user.k") + sizeof("user.second");
  EXPECT_EQ(listxattr(f, nullptr, 0), list_size);
  EXPECT_ERRNO(ERANGE, listxattr(f, buf, list_size - 1));
  EXPECT_EQ(listxattr(f, buf, sizeof buf), list_size);
}

TEST_F(AttrTest, XattrsOnDirectoriesAndAcrossLinksAndRename) {
  ASSERT_EQ(mkdir(P("d").c_str(), 0755), 0);
  EXPECT_ERRNO(0, setxattr(P("d").c_str(), "user.dir", "dv", 2, 0));
  EXPECT_EQ(GetXattr(P("d"), "user.dir"), "dv");
  WriteFile(P("f"), "x");
  ASSERT_EQ(setxattr(P("f").c_str(), "user.k", "v", 1, 0), 0);
  ASSERT_EQ(link(P("f").c_str(), P("g").c_str()), 0);
  EXPECT_EQ(GetXattr(P("g"), "user.k"), "v") << "xattrs belong to the inode";
  ASSERT_EQ(rename(P("g").c_str(), P("d/h").c_str()), 0);
  EXPECT_EQ(GetXattr(P("d/h"), "user.k"), "v");
  ASSERT_EQ(rename(P("d").c_str(), P("e").c_str()), 0);
  EXPECT_EQ(GetXattr(P("e"), "user.dir"), "dv");
  char buf[8];
  EXPECT_ERRNO(ENOENT, getxattr(P("missing").c_str(), "user.k", buf, sizeof buf));
}

TEST_F(AttrTest, XattrNameWithoutKnownNamespaceIsNotSupported) {
  WriteFile(P("f"), "x");
  std::string path = P("f");
  EXPECT_ERRNO(EOPNOTSUPP, setxattr(path.c_str(), "nonamespace", "v", 1, 0));
  EXPECT_ERRNO(EOPNOTSUPP, setxattr(path.c_str(), "bogus.name", "v", 1, 0));
  char buf[8];
  EXPECT_ERRNO(EOPNOTSUPP, getxattr(path.c_str(), "bogus.name", buf, sizeof buf));
  EXPECT_EQ(ListXattrs(path), std::set<std::string>{});
}

// ------------------------------------------------------------------- fallocate

TEST_F(AttrTest, FallocateDefaultModeExtendsWithZeros) {
  Fd fd(open(P("f").c_str(), O_CREAT | O_RDWR, 0644));
  ASSERT_TRUE(fd.valid());
  EXPECT_ERRNO(0, fallocate(fd.get(), 0, 0, kMiB));
  DropCache(fd.get());
  struct stat st = Fstat(fd.get());
  EXPECT_EQ(st.st_size, kMiB);
  EXPECT_GE(st.st_blocks, 2048) << "fallocated space is allocated";
  EXPECT_TRUE(ReadAt(fd.get(), 0, kMiB + 1) == std::string(kMiB, '\0'));

  // Over existing data: the data stays, the size grows.
  std::string data = RandomBytes(8 * kKiB, 6);
  Fd g(open(P("g").c_str(), O_CREAT | O_RDWR, 0644));
  ASSERT_TRUE(g.valid());
  ASSERT_TRUE(WriteAll(g.get(), data));
  EXPECT_ERRNO(0, fallocate(g.get(), 0, 4 * kKiB, 60 * kKiB));
  DropCache(g.get());
  EXPECT_EQ(Fstat(g.get()).st_size, 64 * kKiB);
  EXPECT_TRUE(ReadAt(g.get(), 0, 128 * kKiB) == data + std::string(56 * kKiB, '\0'));

  // Inside the file it changes nothing visible.
  EXPECT_ERRNO(0, fallocate(g.get(), 0, 0, 16 * kKiB));
  EXPECT_EQ(Fstat(g.get()).st_size, 64 * kKiB);
  EXPECT_TRUE(ReadAt(g.get(), 0, 8 * kKiB) == data);
}

TEST_F(AttrTest, FallocateKeepSizeAllocatesBeyondEof) {
  Fd fd(open(P("f").c_str(), O_CREAT | O_RDWR, 0644));
  ASSERT_TRUE(fd.valid());
  ASSERT_TRUE(WriteAll(fd.get(), "abc"));
  EXPECT_ERRNO(0, fallocate(fd.get(), FALLOC_FL_KEEP_SIZE, 0, kMiB));
  struct stat st = Fstat(fd.get());
  EXPECT_EQ(st.st_size, 3);
  EXPECT_GE(st.st_blocks, 2048);
  EXPECT_EQ(ReadAt(fd.get(), 0, 100), "abc");
  // Extending over the preallocated range reads zeros, not old disk contents.
  ASSERT_EQ(ftruncate(fd.get(), kMiB), 0);
  DropCache(fd.get());
  EXPECT_TRUE(ReadAt(fd.get(), 0, kMiB) == "abc" + std::string(kMiB - 3, '\0'));
}

TEST_F(AttrTest, FallocatePunchHoleReadsZeros) {
  std::string data = RandomBytes(256 * kKiB, 7);
  Fd fd;
  ASSERT_NO_FATAL_FAILURE(CreateSynced(P("f"), data, &fd));
  blkcnt_t blocks_before = Fstat(fd.get()).st_blocks;

  // Aligned: the range is deallocated.
  EXPECT_ERRNO(0, fallocate(fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 64 * kKiB, 64 * kKiB));
  std::string expected = data;
  expected.replace(64 * kKiB, 64 * kKiB, std::string(64 * kKiB, '\0'));
  DropCache(fd.get());
  struct stat st = Fstat(fd.get());
  EXPECT_EQ(st.st_size, 256 * kKiB);
  EXPECT_TRUE(ReadAt(fd.get(), 0, 512 * kKiB) == expected) << "aligned punch";
  EXPECT_LE(st.st_blocks, blocks_before - 128) << "punching 64 KiB frees 128 blocks";

  // Unaligned: exactly the bytes in the range become zero.
  EXPECT_ERRNO(0, fallocate(fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 1000, 4000));
  expected.replace(1000, 4000, std::string(4000, '\0'));
  DropCache(fd.get());
  EXPECT_TRUE(ReadAt(fd.get(), 0, 512 * kKiB) == expected) << "unaligned punch";

  // Past the end: nothing changes, the size stays.
  EXPECT_ERRNO(0, fallocate(fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 200 * kKiB, kMiB));
  expected.replace(200 * kKiB, 56 * kKiB, std::string(56 * kKiB, '\0'));
  DropCache(fd.get());
  EXPECT_EQ(Fstat(fd.get()).st_size, 256 * kKiB);
  EXPECT_TRUE(ReadAt(fd.get(), 0, 512 * kKiB) == expected) << "punch across EOF";

  // A punch must keep the size.
  EXPECT_ERRNO(EOPNOTSUPP, fallocate(fd.get(), FALLOC_FL_PUNCH_HOLE, 0, 4 * kKiB));

  // After a flush the holes are still zeros.
  ASSERT_EQ(fsync(fd.get()), 0);
  Fd again(open(P("f").c_str(), O_RDONLY));
  ASSERT_TRUE(again.valid());
  DropCache(again.get());
  EXPECT_TRUE(ReadAt(again.get(), 0, 512 * kKiB) == expected) << "after fsync";
}

// --------------------------------------------------------- SEEK_DATA/SEEK_HOLE

// Expects lseek(FD, OFFSET, WHENCE) to return EXPECTED, or to fail with ENXIO
// when EXPECTED is -1.
void ExpectSeek(int fd, off_t offset, int whence, off_t expected) {
  errno = 0;
  off_t got = lseek(fd, offset, whence);
  const char* name = whence == SEEK_DATA ? "SEEK_DATA" : "SEEK_HOLE";
  if (expected < 0) {
    EXPECT_EQ(got, -1) << name << " from " << offset << " should fail";
    EXPECT_EQ(errno, ENXIO) << name << " from " << offset << ": " << ErrnoName(errno);
  } else {
    EXPECT_EQ(got, expected) << name << " from " << offset << " (" << ErrnoName(errno) << ")";
  }
}

// Data at [0, 64K) and [1M, 1M+64K), holes elsewhere, size 2M.
void CheckSparseLayout(int fd) {
  ExpectSeek(fd, 0, SEEK_DATA, 0);
  ExpectSeek(fd, 100, SEEK_DATA, 100);
  ExpectSeek(fd, 0, SEEK_HOLE, 64 * kKiB);
  ExpectSeek(fd, 64 * kKiB - 1, SEEK_HOLE, 64 * kKiB);
  ExpectSeek(fd, 64 * kKiB, SEEK_HOLE, 64 * kKiB);
  ExpectSeek(fd, 64 * kKiB, SEEK_DATA, kMiB);
  ExpectSeek(fd, 100 * kKiB, SEEK_DATA, kMiB);
  ExpectSeek(fd, 100 * kKiB, SEEK_HOLE, 100 * kKiB);
  ExpectSeek(fd, kMiB, SEEK_DATA, kMiB);
  ExpectSeek(fd, kMiB, SEEK_HOLE, kMiB + 64 * kKiB);
  ExpectSeek(fd, kMiB + 100, SEEK_HOLE, kMiB + 64 * kKiB);
  ExpectSeek(fd, kMiB + 64 * kKiB, SEEK_DATA, -1);  // only the tail hole is left
  ExpectSeek(fd, kMiB + kMiB / 2, SEEK_HOLE, kMiB + kMiB / 2);
  ExpectSeek(fd, 2 * kMiB - 1, SEEK_HOLE, 2 * kMiB - 1);
  // At and past EOF: ENXIO.
  ExpectSeek(fd, 2 * kMiB, SEEK_DATA, -1);
  ExpectSeek(fd, 2 * kMiB, SEEK_HOLE, -1);
  ExpectSeek(fd, 3 * kMiB, SEEK_DATA, -1);
  ExpectSeek(fd, 3 * kMiB, SEEK_HOLE, -1);
}

TEST_F(AttrTest, SeekDataAndHoleInASparseFile) {
  std::string a = RandomBytes(64 * kKiB, 8);
  std::string b = RandomBytes(64 * kKiB, 9);
  Fd fd(open(P("sparse").c_str(), O_CREAT | O_RDWR, 0644));
  ASSERT_TRUE(fd.valid());
  ASSERT_TRUE(WriteAll(fd.get(), a, 0));
  ASSERT_TRUE(WriteAll(fd.get(), b, kMiB));
  ASSERT_EQ(ftruncate(fd.get(), 2 * kMiB), 0);

  {
    SCOPED_TRACE("before fsync");
    CheckSparseLayout(fd.get());
  }
  ASSERT_EQ(fsync(fd.get()), 0);
  {
    SCOPED_TRACE("after fsync");
    CheckSparseLayout(fd.get());
  }
  ASSERT_EQ(fd.Close(), 0);
  Fd again(open(P("sparse").c_str(), O_RDONLY));
  ASSERT_TRUE(again.valid());
  DropCache(again.get());
  {
    SCOPED_TRACE("reopened");
    CheckSparseLayout(again.get());
  }
  // Holes read as zeros, data as written.
  std::string expected = a + std::string(kMiB - 64 * kKiB, '\0') + b + std::string(kMiB - 64 * kKiB, '\0');
  EXPECT_TRUE(ReadAt(again.get(), 0, 3 * kMiB) == expected);
}

TEST_F(AttrTest, SeekDataAndHoleEdgeCases) {
  // Empty file: no data, and offset 0 is already EOF.
  Fd empty(open(P("empty").c_str(), O_CREAT | O_RDWR, 0644));
  ASSERT_TRUE(empty.valid());
  ExpectSeek(empty.get(), 0, SEEK_DATA, -1);
  ExpectSeek(empty.get(), 0, SEEK_HOLE, -1);

  // All hole.
  Fd hole(open(P("hole").c_str(), O_CREAT | O_RDWR, 0644));
  ASSERT_TRUE(hole.valid());
  ASSERT_EQ(ftruncate(hole.get(), kMiB), 0);
  ExpectSeek(hole.get(), 0, SEEK_DATA, -1);
  ExpectSeek(hole.get(), 0, SEEK_HOLE, 0);
  ExpectSeek(hole.get(), 4096, SEEK_HOLE, 4096);

  // Leading hole, data up to EOF: the only hole is the virtual one at EOF.
  Fd tail(open(P("tail").c_str(), O_CREAT | O_RDWR, 0644));
  ASSERT_TRUE(tail.valid());
  ASSERT_TRUE(WriteAll(tail.get(), RandomBytes(4 * kKiB, 10), kMiB));
  ExpectSeek(tail.get(), 0, SEEK_DATA, kMiB);
  ExpectSeek(tail.get(), 0, SEEK_HOLE, 0);
  ExpectSeek(tail.get(), kMiB, SEEK_HOLE, kMiB + 4 * kKiB);
  ExpectSeek(tail.get(), kMiB + 4 * kKiB, SEEK_DATA, -1);

  // A dense file: data everywhere, hole at EOF.
  Fd dense(open(P("dense").c_str(), O_CREAT | O_RDWR, 0644));
  ASSERT_TRUE(dense.valid());
  ASSERT_TRUE(WriteAll(dense.get(), RandomBytes(100000, 11)));
  ExpectSeek(dense.get(), 0, SEEK_DATA, 0);
  ExpectSeek(dense.get(), 0, SEEK_HOLE, 100000);
  ExpectSeek(dense.get(), 99999, SEEK_DATA, 99999);
  ExpectSeek(dense.get(), 100000, SEEK_DATA, -1);

  // A punched hole in the middle is found.
  ASSERT_EQ(fsync(dense.get()), 0);
  ASSERT_EQ(fallocate(dense.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 32 * kKiB, 32 * kKiB), 0)
      << ErrnoName(errno);
  ExpectSeek(dense.get(), 0, SEEK_HOLE, 32 * kKiB);
  ExpectSeek(dense.get(), 32 * kKiB, SEEK_DATA, 64 * kKiB);
}

}  // namespace
}  // namespace spillfs::testing
