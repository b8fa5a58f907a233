// Unit tests of the RAM tier (spillfs/cache/ram_tier.h, cache/ram_tier_flusher.cc,
// core/ram_tier_io.cc): the write-back flusher, room made for writers, reads
// served from its chunks, and attributes while a flush commits.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "filesystem_fixture.h"
#include "support/eventually.h"
#include "support/random_bytes.h"

namespace spillfs {
namespace {

using testing::Eventually;
using testing::RandomBytes;

INSTANTIATE_TEST_SUITE_P(Tiers, FilesystemDataTest, kTiers, TierName);

// getattr while the file's cached data is flushed: a flush commits the size
// and then drops the RAM tier's overlay, so an attribute read that took the
// record before the commit and looked for the overlay after the drop would
// show the old size (0 for a new file).
class RamTierFilesystemTest : public FilesystemTestBase {
 protected:
  uint64_t RamTier() const override { return 32 << 20; }
};

TEST_F(RamTierFilesystemTest, GetAttrDuringAFlushShowsTheWrittenSize) {
  const std::string data(64 * 1024, 'x');
  std::atomic<int> wrong{0};
  for (int i = 0; i < 300; ++i) {
    InodeNumber ino = MakeFile(kRootInode, "f" + std::to_string(i));
    WriteAt(ino, 0, data);
    std::atomic<bool> done{false};
    std::thread watcher([&] {
      while (!done.load()) {
        auto entry = fs_->GetAttr(ino);
        if (entry.ok() && entry->attr.st_size != static_cast<off_t>(data.size())) ++wrong;
      }
    });
    ASSERT_TRUE(fs_->Fsync(ino, false).ok());
    done = true;
    watcher.join();
  }
  EXPECT_EQ(wrong.load(), 0);
}

// The background flusher makes the data durable before it maps it
// (FlushBeforeMapping), before anyone calls fsync; an fsync then still runs a
// sync of its own (it must report a write-back lost since the last one).
class FlusherSyncTest : public FilesystemTestBase {
 protected:
  uint64_t RamTier() const override { return 32 << 20; }
  void Tune(FilesystemOptions* options) const override {
    options->flush_age_ms = 10;  // the flusher takes the data at once
  }
  BlockStore& store() { return fs_->volume().store(); }
};

TEST_F(FlusherSyncTest, FlusherSyncsTheDataAreaWithoutAnFsync) {
  const uint64_t syncs_before = store().syncs();
  InodeNumber ino = MakeFile(kRootInode, "f");
  std::mt19937_64 rng(5);
  const std::string data = RandomBytes(rng, 8 << 20);  // nothing for dedup to share
  for (uint64_t mib = 0; mib < 8; ++mib) WriteAt(ino, mib << 20, data.substr(mib << 20, 1 << 20));
  auto committed_size = [&] {
    auto record = fs_->volume().index().GetInode(ino);
    return record.ok() ? record->size : 0;
  };
  ASSERT_TRUE(Eventually([&] { return committed_size() == 8u << 20; }, std::chrono::seconds(20)))
      << "the flusher did not write and map the file";
  EXPECT_GT(store().syncs(), syncs_before) << "the flusher mapped data it had not made durable";
  const uint64_t syncs_after_flush = store().syncs();
  ASSERT_TRUE(fs_->Fsync(ino, false).ok());
  EXPECT_GE(store().syncs(), syncs_after_flush + 1);
  EXPECT_TRUE(SameBytes(ReadAll(ino), data));
}

// Files that each end in a partly filled chunk and are no longer written
// (small ephemeral files: close does not flush them) must not hold the RAM
// tier full: once idle, the flusher writes their last chunks out too.
class SmallRamTierTest : public FilesystemTestBase {
 protected:
  uint64_t RamTier() const override { return 4 << 20; }  // 16 chunks
  void Tune(FilesystemOptions* options) const override {
    options->flush_age_ms = 10;
    options->ram_tier_warm_bytes = 0;
  }
};

TEST_F(SmallRamTierTest, IdleFilesDoNotHoldTheTierWithTheirLastChunks) {
  const std::string data(64 << 10, 'e');  // a quarter of a chunk each
  std::vector<InodeNumber> files;
  for (int i = 0; i < 14; ++i) {  // 14 chunks: past the 3/4 mark, pressure
    files.push_back(MakeFile(kRootInode, "e" + std::to_string(i)));
    ASSERT_TRUE(fs_->SetXattr(files.back(), "user.spillfs.ephemeral", "1", 0).ok());
    WriteAt(files.back(), 0, data);
  }
  const uint64_t capacity = fs_->ram_tier_stats().capacity_bytes;
  // Below the pressure mark (3/4): the flusher need not go further.
  EXPECT_TRUE(
      Eventually([&] { return fs_->ram_tier_stats().used_bytes <= capacity / 4 * 3; }, std::chrono::seconds(10)))
      << "the tier stays at " << fs_->ram_tier_stats().used_bytes << " of " << capacity << " bytes";
  for (InodeNumber ino : files) EXPECT_TRUE(SameBytes(ReadAll(ino), data));
}

// A write larger than the whole tier can never fit in it: it goes to the
// SSD at once, without waiting for room (it waited 5 s for each such write:
// with --max-request 32M, every large write to a tier under 33 MiB). A write
// that fits but finds the tier too full has the flusher make room for it at
// once, though the tier is below its high watermark and no file is old.
class TinyRamTierTest : public FilesystemTestBase {
 protected:
  uint64_t RamTier() const override { return 1 << 20; }  // 4 chunks
  void Tune(FilesystemOptions* options) const override {
    options->ram_tier_warm_bytes = 0;
    options->flush_age_ms = 60'000;  // nothing is flushed for its age here
  }
};

TEST_F(TinyRamTierTest, AWriteLargerThanTheTierGoesStraightToTheSsd) {
  InodeNumber ino = MakeFile(kRootInode, "big");
  std::mt19937_64 rng(3);
  const std::string small = RandomBytes(rng, 64 << 10);
  WriteAt(ino, 4096, small);
  EXPECT_EQ(fs_->ram_tier_stats().dirty_bytes, small.size()) << "a small write goes to the tier";
  const std::string big = RandomBytes(rng, (1 << 20) + 4096);  // 5 chunks: more than the tier
  WriteAt(ino, 0, big);                                        // over the small one, still in the tier
  EXPECT_EQ(fs_->ram_tier_stats().room_wait_timeouts, 0u) << "the write waited for room that could never be";
  EXPECT_EQ(fs_->ram_tier_stats().dirty_bytes, 0u) << "the cached bytes under the write were not flushed first";
  EXPECT_TRUE(SameBytes(ReadAll(ino), big));
  Reopen();
  EXPECT_TRUE(SameBytes(ReadAll(ino), big)) << "after reopening";
}

TEST_F(TinyRamTierTest, AWaitingWriterHasRoomMadeForIt) {
  std::mt19937_64 rng(4);
  InodeNumber first = MakeFile(kRootInode, "first");
  const std::string half = RandomBytes(rng, 512 << 10);  // 2 chunks, under the watermark (3)
  WriteAt(first, 0, half);
  InodeNumber second = MakeFile(kRootInode, "second");
  const std::string more = RandomBytes(rng, 600 << 10);  // spans 3 chunks: 5 in all
  WriteAt(second, 0, more);
  EXPECT_EQ(fs_->ram_tier_stats().room_wait_timeouts, 0u) << "the writer waited 5 s in vain";
  EXPECT_EQ(fs_->ram_tier_stats().dirty_bytes, more.size()) << "the second write did not go to the tier";
  EXPECT_TRUE(SameBytes(ReadAll(first), half));
  EXPECT_TRUE(SameBytes(ReadAll(second), more));
}

// Reads of data still in the RAM tier reach the sink straight from its chunks
// (no copy); unaligned edges are cut exactly.
TEST_P(FilesystemDataTest, RamTierReadsPointIntoTheChunks) {
  std::mt19937_64 rng(46);
  std::string data = RandomBytes(rng, (3 << 20) + 1234);
  InodeNumber ino = MakeFile(kRootInode, "cached");
  WriteAt(ino, 0, data);
  for (auto [offset, size] : {std::pair<uint64_t, size_t>{0, 1 << 20}, {4095, 600001}, {(1 << 20) + 7, 2 << 20}}) {
    AlignedBuffer scratch;
    std::string got;
    int pieces_seen = 0;
    auto n = fs_->Read(ino, offset, size, &scratch, [&](const iovec* pieces, int count) {
      pieces_seen = count;
      for (int i = 0; i < count; ++i) got.append(static_cast<const char*>(pieces[i].iov_base), pieces[i].iov_len);
    });
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    uint64_t expected = std::min<uint64_t>(size, data.size() - offset);
    ASSERT_EQ(*n, expected);
    EXPECT_TRUE(got == std::string_view(data).substr(offset, expected)) << "at " << offset;
    // A RAM tier holds the bytes in chunks (one piece per 256 KiB chunk at
    // most); without one they are read into the scratch buffer.
    if (GetParam() != 0) {
      EXPECT_EQ(scratch.size(), 0u) << "at " << offset;
      EXPECT_GE(pieces_seen, 1);
      EXPECT_LE(static_cast<uint64_t>(pieces_seen), expected / (256 << 10) + 2) << "at " << offset;
    } else {
      EXPECT_GT(scratch.size(), 0u) << "at " << offset;
    }
  }
  // Once those reads are done, writes go through and reads show them.
  std::string patch = RandomBytes(rng, 8192);
  WriteAt(ino, 4096, patch);
  data.replace(4096, patch.size(), patch);
  auto got = ReadAt(ino, 0, data.size());
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(*got == data);
}

// A getattr racing with the flush that commits a file's size and drops its
// RAM-tier overlay never shows a size older than a write that had returned.
TEST_P(FilesystemDataTest, GetAttrDuringFlushNeverShowsAnOlderSize) {
  InodeNumber ino = MakeFile(kRootInode, "growing");
  std::atomic<uint64_t> written{0};
  std::atomic<bool> done{false};
  std::atomic<uint64_t> stale{0};
  std::string last_stale;
  std::thread reader([&] {
    while (!done.load()) {
      uint64_t at_least = written.load();
      auto attr = fs_->GetAttr(ino);
      if (attr.ok() && static_cast<uint64_t>(attr->attr.st_size) < at_least && stale.fetch_add(1) == 0) {
        last_stale = std::to_string(attr->attr.st_size) + " < " + std::to_string(at_least);
      }
    }
  });
  const std::string block(4096, 'g');
  for (uint64_t i = 0; i < 2000; ++i) {
    WriteAt(ino, i * block.size(), block);
    written.store((i + 1) * block.size());
    ASSERT_TRUE(fs_->Flush(ino).ok());
  }
  done.store(true);
  reader.join();
  EXPECT_EQ(stale.load(), 0u) << "getattr answers older than a finished write, first: " << last_stale;
}

// st_blocks counts a block once while its flush commits: the committed
// record (allocated bytes) and the RAM tier's overlay (dirty bytes) must not
// both count the batch being mapped. Each block here is written once, so
// st_blocks never exceeds the size.
TEST_P(FilesystemDataTest, GetAttrDuringFlushNeverCountsBlocksTwice) {
  InodeNumber ino = MakeFile(kRootInode, "counted");
  std::atomic<bool> done{false};
  std::atomic<uint64_t> twice{0};
  std::string first_twice;
  std::thread reader([&] {
    while (!done.load()) {
      auto attr = fs_->GetAttr(ino);
      if (attr.ok() && static_cast<uint64_t>(attr->attr.st_blocks) * 512 > static_cast<uint64_t>(attr->attr.st_size) &&
          twice.fetch_add(1) == 0) {
        first_twice = std::to_string(attr->attr.st_blocks) + " blocks of 512 for " +
                      std::to_string(attr->attr.st_size) + " bytes";
      }
    }
  });
  const std::string block(4096, 'c');
  for (uint64_t i = 0; i < 2000; ++i) {
    WriteAt(ino, i * block.size(), block);
    ASSERT_TRUE(fs_->Flush(ino).ok());
  }
  done.store(true);
  reader.join();
  EXPECT_EQ(twice.load(), 0u) << "getattr counted blocks twice, first: " << first_twice;
}

// chmod, chown and utimens change attributes only: data not yet flushed
// from the RAM tier keeps its size and bytes.
TEST_P(FilesystemDataTest, AttributeChangesKeepUnflushedData) {
  std::mt19937_64 rng(17);
  InodeNumber ino = MakeFile(kRootInode, "attrs");
  std::string data = RandomBytes(rng, 100000);
  WriteAt(ino, 0, data);
  SetAttrRequest chmod;
  chmod.mode = 0600;
  auto after_chmod = fs_->SetAttr(ino, chmod);
  ASSERT_TRUE(after_chmod.ok());
  EXPECT_EQ(after_chmod->attr.st_size, 100000);
  EXPECT_EQ(Size(ino), 100000u);
  EXPECT_TRUE(SameBytes(ReadAll(ino), data));

  WriteAt(ino, 100000, "more");
  data += "more";
  SetAttrRequest times;
  times.atime_ns = 1000000000;
  times.mtime_ns = 2000000000;
  auto after_utimens = fs_->SetAttr(ino, times);
  ASSERT_TRUE(after_utimens.ok());
  EXPECT_EQ(after_utimens->attr.st_size, 100004);
  EXPECT_EQ(after_utimens->attr.st_mtim.tv_sec, 2);
  EXPECT_TRUE(SameBytes(ReadAll(ino), data));

  WriteAt(ino, 5, "x");
  data[5] = 'x';
  SetAttrRequest chown;
  chown.uid = 123;
  ASSERT_TRUE(fs_->SetAttr(ino, chown).ok());
  EXPECT_EQ(Size(ino), data.size());

  Reopen();
  auto attr = fs_->GetAttr(ino);
  ASSERT_TRUE(attr.ok());
  EXPECT_EQ(attr->attr.st_mode, static_cast<mode_t>(S_IFREG | 0600));
  EXPECT_EQ(attr->attr.st_uid, 123u);
  EXPECT_EQ(static_cast<uint64_t>(attr->attr.st_size), data.size());
  EXPECT_TRUE(SameBytes(ReadAll(ino), data));
}

}  // namespace
}  // namespace spillfs
