// Unit tests of volumes (spillfs/store/volume.h, store/volume.cc): create and
// its refusals, the volume lock, and open refusing a second holder or a
// mismatched data area.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "filesystem_fixture.h"
#include "support/temp_dir.h"

namespace spillfs {
namespace {

using testing::TempDir;

Volume::CreateOptions SizedOptions(uint64_t size, bool force = false) {
  Volume::CreateOptions options;
  options.size = size;
  options.force = force;
  return options;
}

// spillfs mount takes the volume lock, then forks the daemon, whose
// Volume::Open takes it over: the volume stays locked throughout, and is free
// again once the volume is closed.
TEST(VolumeLockTest, OpenTakesOverAHeldLock) {
  TempDir dir("spillfs-volume-lock-test");
  const std::string vol = dir.path() + "/vol";
  ASSERT_TRUE(Volume::Create(vol, SizedOptions(64 << 20)).ok());
  auto lock = LockVolume(vol);
  ASSERT_TRUE(lock.ok()) << lock.status().ToString();
  {
    auto volume = Volume::Open(vol, {.lock_fd = *lock});
    ASSERT_TRUE(volume.ok()) << volume.status().ToString();
    EXPECT_EQ(LockVolume(vol).status().code(), EBUSY);
  }
  auto again = LockVolume(vol);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  close(*again);
}

TEST_F(FilesystemTest, SecondOpenOfAVolumeIsRefusedWhileItIsOpen) {
  auto second = Volume::Open(vol_, Volume::OpenOptions{});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), EBUSY) << second.status().ToString();
  auto read_only = Volume::Open(vol_, Volume::OpenOptions{.read_only = true});
  ASSERT_FALSE(read_only.ok());
  EXPECT_EQ(read_only.status().code(), EBUSY);
  // The first holder is unaffected.
  InodeNumber ino = MakeFile(kRootInode, "still-works");
  WriteAt(ino, 0, "yes");
  EXPECT_TRUE(SameBytes(ReadAll(ino), "yes"));

  fs_.reset();
  auto now = Volume::Open(vol_, Volume::OpenOptions{});
  ASSERT_TRUE(now.ok()) << now.status().ToString();
  EXPECT_EQ(now->get()->superblock().data_size, kVolumeSize);
}

TEST_F(FilesystemTest, VolumeOpenRefusesIndexAndDataOfDifferentVolumes) {
  std::string a = dir_.path() + "/a", b = dir_.path() + "/b";
  auto sa = Volume::Create(a, SizedOptions(Volume::kMinimumSize));
  auto sb = Volume::Create(b, SizedOptions(Volume::kMinimumSize));
  ASSERT_TRUE(sa.ok());
  ASSERT_TRUE(sb.ok());
  ASSERT_NE(sa->uuid, sb->uuid);
  ASSERT_TRUE(Volume::Open(a, {}).ok());  // (closed again at once)

  const auto copy = std::filesystem::copy_options::overwrite_existing;
  std::filesystem::copy_file(Volume::ImagePath(a), dir_.path() + "/a-data.img");
  std::filesystem::copy_file(Volume::ImagePath(b), Volume::ImagePath(a), copy);
  {
    auto mixed = Volume::Open(a, {});
    ASSERT_FALSE(mixed.ok()) << "a volume opened with another volume's data area";
    EXPECT_EQ(mixed.status().code(), EUCLEAN) << mixed.status().ToString();
    EXPECT_NE(mixed.status().message().find("different volumes"), std::string::npos) << mixed.status().ToString();
  }
  // With its own data area back, a opens again: the refusal left no lock behind.
  std::filesystem::copy_file(dir_.path() + "/a-data.img", Volume::ImagePath(a), copy);
  EXPECT_TRUE(Volume::Open(a, {}).ok());
  EXPECT_TRUE(Volume::Open(b, {}).ok());

  // A data area with no superblock at all.
  int fd = open(Volume::ImagePath(a).c_str(), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  std::string zeros(kBlock, '\0');
  ASSERT_EQ(pwrite(fd, zeros.data(), zeros.size(), 0), static_cast<ssize_t>(zeros.size()));
  close(fd);
  EXPECT_FALSE(Volume::Open(a, {}).ok());

  // Not a volume at all.
  EXPECT_EQ(Volume::Open(dir_.path() + "/nothing", {}).status().code(), ENOENT);
  std::filesystem::create_directory(dir_.path() + "/empty");
  EXPECT_EQ(Volume::Open(dir_.path() + "/empty", {}).status().code(), EINVAL);
}

TEST_F(FilesystemTest, VolumeCreateRefusals) {
  EXPECT_TRUE(Volume::Exists(vol_));
  fs_.reset();
  auto again = Volume::Create(vol_, SizedOptions(kVolumeSize));
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), EEXIST);
  auto small = Volume::Create(dir_.path() + "/small", SizedOptions(Volume::kMinimumSize - kBlock));
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.status().code(), EINVAL);

  // --force replaces the volume with an empty one.
  OpenFs();
  MakeFile(kRootInode, "old");
  auto uuid = fs_->volume().superblock().uuid;
  EXPECT_EQ(Volume::Create(vol_, SizedOptions(kVolumeSize, /*force=*/true)).status().code(), EBUSY)
      << "a volume in use was replaced";
  fs_.reset();
  auto forced = Volume::Create(vol_, SizedOptions(kVolumeSize, /*force=*/true));
  ASSERT_TRUE(forced.ok()) << forced.status().ToString();
  EXPECT_NE(forced->uuid, uuid);
  OpenFs();
  EXPECT_EQ(LookupErr(kRootInode, "old"), ENOENT);
  EXPECT_EQ(FreeBlocks(), initial_free_);
}

}  // namespace
}  // namespace spillfs
