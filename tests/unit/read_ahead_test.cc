// Unit tests of read-ahead (spillfs/cache/read_ahead.h): streams detected and served
// from windows, windows dropped or made stale by a change, waits counted, and
// the options derived from --read-ahead and --max-request.
#include <gtest/gtest.h>
#include <linux/falloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "filesystem_fixture.h"
#include "support/random_bytes.h"

namespace spillfs {
namespace {

using testing::RandomBytes;

class ReadAheadTest : public FilesystemDataTest {
 protected:
  // A 24 MiB file "seq" of seeded bytes (`*data`), flushed to the SSD.
  InodeNumber MakeFlushedFile(uint64_t seed, std::string* data) {
    std::mt19937_64 rng(seed);
    *data = RandomBytes(rng, 24 << 20);
    StampBlocks(data, seed);
    InodeNumber ino = MakeFile(kRootInode, "seq");
    WriteAt(ino, 0, *data);
    FlushAll();
    return ino;
  }
  // Reads [from, to) in 1 MiB requests and compares each with `expected`.
  void ExpectSequentialReads(InodeNumber ino, const std::string& expected, uint64_t from, uint64_t to) {
    for (uint64_t at = from; at < to; at += 1 << 20) {
      auto got = ReadAt(ino, at, 1 << 20);
      ASSERT_TRUE(got.ok()) << at << ": " << got.status().ToString();
      ASSERT_TRUE(*got == expected.substr(at, 1 << 20)) << "wrong bytes in the MiB at " << at;
    }
  }
};

INSTANTIATE_TEST_SUITE_P(Tiers, ReadAheadTest, kTiers, TierName);

TEST_P(ReadAheadTest, SequentialReadsAreServedByReadAhead) {
  std::string data;
  InodeNumber ino = MakeFlushedFile(41, &data);
  ExpectSequentialReads(ino, data, 0, data.size());
  ReadAhead::Stats stats = fs_->read_ahead_stats();
  EXPECT_GT(stats.windows_started, 0u);
  // Only the first MiB or so cannot come from a window.
  EXPECT_GE(stats.bytes_served, data.size() - (2 << 20)) << "fetched " << stats.bytes_fetched;
  // A reader that jumps around starts nothing more.
  uint64_t started = stats.windows_started;
  for (uint64_t at : {20u << 20, 3u << 20, 15u << 20, 7u << 20}) {
    auto got = ReadAt(ino, at, 4096);
    ASSERT_TRUE(got.ok());
    EXPECT_TRUE(*got == data.substr(at, 4096));
  }
  EXPECT_EQ(fs_->read_ahead_stats().windows_started, started);
  // Nor does one whose small reads land close together but never where the
  // last ended (a random reader of a hot region).
  for (uint64_t at : {10u << 20, (10u << 20) + 65536, (10u << 20) + 8192, (10u << 20) + 200704, 10u << 20}) {
    auto got = ReadAt(ino, at, 4096);
    ASSERT_TRUE(got.ok());
    EXPECT_TRUE(*got == data.substr(at, 4096));
  }
  EXPECT_EQ(fs_->read_ahead_stats().windows_started, started);
}

// The kernel's read-ahead starts small and grows its requests (32 KiB, 128
// KiB, 512 KiB, then 1 MiB), so once the stream starts, at 160 KiB, the 1 MiB
// requests lie across the boundaries of windows laid out from there: one in
// four straddles two windows, and is answered from both. Before, it was read
// from the SSD again.
TEST_P(ReadAheadTest, RequestsAcrossWindowBoundariesAreServedFromBoth) {
  std::string data;
  InodeNumber ino = MakeFlushedFile(43, &data);
  std::vector<std::pair<uint64_t, uint64_t>> requests = {{0, 32 << 10}, {32 << 10, 128 << 10}, {160 << 10, 512 << 10}};
  for (uint64_t at = 672 << 10; at < data.size(); at += 1 << 20) {
    requests.emplace_back(at, std::min<uint64_t>(1 << 20, data.size() - at));
  }
  // One across the first boundary (4256 KiB) starts and ends mid-block.
  requests[6] = {requests[6].first + 100, (1 << 20) - 150};
  ASSERT_EQ(requests[6].first, (3744u << 10) + 100);
  for (auto [at, length] : requests) {
    auto got = ReadAt(ino, at, length);
    ASSERT_TRUE(got.ok()) << at << ": " << got.status().ToString();
    ASSERT_TRUE(*got == data.substr(at, length)) << "wrong bytes in the " << length << " at " << at;
  }
  ReadAhead::Stats stats = fs_->read_ahead_stats();
  EXPECT_EQ(stats.bytes_served, data.size() - (160 << 10)) << "fetched " << stats.bytes_fetched;
}

// Read requests larger than the default 4 MiB window (spillfs mount
// --max-request 8M) are served from windows, each a whole number of
// requests: no request straddles two of them.
class LargeRequestReadAheadTest : public ReadAheadTest {
 protected:
  void Tune(FilesystemOptions* options) const override { options->read_request_bytes = 8 << 20; }
};

INSTANTIATE_TEST_SUITE_P(Tiers, LargeRequestReadAheadTest, kTiers, TierName);

TEST_P(LargeRequestReadAheadTest, EightMiBReadsAreServedFromWindows) {
  std::string data;
  InodeNumber ino = MakeFlushedFile(42, &data);
  constexpr uint64_t kRequest = 8 << 20;
  for (uint64_t at = 0; at < data.size(); at += kRequest) {
    auto got = ReadAt(ino, at, kRequest);
    ASSERT_TRUE(got.ok()) << at << ": " << got.status().ToString();
    ASSERT_TRUE(*got == data.substr(at, kRequest)) << "wrong bytes in the 8 MiB at " << at;
  }
  // The stream starts after two reads; the third comes from a window.
  EXPECT_GE(fs_->read_ahead_stats().bytes_served, kRequest) << "fetched " << fs_->read_ahead_stats().bytes_fetched;
}

// Windows let go before their fetch started (the reader jumped, or they fell
// behind) are not fetched: with a large --read-ahead a random reader would
// otherwise queue many times the bytes it reads.
TEST(ReadAheadDropTest, WindowsDroppedBeforeTheirFetchAreNotFetched) {
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::atomic<int> fetches{0};
  ReadAhead::Options options;
  options.window_bytes = 1 << 20;
  options.windows_ahead = 8;
  options.threads = 1;  // the first fetch holds the only thread
  ReadAhead ahead(options, [&](InodeNumber, uint64_t, uint64_t, char*) {
    ++fetches;
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return release; });
    return Status::OK();
  });
  constexpr uint64_t kFile = 1ull << 30;
  ahead.Advance(7, 0, 1 << 20, kFile);
  ahead.Advance(7, 1 << 20, 2 << 20, kFile);  // the stream runs: 8 windows queued
  EXPECT_EQ(ahead.stats().windows_started, 8u);
  ahead.Advance(7, 500u << 20, 501u << 20, kFile);  // a jump: the queued windows are dropped
  {
    std::lock_guard lock(mu);
    release = true;
  }
  cv.notify_all();
  // The worker goes through the queue (each fetch now returns at once).
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_LE(fetches.load(), 1) << "windows dropped by the jump were fetched anyway";  // 1: one had started
  ahead.Forget(7);
}

// A read whose window is still being fetched waits for it, and is counted
// (spillfs stat: read_ahead_waits, read_ahead_wait_seconds); one whose
// window is done is not.
TEST(ReadAheadWaitTest, ReadsThatWaitForAFetchAreCounted) {
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  ReadAhead::Options options;
  options.window_bytes = 1 << 20;
  options.windows_ahead = 1;
  options.threads = 1;
  ReadAhead ahead(options, [&](InodeNumber, uint64_t, uint64_t, char*) {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return release; });
    return Status::OK();
  });
  constexpr uint64_t kFile = 64 << 20;
  ahead.Advance(7, 0, 1 << 20, kFile);
  ahead.Advance(7, 1 << 20, 2 << 20, kFile);  // the stream runs: [2 MiB, 3 MiB) is being fetched
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // Serve is waiting by then
    {
      std::lock_guard lock(mu);
      release = true;
    }
    cv.notify_all();
  });
  auto views = ahead.Serve(7, 2 << 20, 1 << 20);
  releaser.join();
  ASSERT_EQ(views.size(), 1u);
  ReadAhead::Stats stats = ahead.stats();
  EXPECT_EQ(stats.waits, 1u);
  EXPECT_GT(stats.wait_ns, 0u);
  views.clear();
  views = ahead.Serve(7, (2 << 20) + 4096, 4096);  // the same window, done now
  EXPECT_EQ(views.size(), 1u);
  EXPECT_EQ(ahead.stats().waits, 1u);
  views.clear();
  ahead.Forget(7);
}

TEST(ReadAheadOptionsTest, BytesAheadBecomeWindowsWithAThreadEach) {
  ReadAhead::Options none = ReadAhead::Options::ForBytesAhead(0);
  EXPECT_EQ(none.windows_ahead, 0u);
  EXPECT_EQ(none.threads, 0u);
  ReadAhead::Options standard = ReadAhead::Options::ForBytesAhead(16 << 20);
  EXPECT_EQ(standard.window_bytes, 4u << 20);
  EXPECT_EQ(standard.windows_ahead, 4u);
  EXPECT_EQ(standard.threads, 4u);
  ReadAhead::Options deep = ReadAhead::Options::ForBytesAhead(64 << 20);
  EXPECT_EQ(deep.windows_ahead, 16u);
  EXPECT_EQ(deep.threads, 16u);
  // Uneven amounts are split evenly, in whole blocks.
  ReadAhead::Options uneven = ReadAhead::Options::ForBytesAhead(6 << 20);
  EXPECT_EQ(uneven.windows_ahead, 2u);
  EXPECT_EQ(uneven.window_bytes, 3u << 20);
  ReadAhead::Options tiny = ReadAhead::Options::ForBytesAhead(1000);
  EXPECT_EQ(tiny.windows_ahead, 1u);
  EXPECT_EQ(tiny.window_bytes, 4096u);
  EXPECT_EQ(tiny.threads, 4u);
  // Windows are whole requests: 8 MiB ones (--max-request 8M), 3 MiB ones.
  ReadAhead::Options large = ReadAhead::Options::ForBytesAhead(16 << 20, 8 << 20);
  EXPECT_EQ(large.window_bytes, 8u << 20);
  EXPECT_EQ(large.windows_ahead, 2u);
  ReadAhead::Options odd = ReadAhead::Options::ForBytesAhead(16 << 20, 3 << 20);
  EXPECT_EQ(odd.window_bytes, 6u << 20);
  EXPECT_EQ(odd.windows_ahead, 3u);
}

class NoReadAheadTest : public ReadAheadTest {
 protected:
  uint64_t ReadAheadBytes() const override { return 0; }
};

INSTANTIATE_TEST_SUITE_P(Tiers, NoReadAheadTest, kTiers, TierName);

TEST_P(NoReadAheadTest, ReadAheadOfZeroFetchesNothing) {
  std::string data;
  InodeNumber ino = MakeFlushedFile(43, &data);
  ExpectSequentialReads(ino, data, 0, data.size());
  EXPECT_EQ(fs_->read_ahead_stats().windows_started, 0u);
  EXPECT_EQ(fs_->read_ahead_stats().bytes_served, 0u);
}

// Windows fetched before a write, truncate or hole punch never answer a read
// after it.
TEST_P(ReadAheadTest, ReadAheadNeverServesBytesOlderThanAChange) {
  std::string data;
  InodeNumber ino = MakeFlushedFile(42, &data);
  ExpectSequentialReads(ino, data, 0, 2 << 20);  // windows up to ~18 MiB start
  std::mt19937_64 rng(43);

  std::string patch = RandomBytes(rng, 1 << 20);
  StampBlocks(&patch, 43);
  WriteAt(ino, 5 << 20, patch);  // ahead of the reader, inside a window
  data.replace(5 << 20, patch.size(), patch);
  ExpectSequentialReads(ino, data, 2 << 20, 8 << 20);

  ASSERT_TRUE(fs_->Fallocate(ino, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 10 << 20, 1 << 20).ok());
  std::fill(data.begin() + (10 << 20), data.begin() + (11 << 20), '\0');
  ExpectSequentialReads(ino, data, 8 << 20, 12 << 20);

  ASSERT_TRUE(Truncate(ino, 14 << 20).ok());
  ASSERT_TRUE(Truncate(ino, 24 << 20).ok());
  std::fill(data.begin() + (14 << 20), data.end(), '\0');
  ExpectSequentialReads(ino, data, 12 << 20, data.size());
  EXPECT_GT(fs_->read_ahead_stats().windows_dropped_stale, 0u);
  EXPECT_GT(fs_->read_ahead_stats().bytes_served, 0u);
}

// The kernel's read-ahead (read_ahead_kb past 1 MiB) sends a reader's next
// requests at once, served by several threads in any order: a request that
// lands ahead of or behind where the stream is expected, but within what it
// fetches, continues it. Before, the first far request counted as a jump,
// every window was dropped, and the file was read from the SSD three times.
TEST_P(ReadAheadTest, RequestsOutOfOrderWithinReachContinueTheStream) {
  std::string data;
  InodeNumber ino = MakeFlushedFile(44, &data);
  ExpectSequentialReads(ino, data, 0, 2 << 20);  // the stream runs
  for (uint64_t batch : {2u << 20, 8u << 20, 14u << 20}) {
    for (int mib = 5; mib >= 0; --mib) {  // a batch of 6 requests, last first
      uint64_t at = batch + (static_cast<uint64_t>(mib) << 20);
      auto got = ReadAt(ino, at, 1 << 20);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      ASSERT_TRUE(*got == data.substr(at, 1 << 20)) << "wrong bytes in the MiB at " << at;
    }
  }
  ReadAhead::Stats stats = fs_->read_ahead_stats();
  // 18 of the 20 MiB after the first two came from windows (the first
  // windows start only once the stream runs) and nothing was fetched twice.
  EXPECT_GE(stats.bytes_served, 16u << 20) << "fetched " << stats.bytes_fetched;
  EXPECT_LE(stats.bytes_fetched, data.size());
}

// Reads served by read-ahead reach the sink straight from the window (no
// copy into the caller's scratch), and still never show bytes older than a
// write.
TEST_P(ReadAheadTest, WindowBytesReachTheSinkWithoutACopy) {
  std::string data;
  InodeNumber ino = MakeFlushedFile(44, &data);
  ExpectSequentialReads(ino, data, 0, 2 << 20);  // the stream runs: windows from 2 MiB on
  for (uint64_t at = 2 << 20; at < (6u << 20); at += 1 << 20) {
    AlignedBuffer scratch;
    std::string got;
    auto n = fs_->Read(ino, at, 1 << 20, &scratch, [&](const iovec* pieces, int count) {
      ASSERT_EQ(count, 1);
      got.assign(static_cast<const char*>(pieces[0].iov_base), pieces[0].iov_len);
    });
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    EXPECT_EQ(scratch.size(), 0u) << "the MiB at " << at << " was copied, not served from a window";
    EXPECT_TRUE(got == std::string_view(data).substr(at, 1 << 20)) << "wrong bytes in the MiB at " << at;
  }
  std::mt19937_64 rng(45);
  std::string patch = RandomBytes(rng, 1 << 20);
  StampBlocks(&patch, 45);
  WriteAt(ino, 6 << 20, patch);  // inside a window already fetched
  if (GetParam() != 0) FlushAll();
  data.replace(6 << 20, patch.size(), patch);
  ExpectSequentialReads(ino, data, 6 << 20, 10 << 20);
}

}  // namespace
}  // namespace spillfs
