// Segment files (spill_file_*, libspillfs_client) on every backend: the
// direct path and O_DIRECT through a spillfs mount, O_DIRECT on a plain
// directory (/tmp) and on a tmpfs, and the buffered fallback. Host segments
// at odd offsets and lengths read back equal (through the file system and
// through spill_file_read_segments), the size is exact, bytes of a partly
// written block keep their contents, a full file system fails with ENOSPC,
// and checkpoint dedup (spill_hash_units, spill_file_dedup) maps the units a
// volume already holds by reference so that a second write of the same
// bytes adds (almost) no physical bytes. Device segments: tests/cuda.
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "spillfs/client.h"
#include "support/file_io.h"
#include "support/file_places.h"
#include "support/mounted_volume.h"
#include "support/random_bytes.h"

namespace spillfs::testing {
namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;
constexpr uint64_t kUnit = 256 * kKiB;

std::string Errno() { return std::string("errno ") + std::to_string(errno) + " (" + strerror(errno) + ")"; }

FilePtr Open(const std::string& path, int flags) {
  FilePtr f(spill_file_open(path.c_str(), flags, 0));
  EXPECT_NE(f, nullptr) << path << ": " << spill_last_error();
  return f;
}

constexpr int kCreate = SPILL_FILE_READ | SPILL_FILE_WRITE | SPILL_FILE_CREATE | SPILL_FILE_TRUNCATE;

// One request of `segments`, waited for; 0 or -errno.
int RunRequest(spill_file* f, const std::vector<spill_segment>& segments, bool write, spill_io_stats* stats = nullptr) {
  spill_request* request = nullptr;
  int rc = write ? spill_file_write_segments(f, segments.data(), segments.size(), 0, &request)
                 : spill_file_read_segments(f, segments.data(), segments.size(), 0, &request);
  if (rc != 0) return rc;
  return spill_request_wait(request, stats);
}

uint64_t SizeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(stat(path.c_str(), &st), 0) << path << ": " << Errno();
  return static_cast<uint64_t>(st.st_size);
}

// 4 KiB-aligned host memory.
struct Aligned {
  explicit Aligned(size_t n) : size(n), data(static_cast<char*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096))) {}
  ~Aligned() { std::free(data); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  size_t size;
  char* data;
};

// Host segments at odd offsets and lengths (some 4 KiB-aligned in memory and
// in the file, some large enough to fill whole chunks), the memory they
// point to, and the file they make (zeros in the gaps).
struct Segments {
  std::vector<std::unique_ptr<Aligned>> memory;
  std::vector<spill_segment> list;
  std::string image;

  void Add(uint64_t offset, uint64_t length, uint64_t seed, size_t misalign = 0) {
    auto mem = std::make_unique<Aligned>(length + misalign);
    std::string bytes = RandomBytes(length, seed);
    std::memcpy(mem->data + misalign, bytes.data(), length);
    list.push_back(spill_segment{mem->data + misalign, length, offset, -1});
    if (image.size() < offset + length) image.resize(offset + length, '\0');
    image.replace(offset, length, bytes);
    memory.push_back(std::move(mem));
  }
};

Segments OddSegments(uint64_t seed) {
  Segments s;
  std::mt19937_64 rng(seed);
  const uint64_t lengths[] = {1, 7, 100, 4095, 4096, 4097, 65537, 300000, kMiB + 3, 9 * kMiB};
  const uint64_t gaps[] = {0, 0, 1, 3, 4096, 5000, 12345, 3 * kMiB};
  uint64_t at = 3;
  for (int i = 0; i < 30; ++i) {
    uint64_t length = lengths[rng() % std::size(lengths)];
    size_t misalign = rng() % 2 == 0 ? 0 : 1 + rng() % 100;
    if (length >= 9 * kMiB) {  // whole chunks written straight from aligned memory
      at = (at + 4095) / 4096 * 4096;
      misalign = 0;
    }
    s.Add(at, length, seed * 1000 + i, misalign);
    at += length + gaps[rng() % std::size(gaps)];
  }
  // Added out of file order: the library sorts them.
  std::shuffle(s.list.begin(), s.list.end(), rng);
  return s;
}

// Settings restored after each test (they are process-wide).
void DefaultSettings() {
  for (auto [key, value] : {std::pair<const char*, uint64_t>{"chunk_bytes", 8 * kMiB},
                            {"pinned_bytes", 256 * kMiB},
                            {"io_bytes", kMiB},
                            {"queue_depth", 32},
                            {"commit_bytes", 256 * kMiB},
                            {"direct_path", 1},
                            {"o_direct", 1},
                            {"verify", 1},
                            {"unit_hashes", 1}}) {
    ASSERT_EQ(spill_config_set(key, value), 0) << key << ": " << spill_last_error();
  }
}

class SegmentFileTest : public ::testing::TestWithParam<Place> {
 protected:
  void SetUp() override {
    DefaultSettings();
    MountedVolume::Options options;
    options.size = "2G";
    place_.Make(GetParam(), "segment", options);
  }

  void TearDown() override { DefaultSettings(); }

  std::string Path(const std::string& name) const { return place_.Path(name); }
  void ExpectBackend(spill_file* f) { place_.ExpectBackend(f); }

  PlaceDir place_;
};

TEST_P(SegmentFileTest, OddSegmentsRoundTripWithTheExactSize) {
  Segments s = OddSegments(7);
  const std::string path = Path("odd");
  {
    FilePtr f = Open(path, kCreate);
    ASSERT_NE(f, nullptr);
    ExpectBackend(f.get());
    spill_io_stats stats{};
    ASSERT_EQ(RunRequest(f.get(), s.list, true, &stats), 0) << spill_last_error();
    uint64_t bytes = 0;
    for (const spill_segment& seg : s.list) bytes += seg.length;
    EXPECT_EQ(stats.bytes, bytes);
    EXPECT_GE(stats.io_bytes, bytes);
    EXPECT_GT(stats.ios, 0u);
    EXPECT_EQ(SizeOf(path), s.image.size());  // no padding shows once the request is done

    // Back through the library: the same segments into fresh memory, and
    // overlapping ones (the whole file, and pieces of it at odd places).
    std::vector<std::string> back(s.list.size());
    std::vector<spill_segment> reads;
    for (size_t i = 0; i < s.list.size(); ++i) {
      back[i].assign(s.list[i].length, 'x');
      reads.push_back(spill_segment{back[i].data(), s.list[i].length, s.list[i].file_offset, -1});
    }
    std::string whole(s.image.size(), 'y');
    reads.push_back(spill_segment{whole.data(), whole.size(), 0, -1});
    std::string odd(100000, 'z');
    reads.push_back(spill_segment{odd.data(), odd.size(), 12345, -1});
    ASSERT_EQ(RunRequest(f.get(), reads, false, &stats), 0) << spill_last_error();
    for (size_t i = 0; i < s.list.size(); ++i) {
      EXPECT_EQ(back[i], s.image.substr(s.list[i].file_offset, s.list[i].length)) << "segment " << i;
    }
    EXPECT_TRUE(whole == s.image);
    EXPECT_TRUE(odd == s.image.substr(12345, 100000));
  }
  EXPECT_TRUE(ReadFile(path) == s.image);
  EXPECT_EQ(SizeOf(path), s.image.size());
  if (place_.volume() != nullptr) {
    ASSERT_TRUE(place_.volume()->Remount());
    EXPECT_TRUE(ReadFile(path) == s.image);
  }
}

// Small chunks, I/Os, queue, pool and steps: many pieces, a pool that runs
// dry, several reserve/commit steps on the direct path.
TEST_P(SegmentFileTest, SmallChunksAndAShallowQueue) {
  ASSERT_EQ(spill_config_set("chunk_bytes", 256 * kKiB), 0) << spill_last_error();
  ASSERT_EQ(spill_config_set("pinned_bytes", 512 * kKiB), 0) << spill_last_error();
  ASSERT_EQ(spill_config_set("io_bytes", 64 * kKiB), 0) << spill_last_error();
  ASSERT_EQ(spill_config_set("queue_depth", 3), 0) << spill_last_error();
  ASSERT_EQ(spill_config_set("commit_bytes", 768 * kKiB), 0) << spill_last_error();
  Segments s = OddSegments(8);
  const std::string path = Path("small");
  FilePtr f = Open(path, kCreate);
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(RunRequest(f.get(), s.list, true), 0) << spill_last_error();
  EXPECT_EQ(SizeOf(path), s.image.size());
  std::string whole(s.image.size(), 'y');
  ASSERT_EQ(RunRequest(f.get(), {spill_segment{whole.data(), whole.size(), 0, -1}}, false), 0) << spill_last_error();
  EXPECT_TRUE(whole == s.image);
  EXPECT_TRUE(ReadFile(path) == s.image);
}

// A write covers blocks in part: the rest of each block keeps the file's
// bytes, and blocks no segment touches are left alone.
TEST_P(SegmentFileTest, PartlyWrittenBlocksKeepTheirBytes) {
  const std::string path = Path("partial");
  std::string image = RandomBytes(100000, 21);
  {
    int fd = open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
    ASSERT_GE(fd, 0) << Errno();
    ASSERT_EQ(pwrite(fd, image.data(), image.size(), 0), static_cast<ssize_t>(image.size())) << Errno();
    ASSERT_EQ(close(fd), 0);
  }
  Segments s;
  for (auto [offset, length] : {std::pair<uint64_t, uint64_t>{5, 5}, {4090, 10}, {50000, 1}, {99990, 20}}) {
    s.Add(offset, length, offset + 1);
  }
  s.image.resize(100010);
  for (const spill_segment& seg : s.list) {
    if (image.size() < seg.file_offset + seg.length) image.resize(seg.file_offset + seg.length);
    image.replace(seg.file_offset, seg.length, static_cast<const char*>(seg.ptr), seg.length);
  }
  {
    FilePtr f = Open(path, SPILL_FILE_READ | SPILL_FILE_WRITE);
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(RunRequest(f.get(), s.list, true), 0) << spill_last_error();
    EXPECT_EQ(SizeOf(path), 100010u);
  }
  EXPECT_TRUE(ReadFile(path) == image);
}

// Several requests in flight at once on disjoint blocks, waited for in
// reverse order: the size is exact once the last is done.
TEST_P(SegmentFileTest, RequestsInFlightAtOnce) {
  const std::string path = Path("many");
  FilePtr f = Open(path, kCreate);
  ASSERT_NE(f, nullptr);
  std::vector<std::string> parts;
  std::string image;
  std::vector<spill_request*> requests;
  for (int i = 0; i < 4; ++i) {
    // Each part ends inside its last block; the next starts on a fresh block.
    const uint64_t offset = static_cast<uint64_t>(i) * 3 * kMiB;
    parts.push_back(RandomBytes(2 * kMiB + 1000 + i, 40 + i));
    image.resize(offset + parts.back().size(), '\0');
    image.replace(offset, parts.back().size(), parts.back());
    spill_segment seg{parts.back().data(), parts.back().size(), offset, -1};
    spill_request* r = nullptr;
    ASSERT_EQ(spill_file_write_segments(f.get(), &seg, 1, 0, &r), 0) << spill_last_error();
    requests.push_back(r);
  }
  // Still in flight (most likely): the handle stays open.
  const int closed = spill_file_close(f.get());
  if (closed == 0) {
    f.release();  // every request had finished its work already
  } else {
    EXPECT_EQ(closed, -EBUSY);
  }
  for (auto it = requests.rbegin(); it != requests.rend(); ++it) {
    ASSERT_EQ(spill_request_wait(*it, nullptr), 0) << spill_last_error();
  }
  if (f == nullptr) f = Open(path, SPILL_FILE_READ | SPILL_FILE_WRITE);
  EXPECT_EQ(SizeOf(path), image.size());
  EXPECT_TRUE(ReadFile(path) == image);
  ASSERT_EQ(spill_file_sync(f.get()), 0) << spill_last_error();
  ASSERT_EQ(spill_file_truncate(f.get(), 1000), 0) << spill_last_error();
  EXPECT_EQ(SizeOf(path), 1000u);
}

// Reads see every change: through the handle, and made elsewhere (on the
// direct path, a layout kept from an earlier read must not serve them).
TEST_P(SegmentFileTest, ReadsSeeChangesMadeElsewhere) {
  const std::string path = Path("changing");
  FilePtr f = Open(path, kCreate);
  ASSERT_NE(f, nullptr);
  std::string data = RandomBytes(3 * kMiB + 17, 60);
  ASSERT_EQ(RunRequest(f.get(), {spill_segment{data.data(), data.size(), 0, -1}}, true), 0) << spill_last_error();
  auto read_all = [&] {
    std::string back(data.size(), '\0');
    EXPECT_EQ(RunRequest(f.get(), {spill_segment{back.data(), back.size(), 0, -1}}, false), 0) << spill_last_error();
    return back;
  };
  EXPECT_TRUE(read_all() == data);
  EXPECT_TRUE(read_all() == data);  // a kept layout
  // Another writer, through the file system.
  std::string patch = RandomBytes(100000, 61);
  int fd = open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0) << Errno();
  ASSERT_EQ(pwrite(fd, patch.data(), patch.size(), 5000), static_cast<ssize_t>(patch.size())) << Errno();
  ASSERT_EQ(close(fd), 0);
  data.replace(5000, patch.size(), patch);
  EXPECT_TRUE(read_all() == data);
  // This handle.
  patch = RandomBytes(kMiB, 62);
  ASSERT_EQ(RunRequest(f.get(), {spill_segment{patch.data(), patch.size(), 2 * kMiB, -1}}, true), 0)
      << spill_last_error();
  data.replace(2 * kMiB, patch.size(), patch);
  EXPECT_TRUE(read_all() == data);
}

TEST_P(SegmentFileTest, BadRequestsAreRefused) {
  const std::string path = Path("bad");
  FilePtr f = Open(path, kCreate);
  ASSERT_NE(f, nullptr);
  std::string data = RandomBytes(10000, 5);
  ASSERT_EQ(RunRequest(f.get(), {spill_segment{data.data(), data.size(), 0, -1}}, true), 0) << spill_last_error();
  std::string out(100, '\0');
  spill_request* r = nullptr;
  spill_segment past{out.data(), out.size(), 9950, -1};
  EXPECT_EQ(RunRequest(f.get(), {past}, false), -ERANGE);
  EXPECT_NE(std::string(spill_last_error()).find("past its end"), std::string::npos) << spill_last_error();
  spill_segment overlapping[] = {{data.data(), 100, 0, -1}, {data.data(), 100, 50, -1}};
  EXPECT_EQ(spill_file_write_segments(f.get(), overlapping, 2, 0, &r), -EINVAL);
  spill_segment on_device{data.data(), 100, 0, 0};  // host memory given as device 0's
  const int rc = spill_file_write_segments(f.get(), &on_device, 1, 0, &r);
  EXPECT_TRUE(rc == -ENODEV || rc == -EINVAL) << rc << " " << spill_last_error();
  EXPECT_EQ(spill_file_open(Path("missing").c_str(), SPILL_FILE_READ, 0), nullptr);
  EXPECT_EQ(errno, ENOENT);
  EXPECT_EQ(spill_file_open(path.c_str(), SPILL_FILE_CREATE, 0), nullptr);
  EXPECT_EQ(errno, EINVAL);
  FilePtr reader = Open(path, SPILL_FILE_READ);
  ASSERT_NE(reader, nullptr);
  EXPECT_EQ(spill_file_write_segments(reader.get(), &past, 1, 0, &r), -EBADF);
  if (place_.volume() == nullptr) {
    std::vector<uint64_t> hashes(2, 0);
    uint8_t needed = 9;
    EXPECT_EQ(spill_file_dedup(f.get(), 0, hashes.data(), 1, &needed), -EOPNOTSUPP);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, SegmentFileTest,
                         ::testing::Values(Place::kSpillfsDirect, Place::kSpillfsMount, Place::kTmp, Place::kTmpfs,
                                           Place::kTmpfsBuffered),
                         PlaceName);

// ---- a full file system ----

// Writes more than fits; the request fails with ENOSPC.
void ExpectNoSpace(const std::string& path, uint64_t bytes) {
  FilePtr f = Open(path, kCreate);
  ASSERT_NE(f, nullptr);
  std::string data = RandomBytes(bytes, 9);
  EXPECT_EQ(RunRequest(f.get(), {spill_segment{data.data(), data.size(), 1, -1}}, true), -ENOSPC) << spill_last_error();
}

TEST(SegmentFileNoSpaceTest, FullSpillfsVolume) {
  if (geteuid() != 0) GTEST_SKIP() << "mounting a volume needs root";
  DefaultSettings();
  MountedVolume::Options options;
  options.size = "64M";
  MountedVolume volume(options);
  ExpectNoSpace(volume.Path("direct"), 96 * kMiB);
  ASSERT_EQ(spill_config_set("direct_path", 0), 0);
  ExpectNoSpace(volume.Path("mount"), 96 * kMiB);
  DefaultSettings();
}

TEST(SegmentFileNoSpaceTest, FullTmpfs) {
  if (geteuid() != 0) GTEST_SKIP() << "mounting a tmpfs needs root";
  DefaultSettings();
  char tmpl[] = "/tmp/spillfs-tmpfs-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  if (mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=2m") != 0) {
    rmdir(dir.c_str());
    GTEST_SKIP() << "cannot mount a tmpfs: " << Errno();
  }
  ExpectNoSpace(dir + "/full", 8 * kMiB);
  ASSERT_EQ(spill_config_set("o_direct", 0), 0);
  ExpectNoSpace(dir + "/full_buffered", 8 * kMiB);
  DefaultSettings();
  umount2(dir.c_str(), MNT_DETACH);
  rmdir(dir.c_str());
}

// ---- checkpoint dedup ----

nlohmann::json Stat(const MountedVolume& volume) {
  std::string output;
  EXPECT_EQ(RunSpillfs("stat --json " + volume.mountpoint(), &output), 0) << output;
  return nlohmann::json::parse(output);
}

std::vector<uint64_t> Hashes(const std::string& data) {
  std::vector<uint64_t> out(2 * (data.size() / kUnit));
  EXPECT_EQ(spill_hash_units(data.data(), data.size(), -1, 0, out.data()), 0) << spill_last_error();
  return out;
}

class SegmentDedupTest : public ::testing::TestWithParam<bool> {  // true: the direct path
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "mounting a volume (and the control file) needs root";
    DefaultSettings();
    ASSERT_EQ(spill_config_set("direct_path", GetParam() ? 1 : 0), 0);
    MountedVolume::Options options;
    options.size = "1G";
    volume_ = std::make_unique<MountedVolume>(options);
  }
  void TearDown() override { DefaultSettings(); }

  // Writes `data` (a checkpoint-like file: whole units, then a tail) to a
  // new file `name` after asking the daemon to map the units it holds; only
  // needed units are written. Returns needed[].
  std::vector<uint8_t> Save(const std::string& name, const std::string& data, const std::string& tail) {
    FilePtr f = Open(volume_->Path(name), kCreate);
    if (f == nullptr) return {};
    const size_t units = data.size() / kUnit;
    std::vector<uint64_t> hashes = Hashes(data);
    std::vector<uint8_t> needed(units, 7);
    EXPECT_EQ(spill_file_dedup(f.get(), 0, hashes.data(), units, needed.data()), 0) << spill_last_error();
    std::vector<spill_segment> segs;
    for (size_t i = 0; i < units; ++i) {
      if (needed[i] == 1)
        segs.push_back(spill_segment{const_cast<char*>(data.data()) + i * kUnit, kUnit, i * kUnit, -1});
    }
    segs.push_back(spill_segment{const_cast<char*>(tail.data()), tail.size(), data.size(), -1});
    EXPECT_EQ(RunRequest(f.get(), segs, true), 0) << spill_last_error();
    return needed;
  }

  // Unmounts the volume, which fsck then finds clean.
  void ExpectCleanAfterUnmount() {
    ASSERT_TRUE(volume_->Unmount());
    std::string output;
    EXPECT_EQ(RunSpillfs("fsck " + volume_->volume(), &output), 0) << output;
  }

  std::unique_ptr<MountedVolume> volume_;
};

TEST_P(SegmentDedupTest, SecondSaveMapsTheUnitsByReference) {
  const std::string data = RandomBytes(32 * kUnit, 11);
  const std::string tail = RandomBytes(1000, 12);
  std::vector<uint8_t> first = Save("step1", data, tail);
  ASSERT_EQ(first.size(), 32u);
  EXPECT_EQ(std::count(first.begin(), first.end(), 1), 32) << "a fresh volume holds none of these units";
  const uint64_t physical1 = Stat(*volume_)["physical_bytes"].get<uint64_t>();

  std::vector<uint8_t> second = Save("step2", data, tail);
  EXPECT_EQ(std::count(second.begin(), second.end(), 0), 32) << "every unit is the volume's already";
  const uint64_t physical2 = Stat(*volume_)["physical_bytes"].get<uint64_t>();
  EXPECT_LT(physical2 - physical1, 64 * kKiB) << physical1 << " then " << physical2;
  EXPECT_TRUE(ReadFile(volume_->Path("step2")) == data + tail);

  // One unit changed: only it is written.
  std::string changed = data;
  changed.replace(5 * kUnit + 100, 10, "0123456789");
  std::vector<uint8_t> third = Save("step3", changed, tail);
  ASSERT_EQ(third.size(), 32u);
  for (size_t i = 0; i < third.size(); ++i) EXPECT_EQ(third[i], i == 5 ? 1 : 0) << "unit " << i;
  const uint64_t physical3 = Stat(*volume_)["physical_bytes"].get<uint64_t>();
  EXPECT_LT(physical3 - physical2, kUnit + 64 * kKiB);
  EXPECT_TRUE(ReadFile(volume_->Path("step3")) == changed + tail);

  // Through the library too, on both paths of reading.
  {
    FilePtr f = Open(volume_->Path("step3"), SPILL_FILE_READ);
    ASSERT_NE(f, nullptr);
    std::string back(changed.size() + tail.size(), '\0');
    ASSERT_EQ(RunRequest(f.get(), {spill_segment{back.data(), back.size(), 0, -1}}, false), 0) << spill_last_error();
    EXPECT_TRUE(back == changed + tail);
  }
  // The shared units outlive the file they came from.
  ASSERT_EQ(unlink(volume_->Path("step1").c_str()), 0);
  ASSERT_TRUE(volume_->Remount());
  EXPECT_TRUE(ReadFile(volume_->Path("step2")) == data + tail);
  ExpectCleanAfterUnmount();
}

// Bytes of the range still in the RAM tier (written through the mount
// before the dedup, not flushed yet) never land on top of the units mapped.
TEST_P(SegmentDedupTest, CachedBytesOfTheRangeAreNotLeftOnTop) {
  const std::string data = RandomBytes(8 * kUnit, 13);
  Save("a", data, "");
  const std::string path = volume_->Path("b");
  int fd = open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  ASSERT_GE(fd, 0) << Errno();
  const std::string older = RandomBytes(8 * kUnit + 100, 14);
  ASSERT_EQ(pwrite(fd, older.data(), older.size(), 0), static_cast<ssize_t>(older.size())) << Errno();
  {
    FilePtr f = Open(path, SPILL_FILE_READ | SPILL_FILE_WRITE);
    ASSERT_NE(f, nullptr);
    std::vector<uint64_t> hashes = Hashes(data);
    std::vector<uint8_t> needed(8, 7);
    ASSERT_EQ(spill_file_dedup(f.get(), 0, hashes.data(), 8, needed.data()), 0) << spill_last_error();
    EXPECT_EQ(std::count(needed.begin(), needed.end(), 0), 8);
  }
  ASSERT_EQ(close(fd), 0);  // flushes what the tier still holds of the file
  EXPECT_TRUE(ReadFile(path) == data + older.substr(data.size()));
  ASSERT_TRUE(volume_->Remount());
  EXPECT_TRUE(ReadFile(path) == data + older.substr(data.size()));
}

TEST_P(SegmentDedupTest, MisalignedOffsetsAreRefused) {
  FilePtr f = Open(volume_->Path("f"), kCreate);
  ASSERT_NE(f, nullptr);
  std::vector<uint64_t> hashes(2, 1);
  uint8_t needed = 7;
  EXPECT_EQ(spill_file_dedup(f.get(), 4096, hashes.data(), 1, &needed), -EINVAL);
  EXPECT_EQ(needed, 7);
  // The daemon checks as well.
  int fd = open((volume_->mountpoint() + "/.spillfs/control").c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << Errno();
  std::string request = R"({"op":"dedup","path":"/f","file_offset":4096,"hashes":[1,2]})";
  ASSERT_EQ(pwrite(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size())) << Errno();
  std::string reply(4096, '\0');
  ssize_t n = pread(fd, reply.data(), reply.size(), 0);
  ASSERT_GT(n, 0) << Errno();
  close(fd);
  nlohmann::json parsed = nlohmann::json::parse(reply.substr(0, static_cast<size_t>(n)));
  EXPECT_FALSE(parsed["ok"].get<bool>()) << parsed.dump();
  EXPECT_EQ(parsed["errno"].get<int>(), EINVAL) << parsed.dump();
}

// spill_file_dedup_units: a checkpoint-like file of storages at scattered
// unit offsets, every unit asked about in one call; the file written around
// the mapped units (on the direct path: one request, whose scattered pieces
// go out in one ranged commit) reads back right. Bad offsets are refused by
// the library before anything is sent.
TEST_P(SegmentDedupTest, ScatteredUnitsInOneCall) {
  const std::string data = RandomBytes(12 * kUnit, 15);
  Save("base", data, "");
  const uint64_t physical1 = Stat(*volume_)["physical_bytes"].get<uint64_t>();
  // The file: unit k of data at offset 2k units plus a 4 KiB header before it;
  // unit 4 changed.
  std::string changed = data;
  changed.replace(4 * kUnit + 7, 5, "hello");
  FilePtr f = Open(volume_->Path("ckpt"), kCreate);
  ASSERT_NE(f, nullptr);
  std::vector<uint64_t> hashes = Hashes(changed), offsets;
  for (uint64_t k = 0; k < 12; ++k) offsets.push_back((2 * k + 1) * kUnit);
  std::vector<uint8_t> needed(12, 7);
  ASSERT_EQ(spill_file_dedup_units(f.get(), offsets.data(), hashes.data(), 12, needed.data()), 0) << spill_last_error();
  for (size_t k = 0; k < 12; ++k) EXPECT_EQ(needed[k], k == 4 ? 1 : 0) << "unit " << k;
  const std::string header = RandomBytes(4096, 16);
  std::vector<spill_segment> segs;
  std::string want(25 * kUnit, '\0');
  for (uint64_t k = 0; k < 12; ++k) {
    segs.push_back(spill_segment{const_cast<char*>(header.data()), header.size(), offsets[k] - 4096, -1});
    want.replace(offsets[k] - 4096, 4096, header);
    want.replace(offsets[k], kUnit, changed.substr(k * kUnit, kUnit));
    if (needed[k]) segs.push_back(spill_segment{changed.data() + k * kUnit, kUnit, offsets[k], -1});
  }
  segs.push_back(spill_segment{const_cast<char*>(header.data()), header.size(), 25 * kUnit - 4096, -1});
  want.replace(25 * kUnit - 4096, 4096, header);
  ASSERT_EQ(RunRequest(f.get(), segs, true), 0) << spill_last_error();
  f.reset();
  EXPECT_TRUE(ReadFile(volume_->Path("ckpt")) == want);
  const uint64_t physical2 = Stat(*volume_)["physical_bytes"].get<uint64_t>();
  EXPECT_LT(physical2 - physical1, kUnit + 13 * 4096 + 64 * kKiB) << physical1 << " then " << physical2;

  // Refused by the library, naming the unit; needed[] untouched.
  f = Open(volume_->Path("other"), kCreate);
  ASSERT_NE(f, nullptr);
  std::fill(needed.begin(), needed.end(), 7);
  std::vector<uint64_t> unsorted = {kUnit, 0}, repeated = {kUnit, kUnit}, unaligned = {0, kUnit + 4096};
  EXPECT_EQ(spill_file_dedup_units(f.get(), unsorted.data(), hashes.data(), 2, needed.data()), -EINVAL);
  EXPECT_NE(std::string(spill_last_error()).find("unit 1 at 0 comes after unit 0 at 262144"), std::string::npos)
      << spill_last_error();
  EXPECT_EQ(spill_file_dedup_units(f.get(), repeated.data(), hashes.data(), 2, needed.data()), -EINVAL);
  EXPECT_NE(std::string(spill_last_error()).find("repeats"), std::string::npos) << spill_last_error();
  EXPECT_EQ(spill_file_dedup_units(f.get(), unaligned.data(), hashes.data(), 2, needed.data()), -EINVAL);
  EXPECT_NE(std::string(spill_last_error()).find("unit 1 at file offset 266240"), std::string::npos)
      << spill_last_error();
  EXPECT_EQ(spill_file_dedup_units(f.get(), nullptr, hashes.data(), 2, needed.data()), -EFAULT);
  EXPECT_EQ(needed[0], 7);
  EXPECT_EQ(spill_file_dedup_units(f.get(), nullptr, nullptr, 0, nullptr), 0);
  struct stat st;
  ASSERT_EQ(stat(volume_->Path("other").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 0) << "nothing mapped";
  f.reset();
  ExpectCleanAfterUnmount();
}

// A save writes the units it knows are new while it asks about the others:
// a dedup request runs while write requests of other ranges of the same
// file are in flight (and a write whose last block is partial ends before
// or after it), repeatedly; every time the file reads back whole, at the
// size of the units mapped past the writes, and fsck finds the volume clean.
TEST_P(SegmentDedupTest, DedupWhileWritesOfOtherRangesAreInFlight) {
  const std::string data = RandomBytes(16 * kUnit, 21);
  Save("base", data, "");
  const std::vector<uint64_t> hashes = Hashes(data);
  const std::string fresh = RandomBytes(6 * kUnit + 100, 22);  // not the volume's; a partial last block
  for (int round = 0; round < 8; ++round) {
    const std::string name = "ckpt" + std::to_string(round);
    FilePtr f = Open(volume_->Path(name), kCreate);
    ASSERT_NE(f, nullptr);
    // The fresh bytes at [0, 6 units + 100), the base's units at [8, 24) units.
    std::vector<spill_segment> segs;
    for (uint64_t at = 0; at < fresh.size(); at += 2 * kUnit) {
      segs.push_back(
          spill_segment{const_cast<char*>(fresh.data()) + at, std::min(2 * kUnit, fresh.size() - at), at, -1});
    }
    std::vector<spill_request*> requests;
    for (const spill_segment& seg : segs) {  // one request a segment, all in flight
      spill_request* request = nullptr;
      ASSERT_EQ(spill_file_write_segments(f.get(), &seg, 1, 0, &request), 0) << spill_last_error();
      requests.push_back(request);
    }
    std::vector<uint64_t> offsets;
    for (uint64_t k = 0; k < 16; ++k) offsets.push_back((8 + k) * kUnit);
    std::vector<uint8_t> needed(16, 7);
    EXPECT_EQ(spill_file_dedup_units(f.get(), offsets.data(), hashes.data(), 16, needed.data()), 0)
        << spill_last_error();
    for (spill_request* request : requests) EXPECT_EQ(spill_request_wait(request, nullptr), 0) << spill_last_error();
    EXPECT_EQ(std::count(needed.begin(), needed.end(), 0), 16) << "round " << round;
    f.reset();
    std::string want(24 * kUnit, '\0');
    want.replace(0, fresh.size(), fresh);
    want.replace(8 * kUnit, data.size(), data);
    EXPECT_EQ(SizeOf(volume_->Path(name)), want.size()) << "round " << round;
    EXPECT_TRUE(ReadFile(volume_->Path(name)) == want) << "round " << round;
  }
  ExpectCleanAfterUnmount();
}

INSTANTIATE_TEST_SUITE_P(Paths, SegmentDedupTest, ::testing::Bool(), [](const ::testing::TestParamInfo<bool>& info) {
  return info.param ? "DirectPath" : "ThroughTheMount";
});

// A process that may not open the backing store gets the daemon's memory
// I/O: the bytes go through a memfd the daemon maps, spill_file_dedup asks
// for every unit (the daemon shares units by the hashes it computes as it
// writes), and a second file of the same bytes shares its whole units.
TEST(SegmentFileNotRootTest, GetsTheDaemonsMemoryIoWithDedup) {
  if (geteuid() != 0) GTEST_SKIP() << "mounting a volume needs root";
  DefaultSettings();
  MountedVolume::Options options;
  options.size = "1G";
  options.mount_options = "allow_other";  // for the child's uid
  MountedVolume volume(options);
  // The temporary directory above the mount point is root's only (mkdtemp).
  const std::string parent = std::filesystem::path(volume.mountpoint()).parent_path();
  ASSERT_EQ(chmod(parent.c_str(), 0755), 0) << Errno();
  ASSERT_EQ(chmod(volume.mountpoint().c_str(), 0755), 0) << Errno();
  const std::string dir = volume.Path("pub");
  ASSERT_EQ(mkdir(dir.c_str(), 0777), 0) << Errno();
  ASSERT_EQ(chmod(dir.c_str(), 0777), 0) << Errno();
  const std::string data = RandomBytes(kMiB + 5, 70);
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child's verdict: backend, write rc, dedup rc and needed, read-back
    // equality, the second file's shared and written bytes.
    int result[7] = {-1, -1, -1, -1, -1, -1, -1};
    if (setgroups(0, nullptr) == 0 && setgid(65534) == 0 && setuid(65534) == 0) {
      spill_file* f = spill_file_open((dir + "/f").c_str(), kCreate, 0);
      if (f != nullptr) {
        result[0] = spill_file_backend(f);
        spill_segment seg{const_cast<char*>(data.data()), data.size(), 3, -1};
        spill_request* r = nullptr;
        result[1] = spill_file_write_segments(f, &seg, 1, 0, &r);
        if (result[1] == 0) result[1] = spill_request_wait(r, nullptr);
        std::vector<uint64_t> hashes(2, 0);
        uint8_t needed = 9;
        result[2] = spill_file_dedup(f, 0, hashes.data(), 1, &needed);
        result[3] = needed;
        std::string back(data.size(), '\0');
        spill_segment rd{back.data(), back.size(), 3, -1};
        if (spill_file_read_segments(f, &rd, 1, 0, &r) == 0 && spill_request_wait(r, nullptr) == 0) {
          result[4] = back == data ? 1 : 0;
        }
        spill_file_close(f);
        spill_file* g = spill_file_open((dir + "/g").c_str(), kCreate, 0);
        spill_io_stats stats{};
        if (g != nullptr && spill_file_write_segments(g, &seg, 1, 0, &r) == 0 && spill_request_wait(r, &stats) == 0) {
          result[5] = static_cast<int>(stats.shared_bytes / 4096);
          result[6] = static_cast<int>(stats.io_bytes / 4096);
        }
        spill_file_close(g);
      } else {
        fprintf(stderr, "open as uid 65534: %s\n", spill_last_error());
      }
    }
    ssize_t ignored = write(fds[1], result, sizeof(result));
    (void)ignored;
    _exit(0);
  }
  close(fds[1]);
  int result[7] = {-2, -2, -2, -2, -2, -2, -2};
  EXPECT_EQ(read(fds[0], result, sizeof(result)), static_cast<ssize_t>(sizeof(result)));
  close(fds[0]);
  waitpid(pid, nullptr, 0);
  EXPECT_EQ(result[0], SPILL_BACKEND_MEMORY_IO);
  EXPECT_EQ(result[1], 0);
  EXPECT_EQ(result[2], 0);
  EXPECT_EQ(result[3], 1);  // write it: nothing is mapped by a hash the caller names
  EXPECT_EQ(result[4], 1);
  EXPECT_EQ(SizeOf(dir + "/f"), data.size() + 3);
  EXPECT_EQ(SizeOf(dir + "/g"), data.size() + 3);
  EXPECT_EQ(result[5], 4 * 64);  // the 4 whole units of [0, 1 MiB + 8) shared
  EXPECT_EQ(result[6], 1);       // the last, partial block written
}

// Memory I/O from many requests at once over a staging pool of eight
// buffers: a request takes a step's buffers only as the pool has them free,
// and waits for one only while it holds none (its steps sent give theirs
// back), so requests never wait for each other for ever. A hung child is
// killed by its alarm and the test fails.
TEST(SegmentFileNotRootTest, ManyMemoryIoRequestsShareASmallStagingPool) {
  if (geteuid() != 0) GTEST_SKIP() << "mounting a volume needs root";
  DefaultSettings();
  MountedVolume::Options options;
  options.size = "1G";
  options.mount_options = "allow_other";  // for the child's uid
  MountedVolume volume(options);
  const std::string parent = std::filesystem::path(volume.mountpoint()).parent_path();
  ASSERT_EQ(chmod(parent.c_str(), 0755), 0) << Errno();
  ASSERT_EQ(chmod(volume.mountpoint().c_str(), 0755), 0) << Errno();
  const std::string dir = volume.Path("pub");
  ASSERT_EQ(mkdir(dir.c_str(), 0777), 0) << Errno();
  ASSERT_EQ(chmod(dir.c_str(), 0777), 0) << Errno();
  constexpr int kRequests = 8;
  std::vector<std::string> data;
  for (int k = 0; k < kRequests; ++k) data.push_back(RandomBytes(4 * kMiB + 17 * k, 80 + k));
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(120);
    // 0: all written and read back equal; else the step that failed.
    int status = 1;
    if (setgroups(0, nullptr) == 0 && setgid(65534) == 0 && setuid(65534) == 0 &&
        spill_config_set("chunk_bytes", kUnit) == 0 && spill_config_set("pinned_bytes", 8 * kUnit) == 0 &&
        spill_config_set("commit_depth", 3) == 0) {
      status = 2;
      std::vector<spill_file*> files(kRequests, nullptr);
      std::vector<spill_request*> requests(kRequests, nullptr);
      std::vector<std::string> back(kRequests);
      bool ok = true;
      for (int k = 0; k < kRequests && ok; ++k) {
        files[k] = spill_file_open((dir + "/f" + std::to_string(k)).c_str(), kCreate, 0);
        ok = files[k] != nullptr && spill_file_backend(files[k]) == SPILL_BACKEND_MEMORY_IO;
      }
      for (int k = 0; k < kRequests && ok; ++k) {
        spill_segment seg{data[k].data(), data[k].size(), 0, -1};
        ok = spill_file_write_segments(files[k], &seg, 1, 0, &requests[k]) == 0;
      }
      for (int k = 0; k < kRequests && ok; ++k) ok = spill_request_wait(requests[k], nullptr) == 0;
      if (ok) status = 3;
      for (int k = 0; k < kRequests && ok; ++k) {
        back[k].assign(data[k].size(), '\0');
        spill_segment seg{back[k].data(), back[k].size(), 0, -1};
        ok = spill_file_read_segments(files[k], &seg, 1, 0, &requests[k]) == 0;
      }
      for (int k = 0; k < kRequests && ok; ++k)
        ok = spill_request_wait(requests[k], nullptr) == 0 && back[k] == data[k];
      if (ok) status = 0;
      if (!ok) fprintf(stderr, "memory I/O child: %s\n", spill_last_error());
      for (spill_file* f : files) spill_file_close(f);
    }
    _exit(status);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child hung (killed by its alarm) or crashed: signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: settings, 2: open or write, 3: read";
}

TEST(SegmentDedupOffTest, VolumeWithoutDedupAnswersEopnotsupp) {
  if (geteuid() != 0) GTEST_SKIP() << "mounting a volume needs root";
  DefaultSettings();
  MountedVolume::Options options;
  options.size = "1G";
  options.mkfs_args = "--no-dedup";
  MountedVolume volume(options);
  FilePtr f = Open(volume.Path("f"), kCreate);
  ASSERT_NE(f, nullptr);
  std::vector<uint64_t> hashes(2, 1);
  uint8_t needed = 7;
  EXPECT_EQ(spill_file_dedup(f.get(), 0, hashes.data(), 1, &needed), -EOPNOTSUPP) << spill_last_error();
}

TEST(SpillHashUnitsTest, EqualsTheDaemonsHashAndSkipsAPartialUnit) {
  const std::string data = RandomBytes(3 * kUnit + 5, 3);
  std::vector<uint64_t> out(8, 0);
  ASSERT_EQ(spill_hash_units(data.data(), data.size(), -1, 0, out.data()), 0) << spill_last_error();
  // Unit 1 hashed alone equals unit 1 of the whole.
  std::vector<uint64_t> one(2, 0);
  ASSERT_EQ(spill_hash_units(data.data() + kUnit, kUnit, -1, 0, one.data()), 0);
  EXPECT_EQ(one[0], out[2]);
  EXPECT_EQ(one[1], out[3]);
  EXPECT_EQ(out[6], 0u);  // no fourth unit
  EXPECT_NE(out[0], out[2]);
  const int rc = spill_hash_units(data.data(), data.size(), 0, 0, out.data());  // host memory as device 0's
  EXPECT_TRUE(rc == -ENODEV || rc == -EINVAL) << rc;
  EXPECT_STREQ(spill_version(), "0.1.0");
  EXPECT_EQ(spill_config_set("no such setting", 1), -EINVAL);
}

}  // namespace
}  // namespace spillfs::testing
