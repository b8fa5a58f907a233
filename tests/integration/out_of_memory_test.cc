// Out of memory is an answer, not the end of the mount: a write that needs
// RAM-tier memory the system cannot give fails with ENOMEM, and the mount goes
// on serving (issue 22).
//
// The daemon is the test-only spillfs-faulty (testing/), whose RAM tier runs
// out of memory after its first slab (SPILLFS_FAULTY_RAM_TIER_SLABS=1,
// spillfs/testing/memory.h): 32 MiB of chunks, then every new slab mapping
// fails as a failed mmap would. A writer that fills the first slab (no flush
// frees a chunk meanwhile: no age, no write-behind, no pressure) gets ENOMEM
// for the write that needs a chunk of the second; the mount then still
// answers lookups, listings and reads, an fsync writes the cached data out
// (giving its chunks back), the write that failed succeeds when tried again,
// every byte reads back, and the daemon unmounts cleanly.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "spillfs/testing/memory.h"
#include "support/mounted_volume.h"
#include "support/random_bytes.h"

namespace spillfs::testing {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kSlabBytes = 32 * kMiB;  // one BufferPool slab of the RAM tier
constexpr uint64_t kFileBytes = 48 * kMiB;

// Sets the fault for the daemon started while it lives (not later commands).
class SlabFaultEnv {
 public:
  explicit SlabFaultEnv(uint64_t slabs) { setenv(memory::kRamTierSlabsEnv, std::to_string(slabs).c_str(), 1); }
  ~SlabFaultEnv() { unsetenv(memory::kRamTierSlabsEnv); }
};

std::unique_ptr<MountedVolume> MountOutOfMemoryAfterOneSlab() {
  SlabFaultEnv env(1);
  MountedVolume::Options options;
  options.daemon_binary = SPILLFS_FAULTY_BINARY;
  // A tier far larger than one slab (no pressure), nothing faulted in at
  // mount (the slab is the first write's), and no flush by age.
  options.mount_args = {"--ram-tier", "512M", "--ram-tier-warm", "0", "--flush-age", "3600000"};
  return std::make_unique<MountedVolume>(options);
}

// Writes `length` bytes of `data` at `offset` in 1 MiB requests; the offset
// of the first that fails (errno set), or `offset + length`.
uint64_t WriteInMiBs(int fd, const std::string& data, uint64_t offset, uint64_t length) {
  for (uint64_t at = offset; at < offset + length; at += kMiB) {
    ssize_t n = pwrite(fd, data.data() + at, kMiB, static_cast<off_t>(at));
    if (n != static_cast<ssize_t>(kMiB)) {
      if (n >= 0) errno = EIO;  // a short write: not expected here
      return at;
    }
  }
  return offset + length;
}

TEST(OutOfMemoryTest, AWriteWithoutRamTierMemoryFailsWithEnomemAndTheMountGoesOn) {
  auto volume = MountOutOfMemoryAfterOneSlab();
  const std::string path = volume->Path("big");
  const std::string data = RandomBytes(kFileBytes, 22);
  // Write-only: the handle's writes reach the daemon as sent (direct_io).
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0) << strerror(errno);

  const uint64_t failed_at = WriteInMiBs(fd, data, 0, kFileBytes);
  const int error = errno;
  ASSERT_LT(failed_at, kFileBytes) << "every write found RAM-tier memory: the fault was not injected";
  EXPECT_EQ(error, ENOMEM) << "the write at " << failed_at << " failed with " << strerror(error);
  EXPECT_EQ(failed_at, kSlabBytes) << "the first write past one slab's chunks should be the one to fail";

  // The mount still serves: the failed write changed nothing, the cached
  // bytes read back, names resolve and list.
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0) << strerror(errno);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), failed_at);
  ASSERT_EQ(mkdir(volume->Path("dir").c_str(), 0755), 0) << strerror(errno);
  DIR* dir = opendir(volume->Path("").c_str());
  ASSERT_NE(dir, nullptr) << strerror(errno);
  int names = 0;
  while (readdir(dir) != nullptr) ++names;
  closedir(dir);
  EXPECT_GE(names, 4);  // ., .., big, dir (and .spillfs)
  {
    int reader = open(path.c_str(), O_RDONLY);
    ASSERT_GE(reader, 0) << strerror(errno);
    std::string got(failed_at, '\0');
    ASSERT_EQ(pread(reader, got.data(), got.size(), 0), static_cast<ssize_t>(got.size())) << strerror(errno);
    close(reader);
    EXPECT_TRUE(got == data.substr(0, failed_at)) << "the cached bytes differ after the failed write";
  }

  // fsync writes the cached data to the SSD and gives its chunks back: the
  // write that failed, and the rest, find memory again.
  ASSERT_EQ(fsync(fd), 0) << strerror(errno);
  const uint64_t resumed = WriteInMiBs(fd, data, failed_at, kFileBytes - failed_at);
  EXPECT_EQ(resumed, kFileBytes) << "the write at " << resumed << " failed again after fsync: " << strerror(errno);
  ASSERT_EQ(close(fd), 0) << strerror(errno);

  std::string error_text;
  ASSERT_TRUE(volume->Remount(&error_text)) << error_text;  // the daemon unmounts cleanly
  int reader = open(path.c_str(), O_RDONLY);
  ASSERT_GE(reader, 0) << strerror(errno);
  std::string got(kFileBytes, '\0');
  ASSERT_EQ(pread(reader, got.data(), got.size(), 0), static_cast<ssize_t>(got.size())) << strerror(errno);
  close(reader);
  EXPECT_TRUE(got == data) << "the file differs from what was written";
}

}  // namespace
}  // namespace spillfs::testing
