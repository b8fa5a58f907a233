// Dedup through a real mount: identical data flushed from the RAM tier is
// stored once, shared data survives changes to any one copy, and space comes
// back only with the last reference.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "support/mounted_volume.h"
#include "support/random_bytes.h"

namespace spillfs::testing {
namespace {

constexpr size_t kFileBytes = 8 << 20;  // 32 dedup units of 256 KiB

void WriteFile(const std::string& path, const std::string& data) {
  int fd = open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(pwrite(fd, data.data(), data.size(), 0), static_cast<ssize_t>(data.size()));
  ASSERT_EQ(close(fd), 0);  // close flushes the RAM tier (not ephemeral)
}

std::string ReadFile(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return "<missing>";
  std::string out(kFileBytes * 2, '\0');
  ssize_t n = pread(fd, out.data(), out.size(), 0);
  close(fd);
  out.resize(n < 0 ? 0 : static_cast<size_t>(n));
  return out;
}

nlohmann::json Stat(const MountedVolume& volume) {
  std::string output;
  EXPECT_EQ(RunSpillfs("stat --json " + volume.mountpoint(), &output), 0) << output;
  return nlohmann::json::parse(output);
}

TEST(DedupTest, IdenticalFilesShareOneCopyUntilTheLastIsDeleted) {
  MountedVolume volume;
  const std::string data = RandomBytes(kFileBytes, 1);
  for (int i = 0; i < 4; ++i) WriteFile(volume.Path("copy" + std::to_string(i)), data);
  nlohmann::json stat = Stat(volume);
  EXPECT_EQ(stat["logical_bytes"].get<uint64_t>(), 4 * kFileBytes);
  EXPECT_EQ(stat["physical_bytes"].get<uint64_t>(), kFileBytes) << stat.dump();
  EXPECT_DOUBLE_EQ(stat["dedup_ratio"].get<double>(), 4.0);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(ReadFile(volume.Path("copy" + std::to_string(i))), data);

  for (int i = 0; i < 3; ++i) ASSERT_EQ(unlink(volume.Path("copy" + std::to_string(i)).c_str()), 0);
  EXPECT_EQ(Stat(volume)["physical_bytes"].get<uint64_t>(), kFileBytes);
  EXPECT_EQ(ReadFile(volume.Path("copy3")), data);
  ASSERT_EQ(unlink(volume.Path("copy3").c_str()), 0);
  EXPECT_EQ(Stat(volume)["physical_bytes"].get<uint64_t>(), 0u);

  ASSERT_TRUE(volume.Unmount());
  std::string output;
  EXPECT_EQ(RunSpillfs("fsck " + volume.volume(), &output), 0) << output;
}

TEST(DedupTest, ChangesToOneCopyLeaveTheOthersIntact) {
  MountedVolume volume;
  const std::string data = RandomBytes(kFileBytes, 2);
  for (const char* name : {"a", "b", "c"}) WriteFile(volume.Path(name), data);

  // Overwrite part of a shared unit in a, truncate b into the middle of a unit.
  std::string a = data;
  std::string patch = RandomBytes(300000, 3);
  a.replace(100000, patch.size(), patch);
  int fd = open(volume.Path("a").c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(pwrite(fd, patch.data(), patch.size(), 100000), static_cast<ssize_t>(patch.size()));
  ASSERT_EQ(close(fd), 0);
  ASSERT_EQ(truncate(volume.Path("b").c_str(), 1000000), 0);

  EXPECT_EQ(ReadFile(volume.Path("a")), a);
  EXPECT_EQ(ReadFile(volume.Path("b")), data.substr(0, 1000000));
  EXPECT_EQ(ReadFile(volume.Path("c")), data);

  ASSERT_TRUE(volume.Remount());
  EXPECT_EQ(ReadFile(volume.Path("a")), a);
  EXPECT_EQ(ReadFile(volume.Path("b")), data.substr(0, 1000000));
  EXPECT_EQ(ReadFile(volume.Path("c")), data);
  ASSERT_TRUE(volume.Unmount());
  std::string output;
  EXPECT_EQ(RunSpillfs("fsck --scrub " + volume.volume(), &output), 0) << output;
}

TEST(DedupTest, VolumeMadeWithoutDedupStoresEveryCopy) {
  MountedVolume volume(MountedVolume::Options{
      .size = "1G", .mkfs_args = "--no-dedup", .mount_options = "", .mount_args = {}, .daemon_binary = ""});
  const std::string data = RandomBytes(kFileBytes, 4);
  for (const char* name : {"x", "y"}) WriteFile(volume.Path(name), data);
  EXPECT_EQ(Stat(volume)["physical_bytes"].get<uint64_t>(), 2 * kFileBytes);
  EXPECT_EQ(ReadFile(volume.Path("y")), data);
}

}  // namespace
}  // namespace spillfs::testing
