// The daemon's /dev/fuse loop (fs/fuse/include/spillfs/fuse/fuse_device_loop.h): requests as large
// as `spillfs mount --max-request` where the kernel's fs.fuse.max_pages_limit
// allows them, the kernel's read-ahead of one request, the kernel's limit
// honoured where it is lower, bad values refused, and a signal ending the
// daemon with its data kept.
//
// Tests that set fs.fuse.max_pages_limit (root) restore it; CMake keeps them
// apart from each other (RESOURCE_LOCK). On a kernel without the knob (before
// 6.12) requests stay at 1 MiB, which the tests check instead, and say so.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/mounted_volume.h"
#include "support/random_bytes.h"

namespace spillfs::testing {
namespace {

constexpr size_t kMiB = 1 << 20;
constexpr const char* kPagesLimit = "/proc/sys/fs/fuse/max_pages_limit";

// Sets fs.fuse.max_pages_limit for the test's lifetime; restores it after.
// exists(): the kernel has the knob.
class PagesLimit {
 public:
  explicit PagesLimit(unsigned pages) {
    exists_ = static_cast<bool>(std::ifstream(kPagesLimit) >> saved_);
    if (exists_) std::ofstream(kPagesLimit) << pages;
  }
  ~PagesLimit() {
    if (exists_) std::ofstream(kPagesLimit) << saved_;
  }
  bool exists() const { return exists_; }

 private:
  bool exists_ = false;
  unsigned saved_ = 0;
};

struct Requests {
  uint64_t writes = 0;
  uint64_t reads = 0;
};

Requests RequestsSoFar(const MountedVolume& volume) {
  std::string out;
  EXPECT_EQ(RunSpillfs("stat --json " + volume.mountpoint(), &out), 0) << out;
  auto json = nlohmann::json::parse(out.substr(out.find('{')));
  return {json.at("writes").get<uint64_t>(), json.at("reads").get<uint64_t>()};
}

// The mount's bdi read_ahead_kb (0 if not found).
unsigned ReadAheadKib(const MountedVolume& volume) {
  std::ifstream mountinfo("/proc/self/mountinfo");
  std::string line, device;
  while (std::getline(mountinfo, line)) {
    std::istringstream fields(line);
    std::string id, parent, dev, root, point;
    if (fields >> id >> parent >> dev >> root >> point && point == volume.mountpoint()) device = dev;
  }
  unsigned kib = 0;
  std::ifstream("/sys/class/bdi/" + device + "/read_ahead_kb") >> kib;
  return kib;
}

std::unique_ptr<void, decltype(&free)> PageAligned(size_t size) {
  void* buffer = nullptr;
  EXPECT_EQ(posix_memalign(&buffer, 4096, size), 0);
  return {buffer, &free};
}

// One write() of all of `data` from a page-aligned buffer (the kernel fills a
// request with whole pages of the caller's buffer: one that starts mid-page
// takes a request more), then fsync.
void WriteOnce(const std::string& path, const std::string& data) {
  auto buffer = PageAligned(data.size());
  std::memcpy(buffer.get(), data.data(), data.size());
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0) << path << ": " << strerror(errno);
  EXPECT_EQ(write(fd, buffer.get(), data.size()), static_cast<ssize_t>(data.size())) << strerror(errno);
  EXPECT_EQ(fsync(fd), 0) << strerror(errno);
  close(fd);
}

// One O_DIRECT read() of `size` bytes (the kernel splits it into requests of
// the mount's size, and no page cache is involved).
std::string ReadDirectOnce(const std::string& path, size_t size) {
  int fd = open(path.c_str(), O_RDONLY | O_DIRECT);
  EXPECT_GE(fd, 0) << path << ": " << strerror(errno);
  if (fd < 0) return {};
  auto buffer = PageAligned(size);
  ssize_t n = read(fd, buffer.get(), size);
  close(fd);
  EXPECT_EQ(n, static_cast<ssize_t>(size)) << strerror(errno);
  return n > 0 ? std::string(static_cast<const char*>(buffer.get()), static_cast<size_t>(n)) : std::string();
}

// Writes `size` random bytes with one write() and reads them back with one
// O_DIRECT read(), each split by the kernel into requests of the mount's
// size, and checks that one request carries `request` bytes.
void ExpectRequestsOf(const MountedVolume& volume, size_t request, size_t size, uint64_t seed) {
  const std::string data = RandomBytes(size, seed);
  const Requests before = RequestsSoFar(volume);
  WriteOnce(volume.Path("f"), data);
  EXPECT_TRUE(ReadDirectOnce(volume.Path("f"), data.size()) == data) << "bytes read back differ";
  const Requests after = RequestsSoFar(volume);
  EXPECT_EQ(after.writes - before.writes, size / request) << "write requests for one write() of " << size << " bytes";
  EXPECT_EQ(after.reads - before.reads, size / request) << "read requests for one O_DIRECT read() of " << size;
}

MountedVolume::Options WithMaxRequest(const std::string& size) {
  MountedVolume::Options options;
  options.size = "512M";
  options.mount_args = {"--max-request", size};
  return options;
}

// The default: 1 MiB requests and read-ahead. More kernel read-ahead made
// buffered reads slower (1e9c81e; docs/results.md, "Read path").
TEST(FuseLoopTest, TheKernelReadsAheadOneRequestByDefault) {
  MountedVolume volume;
  EXPECT_EQ(ReadAheadKib(volume), 1024u);
  ExpectRequestsOf(volume, kMiB, 8 * kMiB, 1);
}

TEST(FuseLoopTest, RequestsCarryMaxRequestWhereTheKernelAllowsIt) {
  PagesLimit limit(2048);
  if (!limit.exists()) GTEST_LOG_(INFO) << "no " << kPagesLimit << " (Linux before 6.12): checking 1 MiB requests";
  MountedVolume volume(WithMaxRequest("4M"));
  const uint64_t request = limit.exists() ? 4 * kMiB : kMiB;
  EXPECT_EQ(ReadAheadKib(volume), request / 1024);
  ExpectRequestsOf(volume, request, 16 * kMiB, 2);
  // An unaligned write across request boundaries, and the data on the volume.
  const std::string data = RandomBytes(16 * kMiB, 2);
  const std::string odd = RandomBytes(9 * kMiB + 4321, 3);
  int fd = open(volume.Path("f").c_str(), O_WRONLY);
  ASSERT_GE(fd, 0) << strerror(errno);
  ASSERT_EQ(pwrite(fd, odd.data(), odd.size(), 777), static_cast<ssize_t>(odd.size())) << strerror(errno);
  close(fd);
  std::string expected = data;
  expected.replace(777, odd.size(), odd);
  std::string error;
  ASSERT_TRUE(volume.Remount(&error)) << error;
  EXPECT_TRUE(ReadDirectOnce(volume.Path("f"), expected.size()) == expected) << "after remount";
}

// The daemon's read-ahead windows are whole requests as the kernel sends
// them: 4 x 4 MiB for the default 16 MiB ahead, whether requests are 1 MiB or
// 4 MiB; 2 x 8 MiB for 8 MiB requests, but only where the kernel allows them.
uint64_t ReadAheadWindowBytes(const MountedVolume& volume) {
  std::string out;
  EXPECT_EQ(RunSpillfs("stat --json " + volume.mountpoint(), &out), 0) << out;
  return nlohmann::json::parse(out.substr(out.find('{'))).at("read_ahead_window_bytes").get<uint64_t>();
}

TEST(FuseLoopTest, TheKernelsLimitLowersTheRequestSize) {
  PagesLimit limit(256);
  MountedVolume volume(WithMaxRequest("8M"));
  EXPECT_EQ(ReadAheadKib(volume), 1024u);
  EXPECT_EQ(ReadAheadWindowBytes(volume), 4 * kMiB) << "windows of 8 MiB requests the kernel never sends";
  ExpectRequestsOf(volume, kMiB, 8 * kMiB, 4);
}

TEST(FuseLoopTest, ReadAheadWindowsHoldWholeRequests) {
  PagesLimit limit(2048);
  MountedVolume volume(WithMaxRequest("8M"));
  EXPECT_EQ(ReadAheadWindowBytes(volume), limit.exists() ? 8 * kMiB : 4 * kMiB);
  // A sequential reader is served from them.
  const std::string data = RandomBytes(48 * kMiB, 5);
  WriteOnce(volume.Path("f"), data);
  std::string error;
  ASSERT_TRUE(volume.Remount(&error)) << error;
  std::ifstream in(volume.Path("f"), std::ios::binary);
  std::string back((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(back == data) << "bytes read back differ";
  std::string out;
  ASSERT_EQ(RunSpillfs("stat --json " + volume.mountpoint(), &out), 0) << out;
  auto stat = nlohmann::json::parse(out.substr(out.find('{')));
  EXPECT_GT(stat.at("read_ahead_windows").get<uint64_t>(), 0u);
  EXPECT_GE(stat.at("read_ahead_bytes_served").get<uint64_t>(), 32 * kMiB)
      << "fetched " << stat.at("read_ahead_bytes_fetched").get<uint64_t>();
}

TEST(FuseLoopTest, BadMaxRequestIsRefused) {
  MountedVolume volume;
  std::string error;
  ASSERT_TRUE(volume.Unmount(&error)) << error;
  ExpectMountsRefused(volume.volume(), volume.mountpoint(),
                      {
                          {"--max-request 129K", "--max-request: 129K is not a positive multiple of 4K"},
                          {"--max-request 64M", "--max-request: 64M is more than the most"},
                          {"--max-request 64K", "--max-request: 64K is less than the least"},
                          {"--max-request 0", "--max-request: 0 is not a positive multiple of 4K"},
                          {"--max-request 4M --fuse-uring", "--max-request cannot be used with --fuse-uring"},
                      });
  EXPECT_TRUE(volume.Mount(&error)) << "the volume after the refused mounts: " << error;
}

// The daemon's threads named spillfs-fuse (its /dev/fuse workers).
size_t FuseWorkers(pid_t daemon) {
  size_t n = 0;
  const std::string tasks = "/proc/" + std::to_string(daemon) + "/task";
  for (const auto& task : std::filesystem::directory_iterator(tasks)) {
    std::string name;
    std::ifstream(task.path() / "comm") >> name;
    n += name == "spillfs-fuse";
  }
  return n;
}

// The pool grows as libfuse's does: requests one at a time keep a few
// workers (one reads while another works; a write answered early overlaps
// the next request), many at once start more, up to --threads. A worker
// starts whenever the last one in read() takes a request, so a busy machine
// (a worker answering slowly back to read()) starts a few more for serial
// requests too: 8 were seen on 2 loaded cores. A worker a request would
// reach --threads within the first 32 of the 400.
TEST(FuseLoopTest, WorkersStartAsRequestsNeedThem) {
  MountedVolume::Options options;
  options.mount_args = {"--threads", "32"};
  MountedVolume volume(options);
  const std::string data = RandomBytes(kMiB, 7);
  WriteOnce(volume.Path("f"), data);
  for (int i = 0; i < 200; ++i) {
    struct stat st {};
    ASSERT_EQ(stat(volume.Path("f").c_str(), &st), 0);
    ASSERT_EQ(stat(volume.Path("missing").c_str(), &st), -1);
  }
  const size_t serial = FuseWorkers(volume.daemon_pid());
  EXPECT_GE(serial, 1u);
  EXPECT_LT(serial, 16u) << "after requests one at a time";
  std::vector<std::thread> readers;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 24; ++t) {
    readers.emplace_back([&] {
      for (int i = 0; i < 20; ++i) mismatches += ReadDirectOnce(volume.Path("f"), data.size()) != data;
    });
  }
  for (auto& reader : readers) reader.join();
  EXPECT_EQ(mismatches.load(), 0);
  const size_t workers = FuseWorkers(volume.daemon_pid());
  EXPECT_GT(workers, serial) << "after 24 readers at once";
  EXPECT_LE(workers, 32u) << "--threads 32";
}

// SIGTERM (and SIGINT, SIGHUP) end the daemon: it stops serving, unmounts
// and exits 0 with what was written on the volume, even with a file open.
TEST(FuseLoopTest, SigtermUnmountsAndKeepsTheData) {
  MountedVolume volume;
  const std::string data = RandomBytes(3 * kMiB + 17, 5);
  WriteOnce(volume.Path("kept"), data);
  const std::string unsynced = RandomBytes(kMiB, 6);
  int fd = open(volume.Path("open").c_str(), O_WRONLY | O_CREAT, 0644);
  ASSERT_GE(fd, 0) << strerror(errno);
  ASSERT_EQ(write(fd, unsynced.data(), unsynced.size()), static_cast<ssize_t>(unsynced.size()));
  std::string error;
  EXPECT_TRUE(volume.Terminate(SIGTERM, &error)) << error;
  close(fd);
  struct stat st {};
  std::ifstream mountinfo("/proc/self/mountinfo");
  std::string mounts((std::istreambuf_iterator<char>(mountinfo)), {});
  EXPECT_EQ(mounts.find(" " + volume.mountpoint() + " "), std::string::npos) << "still mounted after SIGTERM";
  ASSERT_TRUE(volume.Mount(&error)) << error;
  EXPECT_TRUE(ReadDirectOnce(volume.Path("kept"), data.size()) == data);
  ASSERT_EQ(stat(volume.Path("open").c_str(), &st), 0) << strerror(errno);
  EXPECT_EQ(static_cast<size_t>(st.st_size), unsynced.size()) << "written before SIGTERM, synced at exit";
}

}  // namespace
}  // namespace spillfs::testing
