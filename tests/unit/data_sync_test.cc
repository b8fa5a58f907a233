// BlockStore::Flush, the sync of the data area. A failed fdatasync is sticky
// (block_store.h): the kernel reports a lost write-back to one fdatasync
// only, and with the background sync (background_sync.h) that one may be the
// background thread's; then the user's fsync must fail too, not find the
// error gone. Callers that overlap share fdatasync calls (group commit).
//
// This binary interposes fdatasync for calls on a volume's data image
// (data.img): while failures are armed they fail with EIO, the way a lost
// write-back is reported, and each can be slowed down; all other calls
// (RocksDB's) go straight to the real one.
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "eventually.h"
#include "spillfs/fs/block_store.h"
#include "spillfs/fs/filesystem.h"
#include "spillfs/fs/volume.h"
#include "temp_dir.h"

namespace {

std::atomic<int> failures_armed{0};
std::atomic<int> failures_injected{0};
std::atomic<int> delay_ms{0};
std::atomic<int> data_image_syncs{0};
std::atomic<int64_t> last_sync_end_ns{0};      // steady clock, when the last data.img fdatasync returned
std::atomic<int64_t> last_wal_sync_end_ns{0};  // the same for the index's WAL (*.log)

int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool PathEndsWith(int fd, const std::string& suffix) {
  char link[4096];
  ssize_t n = readlink(("/proc/self/fd/" + std::to_string(fd)).c_str(), link, sizeof(link) - 1);
  if (n <= 0) return false;
  std::string path(link, static_cast<size_t>(n));
  return path.size() >= suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

extern "C" int fdatasync(int fd) {
  using Real = int (*)(int);
  static const Real real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "fdatasync"));
  if (!PathEndsWith(fd, "/data.img")) {
    int rc = real(fd);
    if (PathEndsWith(fd, ".log")) last_wal_sync_end_ns = SteadyNowNs();
    return rc;
  }
  ++data_image_syncs;
  if (delay_ms.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms.load()));
  if (failures_armed.load() > 0 && failures_armed.fetch_sub(1) > 0) {
    ++failures_injected;
    last_sync_end_ns = SteadyNowNs();
    errno = EIO;
    return -1;
  }
  int rc = real(fd);
  last_sync_end_ns = SteadyNowNs();
  return rc;
}

namespace spillfs {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kVolumeSize = 64ull << 20;

class DataSyncTest : public ::testing::Test {
 protected:
  void SetUp() override {
    failures_armed = 0;
    failures_injected = 0;
    delay_ms = 0;
  }
  void TearDown() override {
    failures_armed = 0;
    delay_ms = 0;
  }
  // A new volume in dir_, opened with `options`.
  Result<std::unique_ptr<Filesystem>> OpenFilesystem(const FilesystemOptions& options) {
    Volume::CreateOptions create;
    create.size = kVolumeSize;
    const std::string vol = dir_.path() + "/vol";
    if (auto made = Volume::Create(vol, create); !made.ok()) return made.status();
    auto volume = Volume::Open(vol, Volume::OpenOptions{});
    if (!volume.ok()) return volume.status();
    return Filesystem::Open(std::move(volume).value(), options);
  }
  TempDir dir_{"spillfs-data-sync-test"};
};

// Four Flush calls at once while each fdatasync takes 200 ms: the first runs
// one, the others wait for it and share the next (or all share the first).
TEST_F(DataSyncTest, OverlappingFlushesShareAnFdatasync) {
  const std::string image = dir_.path() + "/data.img";
  ASSERT_TRUE(BlockStore::CreateImage(image, kVolumeSize).ok());
  auto store = BlockStore::Open(image);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  delay_ms = 200;
  const int before = data_image_syncs.load();
  std::atomic<bool> go{false};
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      while (!go.load()) std::this_thread::yield();
      if (!(*store)->Flush().ok()) ++failed;
    });
  }
  go = true;
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_LE(data_image_syncs.load() - before, 2) << "four overlapping Flush calls, one fdatasync each";
  EXPECT_GE(data_image_syncs.load() - before, 1);
}

TEST_F(DataSyncTest, AFailedFlushFailsEveryLaterFlush) {
  const std::string image = dir_.path() + "/data.img";
  ASSERT_TRUE(BlockStore::CreateImage(image, kVolumeSize).ok());
  auto store = BlockStore::Open(image);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  std::string block(BlockStore::kDirectAlignment, 'x');
  AlignedBuffer data(block.size());
  std::copy(block.begin(), block.end(), data.data());
  ASSERT_TRUE((*store)->WriteAt(0, data.data(), block.size()).ok());
  ASSERT_TRUE((*store)->Flush().ok());
  const uint64_t syncs = (*store)->syncs();

  EXPECT_TRUE((*store)->sync_error().ok());
  failures_armed = 1;
  Status first = (*store)->Flush();
  EXPECT_EQ(first.code(), EIO) << first.ToString();
  EXPECT_EQ(failures_injected.load(), 1);
  // The injected failure is spent: the real fdatasync would succeed now.
  Status later = (*store)->Flush();
  EXPECT_EQ(later.code(), EIO) << later.ToString();
  EXPECT_NE(later.message().find("remount"), std::string::npos) << later.ToString();
  EXPECT_EQ((*store)->sync_error().code(), EIO) << "what spillfs stat shows";
  EXPECT_EQ((*store)->syncs(), syncs) << "a failed fdatasync is not counted, and none ran after it";
}

TEST_F(DataSyncTest, FsyncFailsAfterTheBackgroundSyncLostTheWriteBack) {
  FilesystemOptions options;
  options.ram_tier_bytes = 32 << 20;
  options.ram_tier_warm_bytes = 0;
  options.flush_age_ms = 10;
  options.bytes_per_sync = 1 << 20;
  auto fs = OpenFilesystem(options);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  auto entry = (*fs)->MakeNode(kRootInode, "f", S_IFREG | 0644, 0, Caller{});
  ASSERT_TRUE(entry.ok()) << entry.status().ToString();

  failures_armed = 1;
  std::mt19937_64 rng(3);
  std::string data(8 << 20, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  auto written = (*fs)->Write(entry->ino, 0, data.data(), data.size());
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  // The flusher writes the file and its background sync takes the failure.
  ASSERT_TRUE(Eventually([] { return failures_injected.load() > 0; }, 20s)) << "the background sync never ran";
  ASSERT_EQ(failures_injected.load(), 1);

  Status fsync = (*fs)->Fsync(entry->ino, /*datasync=*/false);
  EXPECT_EQ(fsync.code(), EIO) << fsync.ToString();
  EXPECT_EQ(failures_injected.load(), 1) << "fsync was failed by the sticky error, not by a second injection";
}

// Crash order rule 2 across an fsync: SyncAll flushes the data area, then
// syncs the index's WAL. A mapping committed in between would be made durable
// by that WAL sync although its data was written after the fdatasync began.
// While SyncAll's fdatasync runs (slowed to 300 ms), a write-through write
// must not commit its mapping: it returns only after the WAL sync.
TEST_F(DataSyncTest, AMappingWaitsForAnIndexSyncInProgress) {
  FilesystemOptions options;
  options.ram_tier_bytes = 0;  // write-through: Write commits its mapping itself
  auto fs = OpenFilesystem(options);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  auto entry = (*fs)->MakeNode(kRootInode, "f", S_IFREG | 0644, 0, Caller{});
  ASSERT_TRUE(entry.ok()) << entry.status().ToString();

  delay_ms = 300;
  const int before = data_image_syncs.load();
  std::thread syncer([&] { EXPECT_TRUE((*fs)->SyncAll().ok()); });
  struct Joiner {  // joins at once, or at the end when an assertion returns
    std::thread* thread;
    void Join() {
      if (thread->joinable()) thread->join();
    }
    ~Joiner() { Join(); }
  } syncer_done{&syncer};
  ASSERT_TRUE(Eventually([&] { return data_image_syncs.load() > before; }, 10s, 0ms))
      << "SyncAll never reached its fdatasync";

  std::string data(16 << 10, 'm');
  auto written = (*fs)->Write(entry->ino, 0, data.data(), data.size());
  const int64_t mapped_ns = SteadyNowNs();
  syncer_done.Join();  // SyncAll's own syncs are the last ones now
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  EXPECT_GE(mapped_ns, last_sync_end_ns.load())
      << "the write committed its mapping while SyncAll's data flush was still running";
  EXPECT_GE(mapped_ns, last_wal_sync_end_ns.load())
      << "the write committed its mapping between SyncAll's data flush and its WAL sync";
  std::string back;
  AlignedBuffer scratch;
  auto read = (*fs)->Read(entry->ino, 0, data.size(), &scratch, [&](const iovec* pieces, int count) {
    for (int i = 0; i < count; ++i) back.append(static_cast<const char*>(pieces[i].iov_base), pieces[i].iov_len);
  });
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(back, data);
}

// A memtable flush makes mappings durable without SyncAll: the filesystem
// flushes the data area when RocksDB seals the memtable (Index::SetSealListener).
TEST_F(DataSyncTest, AnIndexFlushFlushesTheDataAreaFirst) {
  FilesystemOptions options;
  options.ram_tier_bytes = 0;
  auto fs = OpenFilesystem(options);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  auto entry = (*fs)->MakeNode(kRootInode, "f", S_IFREG | 0644, 0, Caller{});
  ASSERT_TRUE(entry.ok()) << entry.status().ToString();
  std::string data(64 << 10, 's');
  ASSERT_TRUE((*fs)->Write(entry->ino, 0, data.data(), data.size()).ok());
  const uint64_t syncs = (*fs)->volume().store().syncs();
  ASSERT_TRUE((*fs)->volume().index().FlushMemTables().ok());
  EXPECT_GT((*fs)->volume().store().syncs(), syncs) << "the memtable was flushed without a data sync first";
}

}  // namespace
}  // namespace spillfs
