// Unit tests for fs/block_store.h and fs/uring_engine.h on a temporary image
// file: scatter/gather writes and reads at many offsets and lengths, checked
// byte for byte (also against plain pread of the file), and refusals.
#include "spillfs/store/block_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "spillfs/common/aligned_buffer.h"
#include "spillfs/store/uring_engine.h"
#include "support/temp_dir.h"

namespace spillfs {
namespace {

using testing::TempDir;

constexpr uint64_t kBlock = BlockStore::kDirectAlignment;
constexpr uint64_t kImageSize = 96ull << 20;

void Fill(char* data, uint64_t length, std::mt19937_64* rng) {
  uint64_t i = 0;
  for (; i + 8 <= length; i += 8) {
    uint64_t v = (*rng)();
    std::memcpy(data + i, &v, 8);
  }
  for (; i < length; ++i) data[i] = static_cast<char>((*rng)());
}

// Reads the image with plain pread, independent of the store.
std::string PreadFile(const std::string& path, uint64_t offset, uint64_t length) {
  std::string out(length, '\0');
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  uint64_t done = 0;
  while (done < length) {
    ssize_t n = pread(fd, out.data() + done, length - done, static_cast<off_t>(offset + done));
    if (n <= 0) break;
    done += static_cast<uint64_t>(n);
  }
  close(fd);
  out.resize(done);
  return out;
}

class BlockStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(UringEngine::Available()) << "io_uring cannot be set up in this process";
    image_ = dir_.path() + "/data.img";
    ASSERT_TRUE(BlockStore::CreateImage(image_, kImageSize).ok());
    auto store = BlockStore::Open(image_);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(store).value();
  }

  TempDir dir_{"spillfs-store-test"};
  std::string image_;
  std::unique_ptr<BlockStore> store_;
};

TEST_F(BlockStoreTest, CreateImageAndSizeOf) {
  EXPECT_EQ(store_->size(), kImageSize);
  EXPECT_EQ(store_->path(), image_);
  auto size = BlockStore::SizeOf(image_);
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, kImageSize);
  // The image is sparse: creating it wrote nothing.
  struct stat st {};
  ASSERT_EQ(stat(image_.c_str(), &st), 0);
  EXPECT_LT(static_cast<uint64_t>(st.st_blocks) * 512, kImageSize / 4);

  // Creating over an existing file is refused and leaves it alone.
  Status again = BlockStore::CreateImage(image_, 1 << 20);
  EXPECT_EQ(again.code(), EEXIST) << again.ToString();
  EXPECT_EQ(*BlockStore::SizeOf(image_), kImageSize);

  auto missing = BlockStore::SizeOf(dir_.path() + "/missing.img");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), ENOENT);
  auto directory = BlockStore::SizeOf(dir_.path());
  ASSERT_FALSE(directory.ok());
  EXPECT_EQ(directory.status().code(), EINVAL);
  EXPECT_FALSE(BlockStore::Open(dir_.path() + "/missing.img").ok());

  // An odd size is reported as it is.
  std::string odd = dir_.path() + "/odd.img";
  ASSERT_TRUE(BlockStore::CreateImage(odd, 12345).ok());
  EXPECT_EQ(*BlockStore::SizeOf(odd), 12345u);
}

TEST_F(BlockStoreTest, ManyOffsetsAndLengthsRoundTrip) {
  std::mt19937_64 rng(31337);
  const uint64_t max_len = 8ull << 20;
  AlignedBuffer out(max_len), in(max_len);
  std::vector<uint64_t> lengths = {kBlock,
                                   2 * kBlock,
                                   3 * kBlock,
                                   255 * kBlock,
                                   256 * kBlock,
                                   257 * kBlock,
                                   (1 << 20) - kBlock,
                                   1 << 20,
                                   (1 << 20) + kBlock,
                                   (2 << 20) + 5 * kBlock,
                                   (5 << 20) + 3 * kBlock,
                                   max_len};
  for (int i = 0; i < 12; ++i) lengths.push_back((1 + rng() % (max_len / kBlock)) * kBlock);
  uint64_t expected_written = 0, expected_read = 0;
  for (uint64_t length : lengths) {
    uint64_t offset = (rng() % ((kImageSize - length) / kBlock + 1)) * kBlock;
    Fill(out.data(), length, &rng);
    ASSERT_TRUE(store_->WriteAt(offset, out.data(), length).ok()) << offset << "+" << length;
    std::memset(in.data(), 0xa5, length);
    ASSERT_TRUE(store_->ReadAt(offset, in.data(), length).ok());
    ASSERT_EQ(std::memcmp(out.data(), in.data(), length), 0) << offset << "+" << length;
    // The bytes really are at that offset of the file.
    ASSERT_EQ(PreadFile(image_, offset, length), std::string(out.data(), length)) << offset;
    expected_written += length;
    expected_read += length;
  }
  EXPECT_EQ(store_->bytes_written(), expected_written);
  EXPECT_EQ(store_->bytes_read(), expected_read);
}

TEST_F(BlockStoreTest, LastBlockAndFirstBlock) {
  std::mt19937_64 rng(5);
  AlignedBuffer out(2 * kBlock), in(2 * kBlock);
  Fill(out.data(), 2 * kBlock, &rng);
  ASSERT_TRUE(store_->WriteAt(kImageSize - kBlock, out.data(), kBlock).ok());
  ASSERT_TRUE(store_->WriteAt(0, out.data() + kBlock, kBlock).ok());
  ASSERT_TRUE(store_->ReadAt(kImageSize - kBlock, in.data(), kBlock).ok());
  ASSERT_TRUE(store_->ReadAt(0, in.data() + kBlock, kBlock).ok());
  EXPECT_EQ(std::memcmp(out.data(), in.data(), 2 * kBlock), 0);
}

// Scatter: one buffer written to many extents in a random order of the
// store, gathered back with a different split, and checked per extent.
TEST_F(BlockStoreTest, ScatterGatherLists) {
  std::mt19937_64 rng(2024);
  for (int round = 0; round < 6; ++round) {
    // Cut the store into slots of 8 MiB and pick extents inside distinct slots.
    const uint64_t slot = 8ull << 20;
    std::vector<uint64_t> slots(kImageSize / slot);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
    size_t count = 1 + rng() % slots.size();
    std::vector<PhysicalExtent> extents;
    uint64_t total = 0;
    for (size_t i = 0; i < count; ++i) {
      uint64_t length = (1 + rng() % (round % 2 ? 512 : 16)) * kBlock;  // up to 2 MiB
      uint64_t offset = slots[i] * slot + (rng() % ((slot - length) / kBlock + 1)) * kBlock;
      extents.push_back({offset, length});
      total += length;
    }
    AlignedBuffer out(total), in(total);
    Fill(out.data(), total, &rng);
    ASSERT_TRUE(store_->Write(extents, out.data()).ok());

    // Gather back block by block, in reverse order, as independent slices.
    std::memset(in.data(), 0, total);
    std::vector<IoSlice> slices;
    uint64_t at = 0;
    for (const auto& e : extents) {
      for (uint64_t b = 0; b < e.length; b += kBlock) slices.push_back({e.offset + b, in.data() + at + b, kBlock});
      at += e.length;
    }
    std::reverse(slices.begin(), slices.end());
    ASSERT_TRUE(store_->ReadSlices(slices).ok());
    ASSERT_EQ(std::memcmp(out.data(), in.data(), total), 0) << "round " << round;

    // And through Read with the same list.
    std::memset(in.data(), 0, total);
    ASSERT_TRUE(store_->Read(extents, in.data()).ok());
    ASSERT_EQ(std::memcmp(out.data(), in.data(), total), 0) << "round " << round;

    // Each extent holds its own slice of the buffer, at its own offset.
    at = 0;
    for (const auto& e : extents) {
      ASSERT_EQ(PreadFile(image_, e.offset, e.length), std::string(out.data() + at, e.length))
          << "extent at " << e.offset;
      at += e.length;
    }
  }
}

TEST_F(BlockStoreTest, WriteSlicesFromSeparateBuffers) {
  std::mt19937_64 rng(77);
  std::vector<AlignedBuffer> buffers;
  std::vector<IoSlice> slices;
  for (int i = 0; i < 40; ++i) {
    uint64_t length = (1 + rng() % 300) * kBlock;
    buffers.emplace_back(length);
    Fill(buffers.back().data(), length, &rng);
    slices.push_back({static_cast<uint64_t>(i) * (2ull << 20), nullptr, length});
  }
  for (size_t i = 0; i < slices.size(); ++i) slices[i].buffer = buffers[i].data();
  ASSERT_TRUE(store_->WriteSlices(slices).ok());
  for (size_t i = 0; i < slices.size(); ++i) {
    AlignedBuffer in(slices[i].length);
    ASSERT_TRUE(store_->ReadAt(slices[i].offset, in.data(), slices[i].length).ok());
    ASSERT_EQ(std::memcmp(in.data(), buffers[i].data(), slices[i].length), 0) << i;
  }
}

TEST_F(BlockStoreTest, DataSurvivesReopen) {
  std::mt19937_64 rng(8);
  AlignedBuffer out(3 << 20), in(3 << 20);
  Fill(out.data(), out.size(), &rng);
  ASSERT_TRUE(store_->WriteAt(40 << 20, out.data(), out.size()).ok());
  ASSERT_TRUE(store_->Flush().ok());
  store_.reset();
  auto reopened = BlockStore::Open(image_, /*read_only=*/true);
  ASSERT_TRUE(reopened.ok());
  ASSERT_TRUE((*reopened)->ReadAt(40 << 20, in.data(), in.size()).ok());
  EXPECT_EQ(std::memcmp(out.data(), in.data(), out.size()), 0);
  // A read-only store refuses writes.
  EXPECT_FALSE((*reopened)->WriteAt(0, out.data(), kBlock).ok());
}

// One writer at a time: a second writable open of a data area in use waits
// for the writer lock, then is refused with EBUSY naming the area; readers
// (fsck, the inspector) are not stopped; once the writer is gone, a writable
// open gets the lock at once.
TEST_F(BlockStoreTest, OneWriterAtATime) {
  auto second = BlockStore::Open(image_);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), EBUSY) << second.status().ToString();
  EXPECT_NE(second.status().message().find(image_), std::string::npos) << second.status().ToString();
  EXPECT_TRUE(BlockStore::Open(image_, /*read_only=*/true).ok());
  store_.reset();
  const auto start = std::chrono::steady_clock::now();
  auto after = BlockStore::Open(image_);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
}

// Several threads writing and syncing at once: every Flush succeeds, and
// those that overlap share fdatasync calls (never more than one per Flush).
TEST_F(BlockStoreTest, ConcurrentFlushesAllSucceed) {
  constexpr int kThreads = 4, kRounds = 20;
  const uint64_t syncs_before = store_->syncs();
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(100 + t);
      AlignedBuffer out(1 << 20);
      Fill(out.data(), out.size(), &rng);
      for (int round = 0; round < kRounds; ++round) {
        if (!store_->WriteAt(static_cast<uint64_t>(t) << 20, out.data(), out.size()).ok()) ++failures;
        if (!store_->Flush().ok()) ++failures;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  const uint64_t syncs = store_->syncs() - syncs_before;
  EXPECT_GE(syncs, 1u);
  EXPECT_LE(syncs, static_cast<uint64_t>(kThreads * kRounds));
}

TEST_F(BlockStoreTest, OutOfRangeExtentsAreRefused) {
  std::mt19937_64 rng(9);
  AlignedBuffer buffer(2 * kBlock);
  Fill(buffer.data(), buffer.size(), &rng);
  std::string before = PreadFile(image_, kImageSize - kBlock, kBlock);

  const std::vector<PhysicalExtent> bad = {
      {kImageSize, kBlock},                   // just past the end
      {kImageSize - kBlock, 2 * kBlock},      // straddles the end
      {kImageSize + (1ull << 30), kBlock},    // far past the end
      {UINT64_MAX - kBlock + 1, 2 * kBlock},  // wraps around
      {UINT64_MAX & ~(kBlock - 1), kBlock},
  };
  for (const auto& e : bad) {
    Status w = store_->Write({e}, buffer.data());
    EXPECT_FALSE(w.ok()) << "write at " << e.offset << "+" << e.length;
    Status r = store_->Read({e}, buffer.data());
    EXPECT_FALSE(r.ok()) << "read at " << e.offset << "+" << e.length;
    // A valid extent listed first does not make the list acceptable.
    Status mixed = store_->Write({{0, kBlock}, e}, buffer.data());
    EXPECT_FALSE(mixed.ok());
  }
  EXPECT_EQ(store_->bytes_written(), 0u);
  EXPECT_EQ(store_->bytes_read(), 0u);
  EXPECT_EQ(PreadFile(image_, kImageSize - kBlock, kBlock), before);
  EXPECT_EQ(PreadFile(image_, 0, kBlock), std::string(kBlock, '\0')) << "a refused list wrote its valid part";
}

TEST(UringEngineTest, SubmitsAtEveryQueueDepth) {
  ASSERT_TRUE(UringEngine::Available());
  TempDir dir{"spillfs-store-test"};
  std::string path = dir.path() + "/plain";
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  std::mt19937_64 rng(3);
  constexpr uint32_t kPiece = 12345;  // buffered fd: no alignment needed
  constexpr int kPieces = 300;
  std::string data(kPiece * kPieces, '\0');
  Fill(data.data(), data.size(), &rng);
  for (unsigned depth : {1u, 4u, 32u, 128u, 1000u}) {
    ASSERT_EQ(ftruncate(fd, 0), 0);
    std::vector<IoRequest> writes;
    for (int i = kPieces - 1; i >= 0; --i) {
      writes.push_back({fd, true, uint64_t{kPiece} * i, data.data() + uint64_t{kPiece} * i, kPiece});
    }
    ASSERT_TRUE(UringEngine::Submit(writes, depth).ok()) << depth;
    std::string back(data.size(), '\0');
    std::vector<IoRequest> reads;
    for (int i = 0; i < kPieces; ++i) {
      reads.push_back({fd, false, uint64_t{kPiece} * i, back.data() + uint64_t{kPiece} * i, kPiece});
    }
    ASSERT_TRUE(UringEngine::Submit(reads, depth).ok()) << depth;
    EXPECT_EQ(back, data) << "queue depth " << depth;
  }
  // Reading past the end of the file is an error, not a silent short read.
  char byte;
  std::vector<IoRequest> past = {{fd, false, data.size() + 100, &byte, 1}};
  EXPECT_FALSE(UringEngine::Submit(past).ok());
  // A bad descriptor reports an error.
  std::vector<IoRequest> bad_fd = {{-1, false, 0, &byte, 1}};
  EXPECT_FALSE(UringEngine::Submit(bad_fd).ok());
  // Nothing to do is fine.
  std::vector<IoRequest> none;
  EXPECT_TRUE(UringEngine::Submit(none).ok());
  close(fd);
}

TEST(UringEngineTest, EachThreadHasItsOwnRing) {
  TempDir dir{"spillfs-store-test"};
  std::string path = dir.path() + "/plain";
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  constexpr int kThreads = 4;
  constexpr uint32_t kPiece = 4096;
  constexpr int kPieces = 200;
  std::vector<std::string> data(kThreads);
  std::vector<int> ok(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      data[t].resize(kPiece * kPieces);
      Fill(data[t].data(), data[t].size(), &rng);
      uint64_t base = uint64_t{kPiece} * kPieces * t;
      for (int rep = 0; rep < 5; ++rep) {
        std::vector<IoRequest> writes;
        for (int i = 0; i < kPieces; ++i) {
          writes.push_back({fd, true, base + uint64_t{kPiece} * i, data[t].data() + uint64_t{kPiece} * i, kPiece});
        }
        if (!UringEngine::Submit(writes, 16).ok()) return;
        std::string back(data[t].size(), '\0');
        std::vector<IoRequest> reads;
        for (int i = 0; i < kPieces; ++i) {
          reads.push_back({fd, false, base + uint64_t{kPiece} * i, back.data() + uint64_t{kPiece} * i, kPiece});
        }
        if (!UringEngine::Submit(reads, 16).ok() || back != data[t]) return;
      }
      ok[t] = 1;
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(ok[t], 1) << "thread " << t;
  close(fd);
}

}  // namespace
}  // namespace spillfs
