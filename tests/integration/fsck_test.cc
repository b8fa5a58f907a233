// `spillfs fsck` against real volumes: clean after mkfs and after a busy
// workload; refused while mounted; silent data corruption injected into the
// data area under known extents is refused by reads (EIO) and named, file and
// offset, by `fsck --scrub`; damaged index files, superblocks and data areas
// get a clear refusal from mount and from fsck (exit 2), never a crash, and
// harm nothing once put back.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "support/mounted_volume.h"
#include "support/random_bytes.h"
#include "support/run_fsck.h"

namespace spillfs::testing {
namespace {

constexpr uint64_t kBlock = 4096;
constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * 1024;

bool WriteFile(const std::string& path, const std::string& data) {
  int fd = open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  if (fd < 0) return false;
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  return close(fd) == 0 && done == data.size();
}

// Reads `length` bytes at `offset`; returns the errno of a failed read (0 on success).
int ReadRange(const std::string& path, uint64_t offset, size_t length, std::string* out) {
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return errno;
  out->assign(length, '\0');
  size_t done = 0;
  int error = 0;
  while (done < length) {
    ssize_t n = pread(fd, out->data() + done, length - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      error = errno;
      break;
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  out->resize(done);
  close(fd);
  return error;
}

std::string Problems(const FsckResult& fsck) {
  if (!fsck.report.is_object()) return fsck.output;
  std::string text;
  for (const auto& p : fsck.report["problems"]) text += "\n  " + p.value("kind", "?") + ": " + p.value("message", "");
  return text;
}

// Copies a file byte for byte (to put a damaged one back).
inline void CopyFile(const std::string& from, const std::string& to) {
  std::filesystem::copy_file(from, to, std::filesystem::copy_options::overwrite_existing);
}

void PatchFile(const std::string& path, uint64_t offset, const std::string& bytes) {
  int fd = open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0) << path << ": " << strerror(errno);
  ASSERT_EQ(pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(offset)), static_cast<ssize_t>(bytes.size()));
  ASSERT_EQ(fsync(fd), 0);
  close(fd);
}

TEST(FsckTest, FreshVolumeIsClean) {
  MountedVolume volume;
  std::string error;
  ASSERT_TRUE(volume.Unmount(&error)) << error;
  FsckResult fsck = RunFsck(volume.volume(), "--scrub");
  ASSERT_EQ(fsck.rc, 0) << fsck.output;
  ASSERT_TRUE(fsck.report.is_object()) << fsck.output;
  EXPECT_TRUE(fsck.report["clean"].get<bool>());
  EXPECT_EQ(fsck.report["counters"]["inodes"], 1);
  EXPECT_EQ(fsck.report["problems"].size(), 0u);
  // The human form: one summary line that says clean.
  FsckResult human = RunFsck(volume.volume(), "", /*json=*/false);
  EXPECT_EQ(human.rc, 0);
  EXPECT_NE(human.output.find("clean"), std::string::npos) << human.output;
  EXPECT_EQ(std::count(human.output.begin(), human.output.end(), '\n'), 1) << human.output;
}

TEST(FsckTest, MountedVolumeIsRefusedWithExit2) {
  MountedVolume volume;
  FsckResult fsck = RunFsck(volume.volume(), "", false);
  EXPECT_EQ(fsck.rc, 2) << fsck.output;
  EXPECT_NE(fsck.output.find("mounted"), std::string::npos) << fsck.output;
  fsck = RunFsck(volume.volume(), "--repair", false);
  EXPECT_EQ(fsck.rc, 2) << fsck.output;
  // Not a volume at all.
  fsck = RunFsck(volume.mountpoint() + "/..", "", false);
  EXPECT_EQ(fsck.rc, 2) << fsck.output;
  EXPECT_NE(fsck.output.find("not a spillfs volume"), std::string::npos) << fsck.output;
  fsck = RunFsck("/nonexistent/volume", "", false);
  EXPECT_EQ(fsck.rc, 2) << fsck.output;
}

TEST(FsckTest, CleanAfterABusyWorkload) {
  MountedVolume volume;
  // Four threads, each in its own directory, plus shared renames into one.
  ASSERT_EQ(mkdir(volume.Path("shared").c_str(), 0755), 0);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(1000 + t);
      std::string dir = volume.Path("t" + std::to_string(t));
      if (mkdir(dir.c_str(), 0755) != 0) ++failures;
      for (int i = 0; i < 150; ++i) {
        std::string path = dir + "/f" + std::to_string(i % 25);
        size_t size = rng() % (i % 10 == 0 ? 3 * kMiB : 40 * kKiB);
        if (!WriteFile(path, RandomBytes(size, rng()))) ++failures;
        switch (rng() % 8) {
          case 0:
            unlink(path.c_str());
            break;
          case 1:
            rename(path.c_str(), (volume.Path("shared") + "/s" + std::to_string(rng() % 16)).c_str());
            break;
          case 2:
            truncate(path.c_str(), static_cast<off_t>(rng() % (size + 1)));
            break;
          case 3: {
            int fd = open(path.c_str(), O_WRONLY);
            if (fd >= 0) {
              fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 4096, 16384);
              fallocate(fd, FALLOC_FL_KEEP_SIZE, static_cast<off_t>(size), 65536);
              fsync(fd);
              close(fd);
            }
            break;
          }
          case 4:
            link(path.c_str(), (path + ".link" + std::to_string(i)).c_str());
            break;
          case 5:
            symlink("target", (path + ".sym" + std::to_string(i)).c_str());
            setxattr(path.c_str(), "user.test", "value", 5, 0);
            break;
          case 6: {
            std::string sub = dir + "/sub" + std::to_string(i % 5);
            mkdir(sub.c_str(), 0755);
            rename(path.c_str(), (sub + "/moved").c_str());
            if (i % 7 == 0) rmdir(sub.c_str());  // fails while not empty: fine
            break;
          }
          default:
            break;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  // A file unlinked while open is reclaimed at its last close, before umount.
  int held = open(volume.Path("held").c_str(), O_CREAT | O_RDWR, 0644);
  ASSERT_GE(held, 0);
  ASSERT_EQ(write(held, "x", 1), 1);
  ASSERT_EQ(unlink(volume.Path("held").c_str()), 0);
  close(held);

  std::string error;
  ASSERT_TRUE(volume.Unmount(&error)) << error;
  FsckResult fsck = RunFsck(volume.volume(), "--scrub");
  ASSERT_EQ(fsck.rc, 0) << Problems(fsck);
  EXPECT_GT(fsck.report["counters"]["files"].get<uint64_t>(), 20u);
  EXPECT_GT(fsck.report["counters"]["bytes_scrubbed"].get<uint64_t>(), 4 * kMiB);
  EXPECT_EQ(
      fsck.report["counters"]["bytes_mapped"].get<uint64_t>() + fsck.report["counters"]["bytes_free"].get<uint64_t>(),
      fsck.report["counters"]["data_area_bytes"].get<uint64_t>());
  // --repair on a clean volume changes nothing and exits 0.
  EXPECT_EQ(RunFsck(volume.volume(), "--repair").rc, 0);
  ASSERT_TRUE(volume.Mount(&error)) << error;
}

// One injected corruption: which file, which block.
struct Injection {
  std::string path;  // in the volume, "/name"
  uint64_t file_offset = 0;
  uint64_t physical = 0;
  bool seen_by_read = false;
  bool seen_by_scrub = false;
};

TEST(FsckTest, CorruptBlocksGiveEioAndScrubNamesFileAndOffset) {
  MountedVolume volume;
  ASSERT_EQ(mkdir(volume.Path("dir").c_str(), 0755), 0);
  // Files of several sizes, each with a known content.
  std::map<std::string, std::string> contents;
  std::mt19937_64 rng(20240601);
  for (int i = 0; i < 10; ++i) {
    size_t size = (i % 3 == 0 ? 2 * kMiB : 40 * kKiB) + rng() % (300 * kKiB);
    std::string path = (i % 2 ? "/dir/file" : "/file") + std::to_string(i);
    contents[path] = RandomBytes(size, rng());
    ASSERT_TRUE(WriteFile(volume.Path(path.substr(1)), contents[path])) << path;
  }
  std::string error;
  ASSERT_TRUE(volume.Unmount(&error)) << error;

  // Find each file's extents with fsck itself, then flip a byte in one block.
  FsckResult listing = RunFsck(volume.volume(), "--list-extents");
  ASSERT_EQ(listing.rc, 0) << listing.output;
  std::vector<Injection> injected;
  std::string image = volume.volume() + "/data.img";
  for (const auto& file : listing.report["files"]) {
    std::string path = file["path"];
    if (contents.count(path) == 0) continue;
    const auto& extents = file["extents"];
    ASSERT_FALSE(extents.empty()) << path;
    const auto& extent = extents[rng() % extents.size()];
    uint64_t blocks = extent["length"].get<uint64_t>() / kBlock;
    uint64_t block = rng() % blocks;
    // Stay inside the file's size so a read can reach the block.
    uint64_t file_offset = extent["file_offset"].get<uint64_t>() + block * kBlock;
    if (file_offset >= contents[path].size()) file_offset = extent["file_offset"].get<uint64_t>(), block = 0;
    Injection inj{path, file_offset, extent["physical"].get<uint64_t>() + block * kBlock};
    uint64_t within = rng() % std::min<uint64_t>(kBlock, contents[path].size() - file_offset);
    std::string byte(1, static_cast<char>(contents[path][file_offset + within] ^ 0x40));
    PatchFile(image, inj.physical + within, byte);
    injected.push_back(inj);
  }
  ASSERT_EQ(injected.size(), contents.size());

  // Without --scrub the index is consistent; with it, every block is named.
  EXPECT_EQ(RunFsck(volume.volume(), "").rc, 0);
  FsckResult scrub = RunFsck(volume.volume(), "--scrub");
  EXPECT_EQ(scrub.rc, 1) << scrub.output;
  ASSERT_TRUE(scrub.report.is_object()) << scrub.output;
  for (const auto& p : scrub.report["problems"]) {
    EXPECT_EQ(p["kind"], "checksum-mismatch") << p.dump();
    for (Injection& inj : injected) {
      if (p.value("path", "") == inj.path && p.value("file_offset", UINT64_MAX) == inj.file_offset &&
          p.value("physical", UINT64_MAX) == inj.physical) {
        inj.seen_by_scrub = true;
      }
    }
  }
  // The human form names the path and the offset too.
  FsckResult human = RunFsck(volume.volume(), "--scrub", false);
  EXPECT_EQ(human.rc, 1);
  EXPECT_NE(human.output.find(injected[0].path), std::string::npos) << human.output;
  EXPECT_NE(human.output.find("file offset " + std::to_string(injected[0].file_offset)), std::string::npos)
      << human.output;

  // Reads of the damaged blocks fail with EIO; the rest of each file is intact.
  ASSERT_TRUE(volume.Mount(&error)) << error;
  for (Injection& inj : injected) {
    std::string data;
    int e = ReadRange(volume.Path(inj.path.substr(1)), inj.file_offset, kBlock, &data);
    inj.seen_by_read = e == EIO;
    EXPECT_EQ(e, EIO) << inj.path << " at " << inj.file_offset << " read " << data.size() << " bytes";
    const std::string& expected = contents[inj.path];
    uint64_t other = inj.file_offset >= kBlock ? 0 : 2 * kBlock;
    if (other + kBlock <= expected.size()) {
      EXPECT_EQ(ReadRange(volume.Path(inj.path.substr(1)), other, kBlock, &data), 0);
      EXPECT_TRUE(data == expected.substr(other, kBlock)) << inj.path << " at " << other;
    }
  }
  ASSERT_TRUE(volume.Unmount(&error)) << error;
  // Repair cannot make those bytes right, and says so.
  FsckResult repair = RunFsck(volume.volume(), "--repair --scrub");
  EXPECT_EQ(repair.rc, 1) << repair.output;

  int by_scrub = 0, by_read = 0;
  for (const Injection& inj : injected) {
    EXPECT_TRUE(inj.seen_by_scrub) << "fsck --scrub did not name " << inj.path << " at " << inj.file_offset;
    by_scrub += inj.seen_by_scrub;
    by_read += inj.seen_by_read;
  }
  fprintf(stderr, "fsck test: corruptions injected %zu, detected by scrub %d, by read (EIO) %d\n", injected.size(),
          by_scrub, by_read);
  RecordProperty("corruptions_injected", static_cast<int>(injected.size()));
  RecordProperty("corruptions_detected_by_scrub", by_scrub);
  RecordProperty("corruptions_detected_by_read", by_read);
}

// A damaged volume: mount must refuse with a message, fsck must exit 2 with
// one, neither may crash; with the damage undone everything is still there.
class DamagedVolumeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    volume_ = std::make_unique<MountedVolume>();
    data_ = RandomBytes(300 * kKiB, 77);
    ASSERT_TRUE(WriteFile(volume_->Path("keep"), data_));
    std::string error;
    ASSERT_TRUE(volume_->Unmount(&error)) << error;
    // What the tests damage: the index files and block 0 of the data area.
    backup_ = volume_->volume() + ".backup";
    std::filesystem::create_directories(backup_);
    std::filesystem::copy(volume_->volume() + "/index", backup_ + "/index", std::filesystem::copy_options::recursive);
    ASSERT_EQ(ReadRange(Image(), 0, kBlock, &block0_), 0);
    image_size_ = std::filesystem::file_size(Image());
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(backup_, ec);
  }

  void ExpectRefused(const std::string& what, const std::string& message_part) {
    SCOPED_TRACE(what);
    std::string output;
    int rc = RunSpillfs("mount " + volume_->volume() + " " + volume_->mountpoint(), &output);
    EXPECT_GT(rc, 0) << "mount of a volume with " << what << " did not fail cleanly: " << output;
    EXPECT_NE(output.find("spillfs mount:"), std::string::npos) << output;
    if (!message_part.empty()) {
      EXPECT_NE(output.find(message_part), std::string::npos) << output;
    }
    if (rc == 0) RunSpillfs("umount " + volume_->mountpoint());
    FsckResult fsck = RunFsck(volume_->volume(), "", false);
    EXPECT_EQ(fsck.rc, 2) << "fsck of a volume with " << what << ": " << fsck.output;
    EXPECT_NE(fsck.output.find("spillfs fsck:"), std::string::npos) << fsck.output;
    if (!message_part.empty()) {
      EXPECT_NE(fsck.output.find(message_part), std::string::npos) << fsck.output;
    }
    fsck = RunFsck(volume_->volume(), "--repair", false);
    EXPECT_EQ(fsck.rc, 2) << "fsck --repair of a volume with " << what << ": " << fsck.output;
    fprintf(stderr, "refusal of %s: %s", what.c_str(), output.c_str());
  }

  void RestoreIndexFile(const std::string& name) {
    CopyFile(backup_ + "/index/" + name, volume_->volume() + "/index/" + name);
  }
  void RestoreImage() {
    ASSERT_EQ(truncate(Image().c_str(), static_cast<off_t>(image_size_)), 0);
    PatchFile(Image(), 0, block0_);
  }
  // Expects a clean volume that still holds its data.
  void ExpectIntact() {
    FsckResult fsck = RunFsck(volume_->volume(), "--scrub");
    EXPECT_EQ(fsck.rc, 0) << Problems(fsck);
    std::string error;
    ASSERT_TRUE(volume_->Mount(&error)) << error;
    std::string data;
    EXPECT_EQ(ReadRange(volume_->Path("keep"), 0, data_.size(), &data), 0);
    EXPECT_TRUE(data == data_);
  }

  std::string Image() const { return volume_->volume() + "/data.img"; }

  std::unique_ptr<MountedVolume> volume_;
  std::string data_;
  std::string backup_;
  std::string block0_;
  uint64_t image_size_ = 0;
};

TEST_F(DamagedVolumeTest, TruncatedIndexCurrentFile) {
  ASSERT_EQ(truncate((volume_->volume() + "/index/CURRENT").c_str(), 0), 0);
  ExpectRefused("an empty index/CURRENT", "index");
  RestoreIndexFile("CURRENT");
  ExpectIntact();
}

TEST_F(DamagedVolumeTest, GarbageIndexCurrentFile) {
  PatchFile(volume_->volume() + "/index/CURRENT", 0, "MANIFEST-999999\n");
  ExpectRefused("index/CURRENT naming a missing manifest", "index");
  RestoreIndexFile("CURRENT");
  ExpectIntact();
}

TEST_F(DamagedVolumeTest, GarbageIndexManifest) {
  std::string manifest;
  for (const auto& entry : std::filesystem::directory_iterator(volume_->volume() + "/index")) {
    if (entry.path().filename().string().rfind("MANIFEST-", 0) == 0) manifest = entry.path().filename();
  }
  ASSERT_FALSE(manifest.empty());
  uint64_t size = std::filesystem::file_size(volume_->volume() + "/index/" + manifest);
  PatchFile(volume_->volume() + "/index/" + manifest, 0, RandomBytes(size, 5));
  ExpectRefused("a garbage index manifest", "index");
  RestoreIndexFile(manifest);
  ExpectIntact();
}

TEST_F(DamagedVolumeTest, ZeroedSuperblockBlock) {
  PatchFile(Image(), 0, std::string(kBlock, '\0'));
  ExpectRefused("a zeroed superblock", "superblock");
  RestoreImage();
  ExpectIntact();
}

TEST_F(DamagedVolumeTest, GarbageSuperblockBlock) {
  // The magic is kept and the rest is random: decoding must not crash.
  std::string block = RandomBytes(kBlock, 6);
  block.replace(0, 4, block0_.substr(0, 4));
  PatchFile(Image(), 0, block);
  ExpectRefused("a garbage superblock", "superblock");
  RestoreImage();
  ExpectIntact();
}

TEST_F(DamagedVolumeTest, SuperblockOfAnotherVolume) {
  MountedVolume other;
  std::string error;
  ASSERT_TRUE(other.Unmount(&error)) << error;
  std::string block;
  ASSERT_EQ(ReadRange(other.volume() + "/data.img", 0, kBlock, &block), 0);
  PatchFile(Image(), 0, block);
  ExpectRefused("the superblock of another volume", "different volumes");
  RestoreImage();
  ExpectIntact();
}

TEST_F(DamagedVolumeTest, TruncatedDataArea) {
  ASSERT_EQ(truncate(Image().c_str(), 64 * kMiB), 0);
  ExpectRefused("a truncated data area", "bytes");
  RestoreImage();  // the data lies in the first MiBs: putting the size back is enough
  ExpectIntact();
}

TEST_F(DamagedVolumeTest, MissingIndexDirectory) {
  std::filesystem::rename(volume_->volume() + "/index", volume_->volume() + "/index.moved");
  ExpectRefused("no index", "not a spillfs volume");
  std::filesystem::rename(volume_->volume() + "/index.moved", volume_->volume() + "/index");
  ExpectIntact();
}

}  // namespace
}  // namespace spillfs::testing
