// Data-path integration tests against a real spillfs mount: file contents of
// many sizes written and read with many chunk sizes (before and after a
// remount), sparse files, O_APPEND, O_TRUNC, O_DIRECT, mmap, concurrent
// readers and writers, and ENOSPC on a small volume.
//
// Expected behaviour is that of ext4; where it matters, the comment on a test
// says what ext4 (the local /tmp file system) was seen to do.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/eventually.h"
#include "support/file_io.h"
#include "support/mounted_volume.h"

namespace spillfs::testing {
namespace {

using ::testing::AssertionFailure;
using ::testing::AssertionResult;
using ::testing::AssertionSuccess;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * 1024;
constexpr uint64_t kGiB = 1024 * kMiB;

std::string ErrnoText(int e) { return std::to_string(e) + " (" + strerror(e) + ")"; }
std::string Errno() { return "errno " + ErrnoText(errno); }

// Deterministic contents: byte `off` of the stream identified by `seed`.
inline uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void Pattern(uint64_t seed, uint64_t off, char* out, size_t len) {
  uint64_t key = Mix(seed);
  size_t i = 0;
  while (i < len) {
    uint64_t word = Mix(key ^ ((off + i) >> 3));
    for (size_t b = (off + i) & 7; b < 8 && i < len; ++b, ++i) {
      out[i] = static_cast<char>(word >> (8 * b));
    }
  }
}

std::vector<char> PatternVector(uint64_t seed, uint64_t off, size_t len) {
  std::vector<char> v(len);
  Pattern(seed, off, v.data(), len);
  return v;
}

// Compares `n` bytes at file offset `off` with `expected`; names the first difference.
AssertionResult SameBytes(const std::string& what, uint64_t off, const char* actual, const char* expected, size_t n) {
  if (memcmp(actual, expected, n) == 0) return AssertionSuccess();
  size_t first = 0;
  while (actual[first] == expected[first]) ++first;
  size_t bad = 0, zeros = 0;
  for (size_t i = first; i < n; ++i) {
    if (actual[i] != expected[i]) {
      ++bad;
      if (actual[i] == 0) ++zeros;
    }
  }
  char text[160];
  snprintf(text, sizeof text,
           ": first difference at file offset %llu (0x%llx): expected 0x%02x, got 0x%02x; "
           "%zu of %zu bytes differ, %zu of them read as 0",
           static_cast<unsigned long long>(off + first), static_cast<unsigned long long>(off + first),
           static_cast<unsigned char>(expected[first]), static_cast<unsigned char>(actual[first]), bad, n, zeros);
  return AssertionFailure() << what << text;
}

AssertionResult MatchesPattern(const std::string& what, uint64_t seed, uint64_t off, const char* actual, size_t n) {
  std::vector<char> expected = PatternVector(seed, off, n);
  return SameBytes(what, off, actual, expected.data(), n);
}

AssertionResult AllZero(const std::string& what, uint64_t off, const char* actual, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (actual[i] != 0) {
      return AssertionFailure() << what << ": byte at file offset " << off + i << " should read as 0 (hole) but is "
                                << static_cast<int>(static_cast<unsigned char>(actual[i]));
    }
  }
  return AssertionSuccess();
}

AssertionResult PwriteAll(int fd, const char* data, size_t n, uint64_t off) {
  while (n > 0) {
    ssize_t w = pwrite(fd, data, n, static_cast<off_t>(off));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return AssertionFailure() << "pwrite(off=" << off << ", n=" << n << "): " << Errno();
    if (w == 0) return AssertionFailure() << "pwrite(off=" << off << ") returned 0";
    data += w;
    n -= static_cast<size_t>(w);
    off += static_cast<uint64_t>(w);
  }
  return AssertionSuccess();
}

// Writes the pattern of `seed` over [off, off + len) at `off`.
AssertionResult PwritePattern(int fd, uint64_t seed, uint64_t off, size_t len) {
  std::vector<char> data = PatternVector(seed, off, len);
  return PwriteAll(fd, data.data(), len, off);
}

// Creates PATH (a new file, read-write) into *FD, then writes the pattern of
// `seed` over [off, off + len) at `off`.
AssertionResult CreateWithPattern(const std::string& path, Fd* fd, uint64_t seed, uint64_t off, size_t len) {
  fd->Reset(open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0644));
  if (!fd->valid()) return AssertionFailure() << "create " << path << ": " << Errno();
  return PwritePattern(fd->get(), seed, off, len);
}

AssertionResult WriteAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return AssertionFailure() << "write(n=" << n << "): " << Errno();
    if (w == 0) return AssertionFailure() << "write returned 0";
    data += w;
    n -= static_cast<size_t>(w);
  }
  return AssertionSuccess();
}

// preads up to n bytes (short only at EOF); *got receives the count.
AssertionResult PreadFull(int fd, char* data, size_t n, uint64_t off, size_t* got) {
  *got = 0;
  while (*got < n) {
    ssize_t r = pread(fd, data + *got, n - *got, static_cast<off_t>(off + *got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return AssertionFailure() << "pread(off=" << off + *got << "): " << Errno();
    if (r == 0) break;
    *got += static_cast<size_t>(r);
  }
  return AssertionSuccess();
}

// preads exactly n bytes at off (fails on a short read).
AssertionResult PreadExact(int fd, char* data, size_t n, uint64_t off) {
  size_t got = 0;
  AssertionResult r = PreadFull(fd, data, n, off, &got);
  if (!r) return r;
  if (got != n) {
    return AssertionFailure() << "pread(off=" << off << ", n=" << n << ") returned only " << got << " bytes before EOF";
  }
  return AssertionSuccess();
}

AssertionResult FileSizeIs(int fd, uint64_t size) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return AssertionFailure() << "fstat: " << Errno();
  if (static_cast<uint64_t>(st.st_size) != size) {
    return AssertionFailure() << "st_size is " << st.st_size << ", expected " << size;
  }
  return AssertionSuccess();
}

// Random chunk size between 1 byte and 4 MiB, log-uniform so all scales occur.
size_t RandomChunk(std::mt19937_64& rng) {
  unsigned e = static_cast<unsigned>(rng() % 23);  // 2^0 .. 2^22
  uint64_t lo = 1ull << e;
  return static_cast<size_t>(std::min<uint64_t>(lo + rng() % lo, 4 * kMiB));
}

// Creates `path` with `size` bytes of Pattern(seed) written sequentially with
// write() in chunks of `chunk` bytes (0: random chunks of 1 B..4 MiB).
AssertionResult WritePatternFile(const std::string& path, uint64_t seed, uint64_t size, size_t chunk) {
  Fd fd(open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644));
  if (fd.get() < 0) return AssertionFailure() << "create " << path << ": " << Errno();
  std::mt19937_64 rng(seed);
  std::vector<char> buf;
  for (uint64_t off = 0; off < size;) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(chunk ? chunk : RandomChunk(rng), size - off));
    buf.resize(n);
    Pattern(seed, off, buf.data(), n);
    AssertionResult r = WriteAll(fd.get(), buf.data(), n);
    if (!r) return r << " (" << path << " at offset " << off << ")";
    off += n;
  }
  AssertionResult r = FileSizeIs(fd.get(), size);
  if (!r) return r << " (" << path << " after writing)";
  if (fd.Close() != 0) return AssertionFailure() << "close " << path << ": " << Errno();
  return AssertionSuccess();
}

// Reads `path` sequentially with read() in chunks of `chunk` bytes (0: random)
// and checks every byte, the size, EOF, and some random preads.
AssertionResult VerifyPatternFile(const std::string& path, uint64_t seed, uint64_t size, size_t chunk) {
  Fd fd(open(path.c_str(), O_RDONLY));
  if (fd.get() < 0) return AssertionFailure() << "open " << path << ": " << Errno();
  AssertionResult r = FileSizeIs(fd.get(), size);
  if (!r) return r << " (" << path << ")";
  std::mt19937_64 rng(seed ^ chunk);
  std::vector<char> buf, expected;
  uint64_t off = 0;
  while (off < size) {
    size_t want = chunk ? chunk : RandomChunk(rng);
    buf.resize(want);
    ssize_t got = read(fd.get(), buf.data(), want);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return AssertionFailure() << "read " << path << " at " << off << ": " << Errno();
    if (got == 0) {
      return AssertionFailure() << "read " << path << " hit EOF at " << off << " of " << size;
    }
    if (off + static_cast<uint64_t>(got) > size) {
      return AssertionFailure() << "read " << path << " returned data past EOF: " << got << " bytes at " << off
                                << " of " << size;
    }
    expected.resize(static_cast<size_t>(got));
    Pattern(seed, off, expected.data(), expected.size());
    r = SameBytes(path + " read(" + std::to_string(want) + ")", off, buf.data(), expected.data(), expected.size());
    if (!r) return r;
    off += static_cast<uint64_t>(got);
  }
  char c;
  ssize_t eof = read(fd.get(), &c, 1);
  if (eof != 0) return AssertionFailure() << "read at EOF of " << path << " returned " << eof;
  for (int i = 0; i < 16 && size > 0; ++i) {
    uint64_t at = rng() % size;
    size_t n = static_cast<size_t>(std::min<uint64_t>(1 + rng() % (256 * kKiB), size - at));
    buf.resize(n);
    r = PreadExact(fd.get(), buf.data(), n, at);
    if (!r) return r << " (" << path << ")";
    r = MatchesPattern(path + " pread", seed, at, buf.data(), n);
    if (!r) return r;
  }
  return AssertionSuccess();
}

std::unique_ptr<MountedVolume> NewVolume(const MountedVolume::Options& options, std::string* error) {
  try {
    return std::make_unique<MountedVolume>(options);
  } catch (const std::exception& e) {
    *error = e.what();
    return nullptr;
  }
}

class DataTest : public ::testing::Test {
 protected:
  virtual MountedVolume::Options VolumeOptions() { return {}; }

  void SetUp() override {
    std::string error;
    volume_ = NewVolume(VolumeOptions(), &error);
    ASSERT_NE(volume_, nullptr) << "could not create and mount a volume: " << error;
  }

  std::string Path(const std::string& name) const { return volume_->Path(name); }

  void Remount() {
    std::string error;
    ASSERT_TRUE(volume_->Remount(&error)) << "remount failed: " << error;
  }

  std::unique_ptr<MountedVolume> volume_;
};

// ---------------------------------------------------------------------------
// Contents of many sizes, written and read with many chunk sizes.

TEST_F(DataTest, RandomContentsAcrossSizesAndChunkSizes) {
  const uint64_t sizes[] = {0, 1, 4095, 4096, 4097, kMiB - 1, kMiB + 1, 7 * kMiB + 123, 100 * kMiB};
  // 0 means random chunks of 1 B..4 MiB.
  const size_t write_chunks[] = {1, 7, 4095, 4096, 4097, 65539, kMiB, 4 * kMiB, 0};
  const size_t read_chunks[] = {4096, 1, 4095, 131075, kMiB, 4 * kMiB, 0, 13, 4097};
  constexpr uint64_t kMaxWrites = 1000;  // small unaligned writes each rewrite a block
  constexpr uint64_t kMaxReads = 20000;  // keeps 1-byte reads to small files

  struct File {
    std::string path;
    uint64_t seed, size;
  };
  std::vector<File> files;
  uint64_t seed = 1000;
  for (uint64_t size : sizes) {
    for (size_t chunk : write_chunks) {
      // 1-byte writes on two sizes (one crossing a block boundary); other chunk
      // sizes where the file takes at most kMaxWrites writes.
      if (chunk == 1 ? size != 1 && size != 4097 : chunk != 0 && size / chunk > kMaxWrites) {
        continue;
      }
      // 100 MiB only with 4 MiB and random chunks: enough bytes for the run time.
      if (size >= 64 * kMiB && chunk != 0 && chunk != 4 * kMiB) continue;
      std::string path = Path("s" + std::to_string(size) + "_w" + (chunk ? std::to_string(chunk) : "rand"));
      ASSERT_TRUE(WritePatternFile(path, ++seed, size, chunk));
      files.push_back({path, seed, size});
    }
  }
  auto verify_all = [&](size_t round) {
    for (size_t i = 0; i < files.size(); ++i) {
      // Rotate through the read sizes, skipping those that would take too many calls.
      size_t tried = 0;
      for (size_t k = i + round * 2; tried < 2; ++k) {
        size_t chunk = read_chunks[k % std::size(read_chunks)];
        if (chunk != 0 && files[i].size / chunk > kMaxReads) continue;
        if (files[i].size >= 64 * kMiB && chunk != 0 && chunk < kMiB) continue;
        ++tried;
        SCOPED_TRACE("read chunk " + std::to_string(chunk) + ", round " + std::to_string(round));
        ASSERT_TRUE(VerifyPatternFile(files[i].path, files[i].seed, files[i].size, chunk));
      }
    }
  };
  {
    SCOPED_TRACE("before remount");
    verify_all(0);
    if (HasFatalFailure()) return;
  }
  Remount();
  if (HasFatalFailure()) return;
  {
    SCOPED_TRACE("after remount");
    verify_all(1);
  }
}

// Overwrites inside existing data: unaligned ranges crossing 4 KiB and 1 MiB
// boundaries must replace exactly the bytes written and nothing else.
TEST_F(DataTest, OverwritesReplaceExactlyTheWrittenBytes) {
  const uint64_t size = 9 * kMiB + 5;
  std::string path = Path("overwrite");
  ASSERT_TRUE(WritePatternFile(path, 7, size, kMiB));
  std::vector<char> model = PatternVector(7, 0, size);
  Fd fd(open(path.c_str(), O_RDWR));
  ASSERT_GE(fd.get(), 0) << Errno();
  std::mt19937_64 rng(77);
  const uint64_t edges[] = {4096, 8192, kMiB, 2 * kMiB, 5 * kMiB + 4096, size - 1};
  uint64_t seed = 100;
  for (uint64_t edge : edges) {
    for (int64_t before : {1, 2, 3, 511, 4095, 4097}) {
      uint64_t off = edge > static_cast<uint64_t>(before) ? edge - before : 0;
      size_t len = static_cast<size_t>(std::min<uint64_t>(1 + rng() % 9000, size - off));
      std::vector<char> data = PatternVector(++seed, off, len);
      ASSERT_TRUE(PwriteAll(fd.get(), data.data(), len, off));
      memcpy(model.data() + off, data.data(), len);
    }
  }
  ASSERT_TRUE(FileSizeIs(fd.get(), size));
  std::vector<char> buf(size);
  ASSERT_TRUE(PreadExact(fd.get(), buf.data(), size, 0));
  ASSERT_TRUE(SameBytes("overwritten file", 0, buf.data(), model.data(), size));
  fd.Reset();
  Remount();
  fd.Reset(open(path.c_str(), O_RDONLY));
  ASSERT_GE(fd.get(), 0) << Errno();
  ASSERT_TRUE(PreadExact(fd.get(), buf.data(), size, 0));
  ASSERT_TRUE(SameBytes("overwritten file after remount", 0, buf.data(), model.data(), size));
}

// ---------------------------------------------------------------------------
// Sparse files. ext4 on /tmp: pwrite of 5 bytes at 1 GiB gives st_size
// 1073741829, st_blocks 8, SEEK_DATA(0) = 1073741824, SEEK_HOLE(0) = 0,
// SEEK_HOLE(1 GiB) = 1073741829.

// Checks the layout left by SparseFile below: zeros everywhere except
// Pattern(5) at [1 GiB, 1 GiB + 4096) and Pattern(6) at [300 MiB + 1000, +3000).
void CheckSparseLayout(int fd) {
  const uint64_t size = kGiB + 4096;
  ASSERT_TRUE(FileSizeIs(fd, size));
  std::vector<char> buf(kMiB);
  for (uint64_t off : {uint64_t{0}, 100 * kMiB + 17, 512 * kMiB, kGiB - kMiB}) {
    ASSERT_TRUE(PreadExact(fd, buf.data(), kMiB, off));
    ASSERT_TRUE(AllZero("hole at " + std::to_string(off), off, buf.data(), kMiB));
  }
  // The block around the small write: zeros, data, zeros, within one 4 KiB page.
  const uint64_t mid = 300 * kMiB;
  ASSERT_TRUE(PreadExact(fd, buf.data(), 8192, mid));
  ASSERT_TRUE(AllZero("before mid data", mid, buf.data(), 1000));
  ASSERT_TRUE(MatchesPattern("mid data", 6, mid + 1000, buf.data() + 1000, 3000));
  ASSERT_TRUE(AllZero("after mid data", mid + 4000, buf.data() + 4000, 8192 - 4000));
  // Straddling the start of the data at 1 GiB: 4 KiB of zeros, then the data.
  ASSERT_TRUE(PreadExact(fd, buf.data(), 8192, kGiB - 4096));
  ASSERT_TRUE(AllZero("just before 1 GiB", kGiB - 4096, buf.data(), 4096));
  ASSERT_TRUE(MatchesPattern("data at 1 GiB", 5, kGiB, buf.data() + 4096, 4096));
  size_t got = 0;
  ASSERT_TRUE(PreadFull(fd, buf.data(), 100, size - 10, &got));
  EXPECT_EQ(got, 10u) << "pread across EOF of the sparse file";
  struct stat st {};
  ASSERT_EQ(fstat(fd, &st), 0) << Errno();
  // 8 KiB of data: ext4 reports 16 blocks; 1 MiB (2048 blocks) is a generous bound
  // that still rules out materialised holes (2 M blocks for the whole file).
  EXPECT_LE(st.st_blocks, 2048) << "st_blocks of a 1 GiB file holding 8 KiB of data";
  EXPECT_GT(st.st_blocks, 0) << "st_blocks of a file holding 8 KiB of synced data (ext4: 16)";
}

TEST_F(DataTest, SparseFile) {
  std::string path = Path("sparse");
  Fd fd;
  ASSERT_TRUE(CreateWithPattern(path, &fd, 5, kGiB, 4096));
  ASSERT_TRUE(PwritePattern(fd.get(), 6, 300 * kMiB + 1000, 3000));
  ASSERT_EQ(fsync(fd.get()), 0) << Errno();
  {
    SCOPED_TRACE("before remount");
    CheckSparseLayout(fd.get());
  }
  fd.Reset();
  Remount();
  fd.Reset(open(path.c_str(), O_RDONLY));
  ASSERT_GE(fd.get(), 0) << Errno();
  SCOPED_TRACE("after remount");
  CheckSparseLayout(fd.get());
}

TEST_F(DataTest, TruncateExtendedFileIsAHole) {
  std::string path = Path("extended");
  Fd fd;
  ASSERT_TRUE(CreateWithPattern(path, &fd, 8, 0, 10000));
  ASSERT_EQ(ftruncate(fd.get(), static_cast<off_t>(kGiB)), 0) << Errno();
  ASSERT_TRUE(FileSizeIs(fd.get(), kGiB));
  std::vector<char> buf(kMiB);
  ASSERT_TRUE(PreadExact(fd.get(), buf.data(), kMiB, 0));
  ASSERT_TRUE(MatchesPattern("head", 8, 0, buf.data(), 10000));
  ASSERT_TRUE(AllZero("after head", 10000, buf.data() + 10000, kMiB - 10000));
  ASSERT_TRUE(PreadExact(fd.get(), buf.data(), kMiB, kGiB - kMiB));
  ASSERT_TRUE(AllZero("tail", kGiB - kMiB, buf.data(), kMiB));
  ASSERT_EQ(fsync(fd.get()), 0) << Errno();
  struct stat st {};
  ASSERT_EQ(fstat(fd.get(), &st), 0) << Errno();
  EXPECT_LE(st.st_blocks, 2048) << "a 1 GiB file truncated up from 10000 bytes";
}

TEST_F(DataTest, SeekDataAndSeekHole) {
  std::string path = Path("seek");
  Fd fd;
  ASSERT_TRUE(CreateWithPattern(path, &fd, 9, kGiB, 5));
  ASSERT_EQ(fsync(fd.get()), 0) << Errno();
  const off_t size = static_cast<off_t>(kGiB + 5);
  off_t data_at = lseek(fd.get(), 0, SEEK_DATA);
  ASSERT_GE(data_at, 0) << "lseek SEEK_DATA: " << Errno();
  // ext4: 1073741824. Allow an allocation unit of up to 1 MiB before the data.
  EXPECT_LE(data_at, static_cast<off_t>(kGiB)) << "SEEK_DATA skipped past the data";
  EXPECT_GE(data_at, static_cast<off_t>(kGiB - kMiB)) << "SEEK_DATA did not skip the 1 GiB hole";
  EXPECT_EQ(lseek(fd.get(), 0, SEEK_HOLE), 0) << "SEEK_HOLE at 0 of a file starting with a hole";
  EXPECT_EQ(lseek(fd.get(), static_cast<off_t>(kGiB), SEEK_HOLE), size)
      << "SEEK_HOLE in the last data: the implicit hole at EOF";
  errno = 0;
  EXPECT_EQ(lseek(fd.get(), size, SEEK_DATA), -1) << "SEEK_DATA at EOF";
  EXPECT_EQ(errno, ENXIO) << "SEEK_DATA at EOF: " << Errno();
}

// ---------------------------------------------------------------------------
// O_APPEND and O_TRUNC.

TEST_F(DataTest, AppendWritesGoToTheEnd) {
  std::string path = Path("append");
  ASSERT_TRUE(WritePatternFile(path, 11, 10000, 4096));
  std::vector<char> model = PatternVector(11, 0, 10000);
  Fd fd(open(path.c_str(), O_WRONLY | O_APPEND));
  ASSERT_GE(fd.get(), 0) << Errno();
  std::vector<char> a = PatternVector(12, 0, 5000);
  ASSERT_EQ(lseek(fd.get(), 0, SEEK_SET), 0) << Errno();
  ASSERT_TRUE(WriteAll(fd.get(), a.data(), a.size()));
  model.insert(model.end(), a.begin(), a.end());
  EXPECT_EQ(lseek(fd.get(), 0, SEEK_CUR), static_cast<off_t>(model.size())) << "file offset after an O_APPEND write";
  // Linux: pwrite on an O_APPEND descriptor appends whatever the offset (pwrite(2)
  // BUGS; ext4 on /tmp: "abc" then pwrite("XY", 0) gives "abcXY").
  std::vector<char> b = PatternVector(13, 0, 3000);
  ASSERT_TRUE(PwriteAll(fd.get(), b.data(), b.size(), 0));
  model.insert(model.end(), b.begin(), b.end());
  // Another descriptor overwrites at 0 and grows the file; appends follow its end.
  {
    Fd other(open(path.c_str(), O_WRONLY));
    ASSERT_GE(other.get(), 0) << Errno();
    std::vector<char> c = PatternVector(14, 0, 100);
    ASSERT_TRUE(PwriteAll(other.get(), c.data(), c.size(), 0));
    memcpy(model.data(), c.data(), c.size());
    std::vector<char> d = PatternVector(15, 0, 777);
    ASSERT_TRUE(PwriteAll(other.get(), d.data(), d.size(), model.size() + 223));
    model.resize(model.size() + 223, 0);
    model.insert(model.end(), d.begin(), d.end());
  }
  std::vector<char> e = PatternVector(16, 0, 1);
  ASSERT_TRUE(WriteAll(fd.get(), e.data(), 1));
  model.push_back(e[0]);
  ASSERT_TRUE(FileSizeIs(fd.get(), model.size()));
  fd.Reset();
  for (int pass = 0; pass < 2; ++pass) {
    SCOPED_TRACE(pass == 0 ? "before remount" : "after remount");
    Fd rd(open(path.c_str(), O_RDONLY));
    ASSERT_GE(rd.get(), 0) << Errno();
    std::vector<char> buf(model.size() + 10);
    size_t got = 0;
    ASSERT_TRUE(PreadFull(rd.get(), buf.data(), buf.size(), 0, &got));
    ASSERT_EQ(got, model.size());
    ASSERT_TRUE(SameBytes("appended file", 0, buf.data(), model.data(), model.size()));
    rd.Reset();
    if (pass == 0) Remount();
  }
}

// Appends from several threads through their own O_APPEND descriptors never
// overlap or tear (the kernel serialises them; ext4 gives the same).
TEST_F(DataTest, ConcurrentAppendsDoNotOverlap) {
  constexpr int kThreads = 4;
  constexpr int kRecords = 500;
  constexpr size_t kRecord = 64;
  std::string path = Path("appenders");
  Fd create(open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644));
  ASSERT_GE(create.get(), 0) << Errno();
  create.Reset();
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Fd fd(open(path.c_str(), O_WRONLY | O_APPEND));
      if (fd.get() < 0) {
        errors[t] = "open: " + Errno();
        return;
      }
      char rec[kRecord];
      for (int i = 0; i < kRecords; ++i) {
        memset(rec, 'a' + t, sizeof rec);
        snprintf(rec, sizeof rec, "T%d:%06d|", t, i);
        rec[kRecord - 1] = '\n';
        ssize_t w = write(fd.get(), rec, sizeof rec);
        if (w != static_cast<ssize_t>(sizeof rec)) {
          errors[t] = "write returned " + std::to_string(w) + ": " + Errno();
          return;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) ASSERT_EQ(errors[t], "") << "thread " << t;
  Fd fd(open(path.c_str(), O_RDONLY));
  ASSERT_GE(fd.get(), 0) << Errno();
  const size_t total = kThreads * kRecords * kRecord;
  ASSERT_TRUE(FileSizeIs(fd.get(), total));
  std::vector<char> buf(total);
  ASSERT_TRUE(PreadExact(fd.get(), buf.data(), total, 0));
  std::vector<int> next(kThreads, 0);
  for (size_t r = 0; r < total / kRecord; ++r) {
    const char* rec = buf.data() + r * kRecord;
    int t = -1, i = -1;
    ASSERT_EQ(sscanf(rec, "T%d:%06d|", &t, &i), 2) << "torn record at offset " << r * kRecord;
    ASSERT_TRUE(t >= 0 && t < kThreads) << "record at " << r * kRecord;
    ASSERT_EQ(i, next[t]) << "thread " << t << "'s records out of order at " << r * kRecord;
    ++next[t];
    char expect[kRecord];
    memset(expect, 'a' + t, sizeof expect);
    snprintf(expect, sizeof expect, "T%d:%06d|", t, i);
    expect[kRecord - 1] = '\n';
    ASSERT_EQ(memcmp(rec, expect, kRecord), 0) << "torn record at offset " << r * kRecord;
  }
}

TEST_F(DataTest, OTruncDiscardsOldContents) {
  std::string path = Path("otrunc");
  ASSERT_TRUE(WritePatternFile(path, 21, kMiB + 5, 65536));
  Fd fd(open(path.c_str(), O_RDWR | O_TRUNC));
  ASSERT_GE(fd.get(), 0) << Errno();
  ASSERT_TRUE(FileSizeIs(fd.get(), 0));
  char c;
  EXPECT_EQ(read(fd.get(), &c, 1), 0) << "read right after O_TRUNC";
  std::vector<char> fresh = PatternVector(22, 0, 100);
  ASSERT_TRUE(WriteAll(fd.get(), fresh.data(), fresh.size()));
  ASSERT_TRUE(FileSizeIs(fd.get(), 100));
  fd.Reset();
  // O_CREAT|O_TRUNC on an existing file and O_TRUNC on an empty one.
  std::string path2 = Path("otrunc2");
  ASSERT_TRUE(WritePatternFile(path2, 23, 3 * kMiB, kMiB));
  fd.Reset(open(path2.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
  ASSERT_GE(fd.get(), 0) << Errno();
  ASSERT_TRUE(FileSizeIs(fd.get(), 0));
  fd.Reset(open(path2.c_str(), O_WRONLY | O_TRUNC));
  ASSERT_GE(fd.get(), 0) << Errno();
  ASSERT_TRUE(FileSizeIs(fd.get(), 0));
  fd.Reset();
  for (int pass = 0; pass < 2; ++pass) {
    SCOPED_TRACE(pass == 0 ? "before remount" : "after remount");
    fd.Reset(open(path.c_str(), O_RDWR));
    ASSERT_GE(fd.get(), 0) << Errno();
    ASSERT_TRUE(FileSizeIs(fd.get(), 100));
    std::vector<char> buf(200);
    size_t got = 0;
    ASSERT_TRUE(PreadFull(fd.get(), buf.data(), buf.size(), 0, &got));
    ASSERT_EQ(got, 100u);
    ASSERT_TRUE(SameBytes("rewritten file", 0, buf.data(), fresh.data(), 100));
    struct stat st {};
    ASSERT_EQ(stat(path2.c_str(), &st), 0) << Errno();
    EXPECT_EQ(st.st_size, 0);
    fd.Reset();
    if (pass == 0) Remount();
  }
  // Growing the file again must show zeros, never the discarded contents.
  fd.Reset(open(path.c_str(), O_RDWR));
  ASSERT_GE(fd.get(), 0) << Errno();
  ASSERT_EQ(ftruncate(fd.get(), static_cast<off_t>(kMiB + 5)), 0) << Errno();
  std::vector<char> buf(kMiB + 5);
  ASSERT_TRUE(PreadExact(fd.get(), buf.data(), buf.size(), 0));
  ASSERT_TRUE(SameBytes("head", 0, buf.data(), fresh.data(), 100));
  ASSERT_TRUE(AllZero("grown after O_TRUNC (old data must not reappear)", 100, buf.data() + 100, buf.size() - 100));
}

// ---------------------------------------------------------------------------
// O_DIRECT. FUSE accepts O_DIRECT opens (ext4 does too); I/O here uses 4 KiB
// aligned buffers, offsets and lengths, which ext4 requires.

struct AlignedBuffer {
  explicit AlignedBuffer(size_t n) : size(n) {
    if (posix_memalign(&ptr, 4096, n) != 0) ptr = nullptr;
  }
  ~AlignedBuffer() { free(ptr); }
  char* data() { return static_cast<char*>(ptr); }
  void* ptr = nullptr;
  size_t size;
};

TEST_F(DataTest, ODirectAlignedIo) {
  std::string path = Path("direct");
  Fd fd(open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT, 0644));
  ASSERT_GE(fd.get(), 0) << "open O_DIRECT: " << Errno();
  const int flags = fcntl(fd.get(), F_GETFL);
  EXPECT_TRUE(flags & O_DIRECT) << "O_DIRECT dropped from the descriptor's flags";
  struct Piece {
    uint64_t off;
    size_t len;
    uint64_t seed;
  };
  const Piece pieces[] = {{0, 4096, 31}, {3 * 4096, kMiB, 32}, {8 * kMiB, 256 * kKiB, 33}};
  for (const Piece& p : pieces) {
    AlignedBuffer buf(p.len);
    ASSERT_NE(buf.ptr, nullptr);
    Pattern(p.seed, p.off, buf.data(), p.len);
    ssize_t w = pwrite(fd.get(), buf.data(), p.len, static_cast<off_t>(p.off));
    ASSERT_EQ(w, static_cast<ssize_t>(p.len)) << "O_DIRECT pwrite at " << p.off << ": " << Errno();
  }
  const uint64_t size = 8 * kMiB + 256 * kKiB;
  ASSERT_TRUE(FileSizeIs(fd.get(), size));
  auto check = [&](int rfd, bool direct) {
    for (const Piece& p : pieces) {
      AlignedBuffer buf(p.len);
      ssize_t r = pread(rfd, buf.data(), p.len, static_cast<off_t>(p.off));
      ASSERT_EQ(r, static_cast<ssize_t>(p.len))
          << (direct ? "O_DIRECT" : "buffered") << " pread at " << p.off << ": " << Errno();
      ASSERT_TRUE(MatchesPattern(direct ? "O_DIRECT read" : "buffered read", p.seed, p.off, buf.data(), p.len));
    }
    AlignedBuffer gap(8192);
    ASSERT_EQ(pread(rfd, gap.data(), 8192, 4096), 8192) << Errno();
    ASSERT_TRUE(AllZero(direct ? "O_DIRECT hole" : "buffered hole", 4096, gap.data(), 8192));
  };
  check(fd.get(), true);
  if (HasFatalFailure()) return;
  Fd buffered(open(path.c_str(), O_RDWR));
  ASSERT_GE(buffered.get(), 0) << Errno();
  check(buffered.get(), false);
  if (HasFatalFailure()) return;
  // A buffered write is seen by O_DIRECT reads.
  const uint64_t bw_at = 6 * kMiB;
  std::vector<char> bw = PatternVector(34, bw_at, 4096);
  ASSERT_TRUE(PwriteAll(buffered.get(), bw.data(), bw.size(), bw_at));
  AlignedBuffer rb(4096);
  ASSERT_EQ(pread(fd.get(), rb.data(), 4096, bw_at), 4096) << Errno();
  ASSERT_TRUE(MatchesPattern("O_DIRECT read of a buffered write", 34, bw_at, rb.data(), 4096));
  buffered.Reset();
  fd.Reset();
  Remount();
  fd.Reset(open(path.c_str(), O_RDONLY | O_DIRECT));
  ASSERT_GE(fd.get(), 0) << "open O_DIRECT after remount: " << Errno();
  ASSERT_TRUE(FileSizeIs(fd.get(), size));
  ASSERT_EQ(pread(fd.get(), rb.data(), 4096, bw_at), 4096) << Errno();
  ASSERT_TRUE(MatchesPattern("after remount", 34, bw_at, rb.data(), 4096));
  check(fd.get(), true);
}

// ---------------------------------------------------------------------------
// mmap: MAP_SHARED reads and writes agree with read()/write().

TEST_F(DataTest, MmapConsistentWithReadWrite) {
  const size_t size = 3 * kMiB + 123;
  std::string path = Path("mapped");
  ASSERT_TRUE(WritePatternFile(path, 41, size, 65536));
  std::vector<char> model = PatternVector(41, 0, size);
  Fd fd(open(path.c_str(), O_RDWR));
  ASSERT_GE(fd.get(), 0) << Errno();
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  ASSERT_NE(p, MAP_FAILED) << "mmap MAP_SHARED read/write: " << Errno();
  char* map = static_cast<char*>(p);
  EXPECT_TRUE(SameBytes("mmap read of written data", 0, map, model.data(), size));
  // Stores through the mapping: page-crossing ranges, the first and last byte.
  struct Range {
    size_t off, len;
  };
  const Range stores[] = {{0, 1}, {4090, 20}, {kMiB - 3, 8192}, {2 * kMiB + 4096, 4096}, {size - 1, 1}};
  uint64_t seed = 50;
  for (const Range& r : stores) {
    std::vector<char> d = PatternVector(++seed, r.off, r.len);
    memcpy(map + r.off, d.data(), r.len);
    memcpy(model.data() + r.off, d.data(), r.len);
  }
  ASSERT_EQ(msync(map, size, MS_SYNC), 0) << "msync: " << Errno();
  {
    Fd other(open(path.c_str(), O_RDONLY));
    ASSERT_GE(other.get(), 0) << Errno();
    std::vector<char> buf(size);
    ASSERT_TRUE(PreadExact(other.get(), buf.data(), size, 0));
    EXPECT_TRUE(SameBytes("pread after mmap stores + msync", 0, buf.data(), model.data(), size));
  }
  // A write() is seen through the existing mapping.
  std::vector<char> w = PatternVector(60, kMiB + 100, 10000);
  ASSERT_TRUE(PwriteAll(fd.get(), w.data(), w.size(), kMiB + 100));
  memcpy(model.data() + kMiB + 100, w.data(), w.size());
  EXPECT_TRUE(SameBytes("mapping after pwrite", 0, map, model.data(), size));
  ASSERT_EQ(munmap(map, size), 0) << Errno();
  ASSERT_TRUE(FileSizeIs(fd.get(), size)) << "stores through a mapping must not change the size";
  fd.Reset();
  Remount();
  fd.Reset(open(path.c_str(), O_RDONLY));
  ASSERT_GE(fd.get(), 0) << Errno();
  ASSERT_TRUE(FileSizeIs(fd.get(), size));
  std::vector<char> buf(size);
  ASSERT_TRUE(PreadExact(fd.get(), buf.data(), size, 0));
  EXPECT_TRUE(SameBytes("after remount", 0, buf.data(), model.data(), size));
  p = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
  ASSERT_NE(p, MAP_FAILED) << "mmap read-only after remount: " << Errno();
  EXPECT_TRUE(SameBytes("mmap read after remount", 0, static_cast<char*>(p), model.data(), size));
  ASSERT_EQ(munmap(p, size), 0) << Errno();
}

// What other handles and mappings have cached of a file must not hide the
// writes of a write-only handle (also the guard for the direct_io that write-
// only handles of ephemeral files get, and others might one day).
TEST_F(DataTest, WriteOnlyHandleWritesAreSeenByCachedReadersAndMappings) {
  const size_t size = 2 * kMiB;
  std::string path = Path("cached");
  ASSERT_TRUE(WritePatternFile(path, 70, size, 65536));
  std::vector<char> model = PatternVector(70, 0, size);
  Fd reader(open(path.c_str(), O_RDONLY));
  ASSERT_GE(reader.get(), 0) << Errno();
  std::vector<char> buf(size);
  ASSERT_TRUE(PreadExact(reader.get(), buf.data(), size, 0));  // now in the page cache
  void* p = mmap(nullptr, size, PROT_READ, MAP_SHARED, reader.get(), 0);
  ASSERT_NE(p, MAP_FAILED) << Errno();
  const char* map = static_cast<const char*>(p);
  EXPECT_TRUE(SameBytes("mapping before", 0, map, model.data(), size));

  Fd writer(open(path.c_str(), O_WRONLY));
  ASSERT_GE(writer.get(), 0) << Errno();
  std::vector<char> w = PatternVector(71, 5000, 300000);
  ASSERT_TRUE(PwriteAll(writer.get(), w.data(), w.size(), 5000));
  memcpy(model.data() + 5000, w.data(), w.size());
  // The mapping first: no read() in between to revalidate the page cache
  // (the kernel drops the written range after a direct_io write).
  EXPECT_TRUE(SameBytes("mapping after a write-only handle's write", 0, map, model.data(), size));
  ASSERT_TRUE(PreadExact(reader.get(), buf.data(), size, 0));
  EXPECT_TRUE(SameBytes("cached reader after a write-only handle's write", 0, buf.data(), model.data(), size));
  ASSERT_EQ(munmap(p, size), 0) << Errno();
}

// Pages of `path` in the page cache (mincore of a mapping, which faults
// nothing in); -1 when it cannot tell.
long ResidentPages(const std::string& path, size_t size) {
  Fd fd(open(path.c_str(), O_RDONLY));
  if (fd.get() < 0) return -1;
  void* p = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return -1;
  const size_t pages = (size + 4095) / 4096;
  std::vector<unsigned char> resident(pages);
  long count = mincore(p, size, resident.data()) == 0 ? 0 : -1;
  for (size_t i = 0; count >= 0 && i < pages; ++i) count += resident[i] & 1;
  munmap(p, size);
  return count;
}

// A write-only handle skips the page cache (direct_io), in an ephemeral
// directory or not; a handle that can read writes through it. All read back
// exactly, from a first write that leaves every later one unaligned.
TEST_F(DataTest, WriteOnlyHandlesBypassThePageCache) {
  ASSERT_EQ(mkdir(Path("eph").c_str(), 0755), 0) << Errno();
  ASSERT_EQ(setxattr(Path("eph").c_str(), "user.spillfs.ephemeral", "1", 1, 0), 0) << Errno();
  const size_t size = 320 + 3 * kMiB;
  std::vector<char> model = PatternVector(72, 0, size);
  const struct {
    const char* name;
    int access;
    bool cached;
  } cases[] = {{"wronly", O_WRONLY, false}, {"eph/wronly", O_WRONLY, false}, {"rdwr", O_RDWR, true}};
  for (const auto& c : cases) {
    const std::string path = Path(c.name);
    Fd fd(open(path.c_str(), c.access | O_CREAT | O_TRUNC, 0644));
    ASSERT_GE(fd.get(), 0) << Errno();
    ASSERT_TRUE(PwriteAll(fd.get(), model.data(), 320, 0));
    for (size_t at = 320; at < size; at += kMiB) ASSERT_TRUE(PwriteAll(fd.get(), model.data() + at, kMiB, at));
    long resident = ResidentPages(path, size);
    if (c.cached) {
      EXPECT_GT(resident, 0) << c.name << ": a handle that can read writes through the page cache";
    } else {
      EXPECT_EQ(resident, 0) << c.name << ": a write-only handle bypasses the page cache";
    }
    std::vector<char> back(size);
    Fd reader(open(path.c_str(), O_RDONLY));
    ASSERT_GE(reader.get(), 0) << Errno();
    ASSERT_TRUE(PreadExact(reader.get(), back.data(), size, 0));
    EXPECT_TRUE(SameBytes(("read back " + path).c_str(), 0, back.data(), model.data(), size));
  }
}

// ---------------------------------------------------------------------------
// Concurrency: 8 threads.

// Each thread writes its own file in random chunks and, between writes, reads
// back part of another thread's file that the other has already written (its
// progress is published with release/acquire after write() returned).
TEST_F(DataTest, ConcurrentWritersAndReadersOnDistinctFiles) {
  constexpr int kThreads = 8;
  const uint64_t size = 6 * kMiB + 4321;
  std::vector<std::string> paths;
  for (int t = 0; t < kThreads; ++t) {
    paths.push_back(Path("distinct" + std::to_string(t)));
    Fd fd(open(paths.back().c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644));
    ASSERT_GE(fd.get(), 0) << Errno();
  }
  std::vector<std::atomic<uint64_t>> progress(kThreads);
  for (auto& p : progress) p.store(0);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(900 + t);
      Fd fd(open(paths[t].c_str(), O_WRONLY));
      std::vector<Fd> others(kThreads);
      for (int o = 0; o < kThreads; ++o) others[o].Reset(open(paths[o].c_str(), O_RDONLY));
      if (fd.get() < 0) {
        errors[t] = "open: " + Errno();
        return;
      }
      std::vector<char> buf, rbuf;
      for (uint64_t off = 0; off < size;) {
        size_t n = static_cast<size_t>(std::min<uint64_t>(1 + rng() % (512 * kKiB), size - off));
        buf.resize(n);
        Pattern(t, off, buf.data(), n);
        AssertionResult r = WriteAll(fd.get(), buf.data(), n);
        if (!r) {
          errors[t] = r.message();
          return;
        }
        off += n;
        progress[t].store(off, std::memory_order_release);
        int o = static_cast<int>(rng() % kThreads);
        uint64_t done = progress[o].load(std::memory_order_acquire);
        if (done == 0 || others[o].get() < 0) continue;
        uint64_t at = rng() % done;
        size_t len = static_cast<size_t>(std::min<uint64_t>(1 + rng() % (256 * kKiB), done - at));
        rbuf.resize(len);
        r = PreadExact(others[o].get(), rbuf.data(), len, at);
        if (r) r = MatchesPattern("file " + std::to_string(o), o, at, rbuf.data(), len);
        if (!r) {
          errors[t] = "reading thread " + std::to_string(o) + "'s file: " + r.message();
          return;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(errors[t], "") << "thread " << t;
  for (int pass = 0; pass < 2; ++pass) {
    SCOPED_TRACE(pass == 0 ? "after join" : "after remount");
    for (int t = 0; t < kThreads; ++t) {
      ASSERT_TRUE(VerifyPatternFile(paths[t], t, size, kMiB));
    }
    if (pass == 0) Remount();
  }
}

// Eight threads write disjoint regions of one file. Regions are 1 MiB + 2047
// bytes, so neighbouring regions share a 4 KiB page. The first half of each
// region is written sequentially once (others read it back concurrently as it
// is published); the second half is overwritten at random places by its owner,
// which checks its own region against a private model.
TEST_F(DataTest, ConcurrentWritersAndReadersOnDisjointRegionsOfOneFile) {
  constexpr int kThreads = 8;
  const uint64_t region = kMiB + 2047;
  const uint64_t half = region / 2;
  std::string path = Path("shared");
  {
    Fd fd(open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644));
    ASSERT_GE(fd.get(), 0) << Errno();
  }
  std::vector<std::atomic<uint64_t>> progress(kThreads);
  for (auto& p : progress) p.store(0);
  std::vector<std::vector<char>> models(kThreads);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto fail = [&](const std::string& what) { errors[t] = what; };
      std::mt19937_64 rng(700 + t);
      Fd fd(open(path.c_str(), O_RDWR));
      if (fd.get() < 0) return fail("open: " + Errno());
      const uint64_t base = t * region;
      std::vector<char>& model = models[t];
      model = PatternVector(100 + t, base, region);
      std::vector<char> rbuf;
      // Phase 1: the stable first half, sequentially, with reads of other regions.
      for (uint64_t off = 0; off < half;) {
        size_t n = static_cast<size_t>(std::min<uint64_t>(1 + rng() % (64 * kKiB), half - off));
        AssertionResult r = PwriteAll(fd.get(), model.data() + off, n, base + off);
        if (!r) return fail(r.message());
        off += n;
        progress[t].store(off, std::memory_order_release);
        int o = static_cast<int>(rng() % kThreads);
        uint64_t done = progress[o].load(std::memory_order_acquire);
        if (done == 0) continue;
        uint64_t at = rng() % done;
        size_t len = static_cast<size_t>(std::min<uint64_t>(1 + rng() % (64 * kKiB), done - at));
        rbuf.resize(len);
        r = PreadExact(fd.get(), rbuf.data(), len, o * region + at);
        if (r) r = MatchesPattern("region " + std::to_string(o), 100 + o, o * region + at, rbuf.data(), len);
        if (!r) return fail("reading region " + std::to_string(o) + ": " + r.message());
      }
      // Phase 2: the second half, first in full, then random overwrites.
      AssertionResult r = PwriteAll(fd.get(), model.data() + half, region - half, base + half);
      if (!r) return fail(r.message());
      for (int i = 0; i < 150; ++i) {
        uint64_t at = half + rng() % (region - half);
        size_t n = static_cast<size_t>(std::min<uint64_t>(1 + rng() % 20000, region - at));
        Pattern(1000 * (t + 1) + i, base + at, model.data() + at, n);
        r = PwriteAll(fd.get(), model.data() + at, n, base + at);
        if (!r) return fail(r.message());
        uint64_t check = half + rng() % (region - half);
        size_t len = static_cast<size_t>(std::min<uint64_t>(1 + rng() % 30000, region - check));
        rbuf.resize(len);
        r = PreadExact(fd.get(), rbuf.data(), len, base + check);
        if (r) {
          r = SameBytes("own region " + std::to_string(t), base + check, rbuf.data(), model.data() + check, len);
        }
        if (!r) return fail(r.message());
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) ASSERT_EQ(errors[t], "") << "thread " << t;
  std::vector<char> model;
  for (auto& m : models) model.insert(model.end(), m.begin(), m.end());
  for (int pass = 0; pass < 2; ++pass) {
    SCOPED_TRACE(pass == 0 ? "after join" : "after remount");
    Fd fd(open(path.c_str(), O_RDONLY));
    ASSERT_GE(fd.get(), 0) << Errno();
    ASSERT_TRUE(FileSizeIs(fd.get(), model.size()));
    std::vector<char> buf(model.size());
    ASSERT_TRUE(PreadExact(fd.get(), buf.data(), buf.size(), 0));
    ASSERT_TRUE(SameBytes("shared file", 0, buf.data(), model.data(), model.size()));
    fd.Reset();
    if (pass == 0) Remount();
  }
}

// ---------------------------------------------------------------------------
// ENOSPC on a 64 MiB volume.

class SmallVolumeTest : public DataTest {
 protected:
  MountedVolume::Options VolumeOptions() override {
    MountedVolume::Options options;
    options.size = "64M";
    return options;
  }
};

uint64_t FreeBytes(const std::string& path) {
  struct statvfs sv {};
  if (statvfs(path.c_str(), &sv) != 0) return 0;
  return static_cast<uint64_t>(sv.f_bavail) * sv.f_frsize;
}

TEST_F(SmallVolumeTest, WriteUntilEnospcThenFreeSpace) {
  const uint64_t kVolume = 64 * kMiB;
  const uint64_t kKeep = 8 * kMiB;
  std::string keep = Path("keep");
  ASSERT_TRUE(WritePatternFile(keep, 71, kKeep, kMiB));
  {
    Fd fd(open(keep.c_str(), O_RDONLY));
    ASSERT_GE(fd.get(), 0) << Errno();
    ASSERT_EQ(fsync(fd.get()), 0) << Errno();
  }
  std::string fill = Path("fill");
  Fd fd(open(fill.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644));
  ASSERT_GE(fd.get(), 0) << Errno();
  std::vector<char> buf(kMiB);
  uint64_t written = 0;
  int error = 0;
  while (written <= 2 * kVolume) {
    Pattern(72, written, buf.data(), buf.size());
    ssize_t w = write(fd.get(), buf.data(), buf.size());
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      error = errno;
      break;
    }
    ASSERT_GT(w, 0) << "write returned 0";
    written += static_cast<uint64_t>(w);
  }
  if (error == 0) {
    // ext4 fails the write() itself (its delayed allocation reserves space);
    // say what fsync reports, which is where an unreserved RAM tier fails.
    int rc = fsync(fd.get());
    std::string fsync_result = rc == 0 ? "succeeds" : "fails with " + Errno();
    FAIL() << "wrote " << written << " bytes to a 64 MiB volume without an error from write(); "
           << "fsync then " << fsync_result;
  }
  ASSERT_EQ(error, ENOSPC) << "writing past the end of the space failed with errno " << ErrnoText(error);
  EXPECT_LE(written + kKeep, kVolume) << "more bytes accepted than the volume holds";
  EXPECT_GE(written + kKeep, kVolume / 2) << "ENOSPC with over half of the volume unused";
  // A second write fails the same way; what was accepted is durable and intact.
  errno = 0;
  EXPECT_EQ(write(fd.get(), buf.data(), buf.size()), -1);
  EXPECT_EQ(errno, ENOSPC) << "second write on a full volume: " << Errno();
  EXPECT_EQ(fsync(fd.get()), 0) << "fsync of the data accepted before ENOSPC: " << Errno();
  ASSERT_EQ(fd.Close(), 0) << "close after ENOSPC: " << Errno();
  ASSERT_TRUE(VerifyPatternFile(keep, 71, kKeep, kMiB)) << "file written before the volume filled";
  ASSERT_TRUE(VerifyPatternFile(fill, 72, written, kMiB)) << "data accepted before ENOSPC";

  // Deleting the file gives the space back.
  const uint64_t free_full = FreeBytes(volume_->mountpoint());
  ASSERT_EQ(unlink(fill.c_str()), 0) << Errno();
  // The kernel sends FUSE RELEASE asynchronously after close(), so the daemon
  // may reclaim the inode just after unlink returns: wait (bounded) for statfs
  // to show the space, then require that writing works again.
  const uint64_t want_free = free_full + written / 2;
  uint64_t free_now = 0;
  Eventually([&] { return (free_now = FreeBytes(volume_->mountpoint())) >= want_free; });
  EXPECT_GE(free_now, want_free) << "statfs free bytes after deleting " << written << " bytes (before: " << free_full
                                 << ")";
  const uint64_t again = std::min<uint64_t>(written, 32 * kMiB);
  std::string next = Path("again");
  ASSERT_TRUE(WritePatternFile(next, 73, again, kMiB)) << "writing after the space was freed";
  {
    Fd nfd(open(next.c_str(), O_RDONLY));
    ASSERT_GE(nfd.get(), 0) << Errno();
    ASSERT_EQ(fsync(nfd.get()), 0) << Errno();
  }
  Remount();
  EXPECT_TRUE(VerifyPatternFile(keep, 71, kKeep, 65536)) << "after remount";
  EXPECT_TRUE(VerifyPatternFile(next, 73, again, 65536)) << "after remount";
  struct stat st {};
  EXPECT_EQ(stat(fill.c_str(), &st), -1) << "deleted file is back after remount";
}

// ---------------------------------------------------------------------------
// --writeback-cache: the kernel caches writes and sends them back merged.

uint64_t WriteRequests(const MountedVolume& volume) {
  std::string output;
  if (RunSpillfs("stat --json " + volume.mountpoint(), &output) != 0) return UINT64_MAX;
  return nlohmann::json::parse(output)["writes"].get<uint64_t>();
}

class WritebackCacheTest : public DataTest {
 protected:
  MountedVolume::Options VolumeOptions() override {
    MountedVolume::Options options;
    options.size = "64M";
    options.mount_args = {"--writeback-cache"};
    return options;
  }
};

TEST_F(WritebackCacheTest, SmallWritesReachTheDaemonMergedAndReadBack) {
  const uint64_t kSize = 8 * kMiB;
  const uint64_t before = WriteRequests(*volume_);
  ASSERT_NE(before, UINT64_MAX);
  ASSERT_TRUE(WritePatternFile(Path("small"), 81, kSize, 4096));  // 2048 write() calls
  {
    Fd fd(open(Path("small").c_str(), O_RDONLY));
    ASSERT_GE(fd.get(), 0) << Errno();
    ASSERT_EQ(fsync(fd.get()), 0) << Errno();
  }
  const uint64_t requests = WriteRequests(*volume_) - before;
  // Without the writeback cache each write() is one request (2048 here).
  EXPECT_LT(requests, kSize / 4096 / 4) << "write requests the daemon saw for 2048 writes of 4 KiB";
  ASSERT_TRUE(WritePatternFile(Path("random"), 82, 3 * kMiB + 12345, 0));  // chunks of 1 B..4 MiB
  Remount();
  EXPECT_TRUE(VerifyPatternFile(Path("small"), 81, kSize, 65536));
  EXPECT_TRUE(VerifyPatternFile(Path("random"), 82, 3 * kMiB + 12345, 0));
}

// Writes past the end of the space are never lost silently: with the
// writeback cache write() may accept them, but fsync (or close) says ENOSPC,
// and data made durable before is intact.
TEST_F(WritebackCacheTest, FullVolumeIsReportedByFsyncAndLosesNothingElse) {
  const uint64_t kVolume = 64 * kMiB;
  const uint64_t kKeep = 8 * kMiB;
  ASSERT_TRUE(WritePatternFile(Path("keep"), 83, kKeep, kMiB));
  {
    Fd fd(open(Path("keep").c_str(), O_RDONLY));
    ASSERT_GE(fd.get(), 0) << Errno();
    ASSERT_EQ(fsync(fd.get()), 0) << Errno();
  }
  Fd fd(open(Path("fill").c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644));
  ASSERT_GE(fd.get(), 0) << Errno();
  std::vector<char> buf(kMiB);
  int error = 0;
  for (uint64_t written = 0; written <= 2 * kVolume && error == 0;) {
    Pattern(84, written, buf.data(), buf.size());
    ssize_t w = write(fd.get(), buf.data(), buf.size());
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) error = errno;
    if (w > 0) written += static_cast<uint64_t>(w);
  }
  if (error == 0 && fsync(fd.get()) != 0) error = errno;
  EXPECT_EQ(error, ENOSPC) << "filling the volume ended with errno " << ErrnoText(error);
  fd.Close();
  ASSERT_EQ(unlink(Path("fill").c_str()), 0) << Errno();
  Remount();
  EXPECT_TRUE(VerifyPatternFile(Path("keep"), 83, kKeep, 65536)) << "after remount";
}

}  // namespace
}  // namespace spillfs::testing
