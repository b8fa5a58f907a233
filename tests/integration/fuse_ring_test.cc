// FUSE over io_uring (spillfs mount --fuse-uring, fs/fuse/fuse_ring.h): the
// requests really travel over the ring when the kernel offers it, every kind
// of request gets its answer (data, names, attributes, errors), a write's
// data is not overwritten by its early answer, many threads at once are
// served, and a kernel that does not offer the ring gets /dev/fuse.
//
// The kernel offers the ring only while the fuse module's enable_uring is Y;
// these tests set it (root) and restore it. Where the parameter does not
// exist (a kernel before 6.14), the tests that need the ring check the
// fallback instead and say so.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/mounted_volume.h"
#include "support/random_bytes.h"

namespace spillfs::testing {
namespace {

constexpr size_t kMiB = 1 << 20;

// Sets enable_uring for the test's lifetime (where it can: root, Linux
// 6.14+); restores it after. on(): the kernel now offers the ring.
class RingParameter {
 public:
  explicit RingParameter(const std::string& value) : saved_(FuseRingParameter()) {
    on_ = !saved_.empty() && SetFuseRingParameter(value) == "Y";
  }
  ~RingParameter() {
    if (!saved_.empty()) SetFuseRingParameter(saved_);
  }
  bool on() const { return on_; }

 private:
  std::string saved_;
  bool on_ = false;
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Writes `data` through a write-only handle (direct_io: each write() is one
// request, answered before the daemon has copied it) in `chunk` pieces,
// starting `offset` bytes in.
void WriteInChunks(const std::string& path, const std::string& data, size_t chunk, off_t offset) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0) << path << ": " << strerror(errno);
  for (size_t at = 0; at < data.size(); at += chunk) {
    size_t n = std::min(chunk, data.size() - at);
    ASSERT_EQ(pwrite(fd, data.data() + at, n, offset + static_cast<off_t>(at)), static_cast<ssize_t>(n));
  }
  ASSERT_EQ(fsync(fd), 0);
  ASSERT_EQ(close(fd), 0);
}

uint64_t RingRequests(const MountedVolume& volume) {
  std::string out;
  EXPECT_EQ(RunSpillfs("stat --json " + volume.mountpoint(), &out), 0) << out;
  return nlohmann::json::parse(out.substr(out.find('{'))).at("fuse_ring_requests").get<uint64_t>();
}

MountedVolume::Options RingMount() {
  MountedVolume::Options options;
  options.size = "2G";
  options.mount_args = {"--fuse-uring"};
  return options;
}

TEST(FuseRingTest, RequestsOfEveryKindTravelOverTheRing) {
  RingParameter ring("Y");
  if (!ring.on()) GTEST_LOG_(INFO) << "the kernel does not offer the ring: checking the fallback to /dev/fuse";
  MountedVolume volume(RingMount());
  // Data: large writes (answered early), unaligned ones, and reads back.
  const std::string big = RandomBytes(48 * kMiB, 1);
  WriteInChunks(volume.Path("big"), big, kMiB, 0);
  const std::string odd = RandomBytes(5 * kMiB + 333, 2);
  WriteInChunks(volume.Path("odd"), odd, 200000, 320);
  EXPECT_TRUE(ReadAll(volume.Path("big")) == big) << "bytes written over the ring came back changed";
  std::string odd_read = ReadAll(volume.Path("odd"));
  ASSERT_EQ(odd_read.size(), odd.size() + 320);
  EXPECT_EQ(odd_read.substr(0, 320), std::string(320, '\0'));
  EXPECT_TRUE(odd_read.substr(320) == odd);
  // Names, attributes, extended attributes, errors.
  ASSERT_EQ(mkdir(volume.Path("d").c_str(), 0755), 0);
  for (int i = 0; i < 300; ++i) {
    std::ofstream(volume.Path("d/f" + std::to_string(i))) << i;
  }
  size_t listed = 0;
  for (const auto& entry : std::filesystem::directory_iterator(volume.Path("d"))) listed += entry.is_regular_file();
  EXPECT_EQ(listed, 300u);
  ASSERT_EQ(rename(volume.Path("d/f7").c_str(), volume.Path("d/seven").c_str()), 0);
  EXPECT_EQ(ReadAll(volume.Path("d/seven")), "7");
  ASSERT_EQ(setxattr(volume.Path("d/seven").c_str(), "user.k", "value", 5, 0), 0);
  char value[16] = {};
  EXPECT_EQ(getxattr(volume.Path("d/seven").c_str(), "user.k", value, sizeof(value)), 5);
  EXPECT_STREQ(value, "value");
  struct stat st {};
  ASSERT_EQ(stat(volume.Path("big").c_str(), &st), 0);
  EXPECT_EQ(static_cast<size_t>(st.st_size), big.size());
  errno = 0;
  EXPECT_EQ(stat(volume.Path("d/missing").c_str(), &st), -1);
  EXPECT_EQ(errno, ENOENT);
  EXPECT_EQ(rmdir(volume.Path("d").c_str()), -1);
  EXPECT_EQ(errno, ENOTEMPTY);
  const uint64_t requests = RingRequests(volume);
  if (ring.on()) {
    EXPECT_GT(requests, 1000u) << "the mount asked for the ring and the kernel offers it";
  } else {
    EXPECT_EQ(requests, 0u);
  }
  // What was written over the ring is on the volume.
  std::string error;
  ASSERT_TRUE(volume.Remount(&error)) << error;
  EXPECT_TRUE(ReadAll(volume.Path("big")) == big);
  EXPECT_EQ(ReadAll(volume.Path("d/f299")), "299");
}

TEST(FuseRingTest, ManyThreadsAtOnce) {
  RingParameter ring("Y");
  MountedVolume volume(RingMount());
  constexpr int kThreads = 12;
  std::vector<std::string> data;
  for (int t = 0; t < kThreads; ++t) data.push_back(RandomBytes(6 * kMiB + 4096 * t, 10 + t));
  std::vector<std::thread> threads;
  std::vector<int> mismatches(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string path = volume.Path("t" + std::to_string(t));
      for (int round = 0; round < 3; ++round) {
        WriteInChunks(path, data[t], 128 * 1024 + 512 * t, 0);
        if (ReadAll(path) != data[t]) ++mismatches[t];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
  if (ring.on()) {
    EXPECT_GT(RingRequests(volume), 1000u);
  }
}

// A kernel that does not offer the ring (enable_uring N): the mount serves
// /dev/fuse and its log says why.
TEST(FuseRingTest, WithoutTheKernelsOfferTheMountServesDevFuse) {
  RingParameter ring("N");
  if (ring.on()) GTEST_SKIP() << "the fuse module's enable_uring is Y and cannot be cleared here";
  MountedVolume volume(RingMount());
  ASSERT_TRUE(volume.Unmount());
  std::string out;
  ASSERT_EQ(RunSpillfs("mount " + volume.volume() + " " + volume.mountpoint() + " --fuse-uring", &out), 0) << out;
  std::ofstream(volume.Path("x")) << "over /dev/fuse";
  EXPECT_EQ(ReadAll(volume.Path("x")), "over /dev/fuse");
  EXPECT_EQ(RingRequests(volume), 0u);
  ASSERT_EQ(RunSpillfs("umount " + volume.mountpoint(), &out), 0) << out;
  const std::string log = ReadAll(volume.volume() + "/spillfs.log");
  EXPECT_NE(log.find("--fuse-uring: the kernel does not offer FUSE over io_uring"), std::string::npos) << log;
}

}  // namespace
}  // namespace spillfs::testing
