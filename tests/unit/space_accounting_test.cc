// Unit tests of space accounting through the POSIX core (the allocator and
// the reclaim gate, spillfs/store/allocator.h and spillfs/store/reclaim_gate.h, under
// core/file_data.cc): every block is free or mapped exactly once, deleting
// gives all space back, a full volume gives ENOSPC and recovers, and freed
// blocks are reused only when no reader and no power cut can still see them.
// Dedup's sharing: direct_dedup_test.cc.
#include <gtest/gtest.h>
#include <linux/falloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "filesystem_fixture.h"
#include "spillfs/common/aligned_buffer.h"
#include "spillfs/common/block_checksum.h"
#include "support/random_bytes.h"
#include "support/read_bytes.h"

namespace spillfs {
namespace {

using testing::RandomBytes;
using testing::ReadBytes;

INSTANTIATE_TEST_SUITE_P(Tiers, FilesystemDataTest, kTiers, TierName);

TEST_P(FilesystemDataTest, DeletingEverythingReturnsAllSpace) {
  std::mt19937_64 rng(13);
  InodeNumber dir = MakeDir(kRootInode, "dir");
  std::vector<std::pair<InodeNumber, std::string>> names;  // parent, name
  std::vector<InodeNumber> files;
  for (int i = 0; i < 12; ++i) {
    InodeNumber parent = i % 2 ? dir : kRootInode;
    std::string name = "file" + std::to_string(i);
    InodeNumber ino = MakeFile(parent, name);
    names.emplace_back(parent, name);
    files.push_back(ino);
  }
  // A mix of every operation that maps or unmaps space.
  for (int step = 0; step < 300; ++step) {
    InodeNumber ino = files[rng() % files.size()];
    switch (rng() % 8) {
      case 0:
      case 1:
      case 2: {
        std::string data = RandomBytes(rng, 1 + rng() % 40000);
        WriteAt(ino, rng() % 200000, data);
        break;
      }
      case 3:
        ASSERT_TRUE(Truncate(ino, rng() % 150000).ok());
        break;
      case 4:
        ASSERT_TRUE(
            fs_->Fallocate(ino, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, rng() % 150000, 1 + rng() % 50000).ok());
        break;
      case 5:
        ASSERT_TRUE(fs_->Fallocate(ino, rng() % 2 ? 0 : FALLOC_FL_KEEP_SIZE, rng() % 150000, 1 + rng() % 30000).ok());
        break;
      case 6:
        ASSERT_TRUE(fs_->Fallocate(ino, FALLOC_FL_ZERO_RANGE, rng() % 150000, 1 + rng() % 30000).ok());
        break;
      default: {
        // Replace one file by another through rename.
        size_t from = rng() % names.size(), to = rng() % names.size();
        if (from == to) break;
        ASSERT_TRUE(fs_->Rename(names[from].first, names[from].second, names[to].first, names[to].second, 0).ok());
        InodeNumber moved = files[from];
        names.erase(names.begin() + static_cast<long>(from));
        files.erase(files.begin() + static_cast<long>(from));
        if (to > from) --to;
        files[to] = moved;
        InodeNumber fresh = MakeFile(kRootInode, "again" + std::to_string(step));
        names.emplace_back(kRootInode, "again" + std::to_string(step));
        files.push_back(fresh);
        break;
      }
    }
    if (step % 60 == 59) {
      for (InodeNumber f : files) ExpectExtentMapSane(f);
      ExpectSpaceAccountedFor();
      if (HasFailure()) return;
    }
  }
  // Files with equal contents (whole aligned 256 KiB units: what a
  // deduplicating volume may share), one of them partly overwritten later.
  const std::string same = RandomBytes(rng, 1 << 20);
  std::vector<InodeNumber> copies;
  for (int i = 0; i < 3; ++i) {
    std::string name = "copy" + std::to_string(i);
    copies.push_back(MakeFile(dir, name));
    names.emplace_back(dir, name);
    WriteAt(copies.back(), i == 2 ? 256 << 10 : 0, same);
    FlushAll();
  }
  std::string changed = RandomBytes(rng, 5000);
  WriteAt(copies[1], 300000, changed);
  std::string expected = same;
  expected.replace(300000, changed.size(), changed);
  EXPECT_TRUE(SameBytes(ReadAll(copies[0]), same));
  EXPECT_TRUE(SameBytes(ReadAll(copies[1]), expected));
  EXPECT_TRUE(SameBytes(ReadAll(copies[2]), std::string(256 << 10, '\0') + same));
  ExpectSpaceAccountedFor();

  ASSERT_TRUE(fs_->Link(files[0], dir, "extra-link").ok());
  ASSERT_TRUE(fs_->Symlink(dir, "sym", "file0", caller_).ok());
  EXPECT_LT(FreeBlocks(), initial_free_);

  Reopen();  // the persisted free list must agree too
  for (const auto& [parent, name] : names) ASSERT_TRUE(fs_->Unlink(parent, name).ok()) << name;
  ASSERT_TRUE(fs_->Unlink(dir, "extra-link").ok());
  ASSERT_TRUE(fs_->Unlink(dir, "sym").ok());
  ASSERT_TRUE(fs_->Rmdir(kRootInode, "dir").ok());

  EXPECT_EQ(FreeBlocks(), initial_free_);
  EXPECT_EQ(fs_->StatFs().f_blocks, initial_free_);
  EXPECT_EQ(CountKeys(Family::kExtent), 0u);
  EXPECT_EQ(CountKeys(Family::kInode), 1u);  // the root
  EXPECT_EQ(CountKeys(Family::kDirent), 0u);
  EXPECT_EQ(CountKeys(Family::kFree), 1u);
  EXPECT_EQ(CountKeys(Family::kBlob), 0u);
  std::string value;
  ASSERT_TRUE(index().Get(Family::kFree, keys::Free(Volume::kDataOffset), &value).ok());
  coding::Reader reader(value);
  uint64_t length = 0;
  ASSERT_TRUE(reader.GetVarint64(&length));
  EXPECT_EQ(length, kVolumeSize - Volume::kDataOffset);
  Reopen();
  EXPECT_EQ(FreeBlocks(), initial_free_);
}

// Writers keep overwriting two files with whole blocks of one byte value
// each ("A" bytes 0x01..0x7f, "B" bytes 0x81..0xff) while readers read them,
// on a volume filled up but for a few blocks, so that freed blocks are reused
// almost at once. Redirect-on-write frees the old blocks of every overwrite;
// none may be reused under a reader (the inode's I/O lock and the reclaim
// gate see to it), so a reader only ever sees uniform blocks of its own file
// and no checksum error.
TEST_P(FilesystemDataTest, ConcurrentOverwritesNeverLeakIntoReaders) {
  constexpr size_t kFileBlocks = 16;
  constexpr size_t kFileBytes = kFileBlocks * kBlock;
  constexpr uint64_t kSpareBlocks = 64;
  constexpr int kWrites = 1000;  // per writer
  InodeNumber files[2] = {MakeFile(kRootInode, "A"), MakeFile(kRootInode, "B")};
  for (int f = 0; f < 2; ++f) {
    WriteAt(files[f], 0, std::string(kFileBytes, static_cast<char>(f ? 0x81 : 0x01)));
  }
  InodeNumber filler = MakeFile(kRootInode, "filler");
  std::string chunk(4 << 20, '\x7f');
  uint64_t filled = 0;
  while (FreeBlocks() > kSpareBlocks) {
    uint64_t bytes = std::min<uint64_t>(chunk.size(), (FreeBlocks() - kSpareBlocks) * kBlock);
    StampBlocks(&chunk, filled);
    ASSERT_TRUE(fs_->Write(filler, filled, chunk.data(), bytes).ok());
    filled += bytes;
  }
  ASSERT_EQ(FreeBlocks(), kSpareBlocks);

  std::atomic<bool> done{false};
  std::atomic<int> bad{0}, reads{0}, errors{0};
  std::mutex error_mu;
  std::string first_error;
  auto note_error = [&](const Status& s) {
    std::lock_guard lock(error_mu);
    if (errors++ == 0) first_error = s.ToString();
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::vector<std::thread> threads;
  for (int f = 0; f < 2; ++f) {
    threads.emplace_back([&, f] {  // writer
      std::mt19937 rng(f + 1);
      for (int i = 0; i < kWrites; ++i) {
        char value = static_cast<char>((f ? 0x81 : 0x01) + i % 0x7f);
        size_t first = rng() % kFileBlocks;
        size_t count = 1 + rng() % std::min<size_t>(4, kFileBlocks - first);
        std::string data(count * kBlock, value);
        for (;;) {
          auto n = fs_->Write(files[f], first * kBlock, data.data(), data.size());
          if (n.ok()) break;
          // Space held back for a reader comes back once it leaves: ENOSPC
          // may happen for a moment on a nearly full volume, but not for long.
          if (n.status().code() != ENOSPC || std::chrono::steady_clock::now() > deadline) {
            note_error(n.status());
            return;
          }
          std::this_thread::yield();
        }
      }
    });
    threads.emplace_back([&, f] {  // reader
      while (!done.load()) {
        auto n = ReadBytes(*fs_, files[f], 0, kFileBytes);
        ++reads;
        if (!n.ok() || n->size() != kFileBytes) {
          note_error(n.ok() ? Status::IOError("short read") : n.status());
          continue;
        }
        const char* data = n->data();
        for (size_t b = 0; b < kFileBytes; b += kBlock) {
          unsigned char v = static_cast<unsigned char>(data[b]);
          bool mine = f ? v >= 0x81 : (v >= 0x01 && v <= 0x7f);
          if (!mine || std::string_view(data + b, kBlock) != std::string(kBlock, data[b])) ++bad;
        }
      }
    });
  }
  threads[0].join();
  threads[2].join();
  while (reads.load() < 20) std::this_thread::yield();
  done = true;
  threads[1].join();
  threads[3].join();
  EXPECT_EQ(errors.load(), 0) << "first: " << first_error;
  EXPECT_EQ(bad.load(), 0) << "a reader saw a block that was reused or torn";
  EXPECT_EQ(fs_->counters().checksum_errors.load(), 0u);
  EXPECT_EQ(FreeBlocks(), kSpareBlocks);
  ExpectSpaceAccountedFor();
}

TEST_P(FilesystemDataTest, FullVolumeGivesENOSPCAndRecovers) {
  std::mt19937_64 rng(14);
  InodeNumber big = MakeFile(kRootInode, "big");
  std::string chunk = RandomBytes(rng, 4 << 20);
  uint64_t offset = 0;
  Status last;
  std::string first_chunk;
  for (int i = 0; i < 64; ++i) {
    StampBlocks(&chunk, i);  // every chunk distinct: dedup must not absorb them
    if (i == 0) first_chunk = chunk;
    auto n = fs_->Write(big, offset, chunk.data(), chunk.size());
    if (!n.ok()) {
      last = n.status();
      break;
    }
    offset += *n;
  }
  ASSERT_FALSE(last.ok()) << "a 63 MiB volume took 256 MiB";
  EXPECT_EQ(last.code(), ENOSPC);
  EXPECT_EQ(Size(big), offset) << "a failed write changed the size";
  EXPECT_LT(FreeBlocks(), chunk.size() / kBlock);
  // What was written is intact, and deleting frees it all.
  auto head = ReadAt(big, 0, chunk.size());
  ASSERT_TRUE(head.ok());
  EXPECT_TRUE(SameBytes(*head, first_chunk));
  ASSERT_TRUE(fs_->Unlink(kRootInode, "big").ok());
  EXPECT_EQ(FreeBlocks(), initial_free_);
  InodeNumber again = MakeFile(kRootInode, "again");
  WriteAt(again, 0, chunk);
  EXPECT_TRUE(SameBytes(ReadAll(again), chunk));
}

// Space freed by an unlink is not reused while the batch that freed it is
// not durable: a power cut could bring the file back with its old mapping.
// A write that needs that space syncs the index first instead of failing.
TEST_P(FilesystemDataTest, FreedSpaceIsReusedOnlyOnceItsBatchIsDurable) {
  std::mt19937_64 rng(21);
  auto physical = [&](InodeNumber ino) {
    std::vector<PhysicalExtent> out;
    for (const auto& [offset, record] : Extents(ino)) out.push_back({record.physical, record.length});
    return out;
  };
  auto overlaps = [](const std::vector<PhysicalExtent>& a, const std::vector<PhysicalExtent>& b) {
    for (const auto& x : a) {
      for (const auto& y : b) {
        if (x.offset < y.offset + y.length && y.offset < x.offset + x.length) return true;
      }
    }
    return false;
  };
  InodeNumber a = MakeFile(kRootInode, "a");
  WriteAt(a, 0, RandomBytes(rng, 1 << 20));
  // Everything but 512 KiB is taken.
  InodeNumber filler = MakeFile(kRootInode, "filler");
  const uint64_t fill = FreeBlocks() * kBlock - (512 << 10);
  for (uint64_t at = 0; at < fill; at += 4 << 20) {  // pieces the RAM tier takes at once
    WriteAt(filler, at, RandomBytes(rng, std::min<uint64_t>(4 << 20, fill - at)));
  }
  ASSERT_EQ(FreeBlocks() * kBlock, 512u << 10);
  ASSERT_TRUE(fs_->SyncAll().ok());
  const std::vector<PhysicalExtent> old = physical(a);

  ASSERT_TRUE(fs_->Unlink(kRootInode, "a").ok());
  const uint64_t unlink = index().last_commit();
  ASSERT_LT(index().durable_commit(), unlink);
  EXPECT_EQ(FreeBlocks() * kBlock, (512u << 10) + (1u << 20)) << "parked space counts as free";

  // 256 KiB fits in what was free before: a's blocks stay as they were.
  InodeNumber b = MakeFile(kRootInode, "b");
  std::string b_data = RandomBytes(rng, 256 << 10);
  WriteAt(b, 0, b_data);
  EXPECT_FALSE(overlaps(physical(b), old)) << "a's blocks reused before its unlink was durable";
  EXPECT_LT(index().durable_commit(), unlink) << "synced although there was room";

  // 512 KiB more fits only in a's old space: the write syncs, then reuses it.
  InodeNumber c = MakeFile(kRootInode, "c");
  std::string c_data = RandomBytes(rng, 512 << 10);
  WriteAt(c, 0, c_data);
  EXPECT_TRUE(overlaps(physical(c), old));
  EXPECT_GE(index().durable_commit(), unlink);
  EXPECT_TRUE(SameBytes(ReadAll(b), b_data));
  EXPECT_TRUE(SameBytes(ReadAll(c), c_data));
  ExpectSpaceAccountedFor();
}

}  // namespace
}  // namespace spillfs
