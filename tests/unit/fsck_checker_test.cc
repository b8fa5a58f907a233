// Unit tests for fs/fsck.h: a real volume is populated through the
// Filesystem API, damaged through the Index API (or in the data area), and
// the Checker must find each kind of damage, repair what it says it can,
// leave the rest reported, and find the repaired volume clean and usable.
#include "spillfs/inspect/fsck.h"

#include <gtest/gtest.h>
#include <linux/falloc.h>
#include <sys/stat.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "spillfs/common/aligned_buffer.h"
#include "spillfs/core/filesystem.h"
#include "spillfs/kvindex/coding.h"
#include "spillfs/kvindex/keys.h"
#include "support/read_bytes.h"
#include "support/temp_dir.h"

namespace spillfs {
namespace {

using fsck::Checker;
using fsck::Problem;
using fsck::ProblemKind;
using fsck::Report;
using testing::ReadBytes;

constexpr uint64_t kBlock = 4096;

std::string Bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(n, '\0');
  for (auto& c : out) c = static_cast<char>(rng());
  return out;
}

std::string Describe(const Report& report) {
  std::string text =
      std::to_string(report.problems_found) + " problems, " + std::to_string(report.problems_remaining) + " remaining:";
  for (const Problem& p : report.problems) {
    text += std::string("\n  ") + fsck::ProblemKindName(p.kind) + ": " + p.message + (p.repaired ? " [repaired]" : "");
  }
  return text;
}

const Problem* Find(const Report& report, ProblemKind kind, InodeNumber ino = 0) {
  for (const Problem& p : report.problems) {
    if (p.kind == kind && (ino == 0 || p.ino == ino)) return &p;
  }
  return nullptr;
}

class FsckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = root_.Path("vol");
    Volume::CreateOptions options;
    options.size = 64 << 20;
    auto sb = Volume::Create(dir_, options);
    ASSERT_TRUE(sb.ok()) << sb.status().ToString();
    sb_ = *sb;
  }
  void TearDown() override { fs_.reset(); }

  Filesystem& Fs() {
    if (!fs_) {
      auto volume = Volume::Open(dir_, {});
      EXPECT_TRUE(volume.ok()) << volume.status().ToString();
      auto fs = Filesystem::Open(std::move(*volume));
      EXPECT_TRUE(fs.ok()) << fs.status().ToString();
      fs_ = std::move(*fs);
    }
    return *fs_;
  }
  void CloseFs() { fs_.reset(); }

  InodeNumber MakeFile(InodeNumber parent, const std::string& name, const std::string& data) {
    auto entry = Fs().MakeNode(parent, name, S_IFREG | 0644, 0, Caller{});
    EXPECT_TRUE(entry.ok()) << entry.status().ToString();
    if (!data.empty()) {
      auto written = Fs().Write(entry->ino, 0, data.data(), data.size());
      EXPECT_TRUE(written.ok()) << written.status().ToString();
    }
    return entry->ino;
  }
  InodeNumber MakeDir(InodeNumber parent, const std::string& name) {
    auto entry = Fs().MakeDir(parent, name, 0755, Caller{});
    EXPECT_TRUE(entry.ok()) << entry.status().ToString();
    return entry->ino;
  }

  // Runs the checker on the closed volume.
  Report Check(bool repair = false, bool scrub = false) {
    CloseFs();
    auto volume = Volume::Open(dir_, Volume::OpenOptions{.read_only = !repair});
    EXPECT_TRUE(volume.ok()) << volume.status().ToString();
    if (!volume.ok()) return Report{};
    Checker::Options options;
    options.repair = repair;
    options.scrub = scrub;
    Checker checker(**volume, options);
    auto report = checker.Run();
    EXPECT_TRUE(report.ok()) << report.status().ToString();
    return report.ok() ? *report : Report{};
  }

  // Changes the index of the closed volume with `edit`.
  template <typename Fn>
  void Damage(Fn&& edit) {
    CloseFs();
    auto volume = Volume::Open(dir_, {});
    ASSERT_TRUE(volume.ok()) << volume.status().ToString();
    Index& index = (*volume)->index();
    Index::Batch batch(index);
    edit(index, batch);
    ASSERT_TRUE(index.Commit(&batch, true).ok());
  }

  // Rewrites INO's inode record in BATCH after CHANGE has edited it.
  template <typename Change>
  static void EditInode(Index& index, Index::Batch& batch, InodeNumber ino, Change&& change) {
    InodeRecord r = *index.GetInode(ino);
    change(r);
    batch.Put(Family::kInode, keys::Ino(ino), r.Encode());
  }

  InodeRecord Inode(InodeNumber ino) {
    CloseFs();
    auto volume = Volume::Open(dir_, Volume::OpenOptions{.read_only = true});
    EXPECT_TRUE(volume.ok());
    auto record = (*volume)->index().GetInode(ino);
    EXPECT_TRUE(record.ok()) << record.status().ToString();
    return record.ok() ? *record : InodeRecord{};
  }

  // The first extent of `ino`: file offset and record.
  std::pair<uint64_t, ExtentRecord> FirstExtent(InodeNumber ino) {
    CloseFs();
    auto volume = Volume::Open(dir_, Volume::OpenOptions{.read_only = true});
    EXPECT_TRUE(volume.ok());
    auto cursor = (*volume)->index().NewCursor(Family::kExtent, keys::Ino(ino));
    cursor->Seek(keys::Ino(ino));
    EXPECT_TRUE(cursor->Valid()) << "inode " << ino << " has no extent";
    if (!cursor->Valid()) return {};
    return {keys::ExtentOffset(cursor->key()), *ExtentRecord::Decode(cursor->value())};
  }

  // Expects a clean check, then a write through a fresh mount of the
  // filesystem that fills most of the volume, proving the free list usable.
  void ExpectCleanAndUsable() {
    Report report = Check();
    EXPECT_EQ(report.problems_found, 0u) << Describe(report);
    std::string data = Bytes(8 << 20, 99);
    InodeNumber ino = MakeFile(kRootInode, "after-repair", data);
    auto read = ReadBytes(Fs(), ino, 0, data.size());
    ASSERT_TRUE(read.ok()) << read.status().ToString();
    EXPECT_EQ(*read, data);
    report = Check();
    EXPECT_EQ(report.problems_found, 0u) << Describe(report);
  }

  // A small tree: /a (file), /d/b (file), /d/e/ (dir), /d/link (hard link to /a).
  void Populate() {
    a_ = MakeFile(kRootInode, "a", Bytes(3 * kBlock + 100, 1));
    d_ = MakeDir(kRootInode, "d");
    b_ = MakeFile(d_, "b", Bytes(200 * 1024, 2));
    e_ = MakeDir(d_, "e");
    ASSERT_TRUE(Fs().Link(a_, d_, "link").ok());
  }

  testing::TempDir root_{"spillfs-fsck-test"};
  std::string dir_;
  Superblock sb_;
  std::unique_ptr<Filesystem> fs_;
  InodeNumber a_ = 0, d_ = 0, b_ = 0, e_ = 0;
};

TEST_F(FsckTest, FreshVolumeIsClean) {
  Report report = Check();
  EXPECT_EQ(report.problems_found, 0u) << Describe(report);
  EXPECT_TRUE(report.clean());
  EXPECT_EQ(report.inodes, 1u);
  EXPECT_EQ(report.directories, 1u);
  EXPECT_EQ(report.bytes_free, sb_.data_size - sb_.data_offset);
  EXPECT_EQ(report.bytes_mapped, 0u);
}

TEST_F(FsckTest, BusyVolumeIsCleanAndScrubsEveryWrittenByte) {
  Populate();
  Filesystem& fs = Fs();
  // Overwrites, truncates, fallocate, punch, symlinks, special files, xattrs,
  // renames and unlinks.
  InodeNumber big = MakeFile(d_, "big", Bytes(3 << 20, 3));
  ASSERT_TRUE(fs.Write(big, 12345, "overwrite", 9).ok());
  SetAttrRequest shrink;
  shrink.size = 1 << 20;
  ASSERT_TRUE(fs.SetAttr(big, shrink).ok());
  shrink.size = 2 * kBlock;  // unaligned shrinks: TruncateInsideAnExtent...
  ASSERT_TRUE(fs.SetAttr(b_, shrink).ok());
  InodeNumber pre = MakeFile(kRootInode, "prealloc", "");
  ASSERT_TRUE(fs.Fallocate(pre, 0, 0, 1 << 20).ok());
  ASSERT_TRUE(fs.Fallocate(pre, FALLOC_FL_KEEP_SIZE, 1 << 20, 64 << 10).ok());
  ASSERT_TRUE(fs.Write(pre, 8192, "x", 1).ok());
  ASSERT_TRUE(fs.Fallocate(big, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 4096, 65536).ok());
  ASSERT_TRUE(fs.Symlink(e_, "sym", "../b", Caller{}).ok());
  ASSERT_TRUE(fs.MakeNode(e_, "fifo", S_IFIFO | 0600, 0, Caller{}).ok());
  ASSERT_TRUE(fs.SetXattr(a_, "user.k", "v", 0).ok());
  ASSERT_TRUE(fs.Rename(d_, "big", e_, "big2", 0).ok());
  InodeNumber gone = MakeFile(kRootInode, "gone", Bytes(70000, 4));
  ASSERT_TRUE(fs.SetXattr(gone, "user.k", "v", 0).ok());
  ASSERT_TRUE(fs.Unlink(kRootInode, "gone").ok());
  InodeNumber sub = MakeDir(e_, "sub");
  ASSERT_TRUE(fs.Rename(e_, "sub", kRootInode, "moved", 0).ok());
  MakeDir(sub, "inner");
  ASSERT_TRUE(fs.Rmdir(sub, "inner").ok());

  Report report = Check(false, true);
  EXPECT_EQ(report.problems_found, 0u) << Describe(report);
  EXPECT_EQ(report.files, 4u);
  EXPECT_EQ(report.directories, 4u);
  EXPECT_EQ(report.symlinks, 1u);
  EXPECT_EQ(report.specials, 1u);
  EXPECT_EQ(report.bytes_mapped + report.bytes_free, sb_.data_size - sb_.data_offset);
  EXPECT_GT(report.bytes_scrubbed, 512u << 10);
  EXPECT_EQ(report.blocks_scrubbed * kBlock, report.bytes_scrubbed);
}

// Shrinking a file into the middle of a block that lies inside a larger
// extent rewrites that block and unmaps the rest; the volume must stay
// consistent (no stale mapping past EOF that the free list also holds).
TEST_F(FsckTest, TruncateInsideAnExtentToAnUnalignedSizeLeavesTheVolumeConsistent) {
  Populate();  // b: 200 KiB written at once, one extent
  SetAttrRequest shrink;
  shrink.size = 5000;
  ASSERT_TRUE(Fs().SetAttr(b_, shrink).ok());
  Report report = Check();
  EXPECT_EQ(report.problems_found, 0u) << Describe(report);
  EXPECT_EQ(Inode(b_).allocated_bytes, 2 * kBlock);
}

TEST_F(FsckTest, DeletedFreeRecordIsALeakAndIsRepaired) {
  Populate();
  uint64_t offset = 0, length = 0;
  Damage([&](Index& index, Index::Batch& batch) {
    auto cursor = index.NewCursor(Family::kFree, "");
    cursor->Seek("");
    ASSERT_TRUE(cursor->Valid());
    offset = keys::DecodeIno(cursor->key());
    coding::Reader reader(cursor->value());
    ASSERT_TRUE(reader.GetVarint64(&length));
    batch.Delete(Family::kFree, cursor->key());
  });
  Report report = Check();
  const Problem* leak = Find(report, ProblemKind::kLeak);
  ASSERT_NE(leak, nullptr) << Describe(report);
  EXPECT_EQ(leak->physical, offset);
  EXPECT_EQ(leak->length, length);
  EXPECT_FALSE(report.clean());

  report = Check(/*repair=*/true);
  EXPECT_TRUE(report.clean()) << Describe(report);
  ASSERT_NE(Find(report, ProblemKind::kLeak), nullptr);
  EXPECT_TRUE(Find(report, ProblemKind::kLeak)->repaired);
  ExpectCleanAndUsable();
}

TEST_F(FsckTest, DirentToAMissingInodeIsRemoved) {
  Populate();
  Damage([&](Index&, Index::Batch& batch) {
    batch.Put(Family::kDirent, keys::Dirent(d_, "ghost"), DirentRecord{4242, S_IFREG}.Encode());
  });
  Report report = Check();
  const Problem* dangling = Find(report, ProblemKind::kDanglingDirent);
  ASSERT_NE(dangling, nullptr) << Describe(report);
  EXPECT_NE(dangling->message.find("ghost"), std::string::npos) << dangling->message;
  EXPECT_EQ(report.problems_found, 1u) << Describe(report);

  report = Check(true);
  EXPECT_TRUE(report.clean()) << Describe(report);
  auto lookup = Fs().Lookup(d_, "ghost");
  EXPECT_EQ(lookup.status().code(), ENOENT);
  ExpectCleanAndUsable();
}

TEST_F(FsckTest, WrongLinkCountsAreRewritten) {
  Populate();
  Damage([&](Index& index, Index::Batch& batch) {
    EditInode(index, batch, a_, [](InodeRecord& a) { a.nlink = 7; });
    EditInode(index, batch, d_, [](InodeRecord& d) {
      d.nlink = 2;  // has one subdirectory: 3
    });
    EditInode(index, batch, kRootInode, [](InodeRecord& root) { root.nlink = 9; });
  });
  Report report = Check();
  EXPECT_NE(Find(report, ProblemKind::kNlink, a_), nullptr) << Describe(report);
  EXPECT_NE(Find(report, ProblemKind::kNlink, d_), nullptr) << Describe(report);
  EXPECT_NE(Find(report, ProblemKind::kNlink, kRootInode), nullptr) << Describe(report);
  EXPECT_EQ(report.problems_found, 3u) << Describe(report);

  report = Check(true);
  EXPECT_TRUE(report.clean()) << Describe(report);
  EXPECT_EQ(Inode(a_).nlink, 2u);
  EXPECT_EQ(Inode(d_).nlink, 3u);
  EXPECT_EQ(Inode(kRootInode).nlink, 3u);
  ExpectCleanAndUsable();
}

TEST_F(FsckTest, AllocatedBytesAndParentAndNextInoAreRewritten) {
  Populate();
  Damage([&](Index& index, Index::Batch& batch) {
    EditInode(index, batch, b_, [](InodeRecord& b) { b.allocated_bytes += 3 * kBlock; });
    EditInode(index, batch, e_, [](InodeRecord& e) { e.parent = kRootInode; });
    batch.Put(Family::kMeta, keys::kNextIno, EncodeMetaU64(3));
  });
  Report report = Check();
  EXPECT_NE(Find(report, ProblemKind::kAllocatedBytes, b_), nullptr) << Describe(report);
  EXPECT_NE(Find(report, ProblemKind::kParent, e_), nullptr) << Describe(report);
  EXPECT_NE(Find(report, ProblemKind::kNextIno), nullptr) << Describe(report);
  EXPECT_EQ(report.problems_found, 3u) << Describe(report);
  report = Check(true);
  EXPECT_TRUE(report.clean()) << Describe(report);
  EXPECT_EQ(Inode(b_).allocated_bytes, 200u * 1024);
  EXPECT_EQ(Inode(e_).parent, d_);
  ExpectCleanAndUsable();
}

TEST_F(FsckTest, OrphanIsReportedAndReclaimed) {
  Populate();
  InodeNumber held = MakeFile(kRootInode, "held", Bytes(1 << 20, 5));
  ASSERT_TRUE(Fs().Open(held).ok());
  ASSERT_TRUE(Fs().Unlink(kRootInode, "held").ok());
  CloseFs();  // "crash" with the file still open
  Report report = Check();
  const Problem* orphan = Find(report, ProblemKind::kOrphan, held);
  ASSERT_NE(orphan, nullptr) << Describe(report);
  EXPECT_EQ(report.orphans, 1u);
  EXPECT_EQ(report.problems_found, 1u) << Describe(report);
  uint64_t free_before = report.bytes_free;

  report = Check(true);
  EXPECT_TRUE(report.clean()) << Describe(report);
  report = Check();
  EXPECT_EQ(report.orphans, 0u);
  EXPECT_EQ(report.bytes_free, free_before + (1 << 20));
  ExpectCleanAndUsable();
}

TEST_F(FsckTest, NamelessInodeGoesToLostAndFound) {
  Populate();
  Damage([&](Index&, Index::Batch& batch) { batch.Delete(Family::kDirent, keys::Dirent(d_, "b")); });
  Report report = Check();
  EXPECT_NE(Find(report, ProblemKind::kUnreachable, b_), nullptr) << Describe(report);
  report = Check(true);
  EXPECT_TRUE(report.clean()) << Describe(report);
  auto lf = Fs().Lookup(kRootInode, "lost+found");
  ASSERT_TRUE(lf.ok()) << lf.status().ToString();
  auto found = Fs().Lookup(lf->ino, "#" + std::to_string(b_));
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(found->ino, b_);
  auto read = ReadBytes(Fs(), b_, 0, 200 * 1024);
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(*read, Bytes(200 * 1024, 2));
  ExpectCleanAndUsable();
}

TEST_F(FsckTest, TypeMismatchStaleOrphanAndStrayRecordsAreRepaired) {
  Populate();
  Damage([&](Index& index, Index::Batch& batch) {
    batch.Put(Family::kDirent, keys::Dirent(kRootInode, "a"), DirentRecord{a_, S_IFDIR}.Encode());
    batch.Put(Family::kOrphan, keys::Ino(b_), "");  // linked: mount would delete it
    batch.Put(Family::kOrphan, keys::Ino(777), "");
    batch.Put(Family::kXattr, keys::Xattr(778, "user.x"), "y");
    ExtentRecord stray;
    stray.physical = sb_.data_size - kBlock;  // the last block: free until now
    stray.length = kBlock;
    stray.block_checksums = {0};
    batch.Put(Family::kExtent, keys::Extent(779, 0), stray.Encode());
  });
  Report report = Check();
  EXPECT_NE(Find(report, ProblemKind::kDirentType, a_), nullptr) << Describe(report);
  EXPECT_NE(Find(report, ProblemKind::kStaleOrphan, b_), nullptr) << Describe(report);
  EXPECT_NE(Find(report, ProblemKind::kStaleOrphan, 777), nullptr) << Describe(report);
  EXPECT_NE(Find(report, ProblemKind::kStrayXattr, 778), nullptr) << Describe(report);
  EXPECT_NE(Find(report, ProblemKind::kStrayExtent, 779), nullptr) << Describe(report);
  EXPECT_NE(Find(report, ProblemKind::kDoubleUse, 779), nullptr) << Describe(report);  // mapped and free
  report = Check(true);
  EXPECT_TRUE(report.clean()) << Describe(report);
  for (const Problem& p : report.problems) EXPECT_TRUE(p.repaired) << p.message;
  ExpectCleanAndUsable();
  // b survived (a mount would have deleted it with the orphan record).
  auto lookup = Fs().Lookup(d_, "b");
  EXPECT_TRUE(lookup.ok()) << lookup.status().ToString();
}

TEST_F(FsckTest, DataPastEofIsTrimmed) {
  Populate();
  Damage([&](Index& index, Index::Batch& batch) {
    EditInode(index, batch, b_, [](InodeRecord& b) {
      b.size = 2 * kBlock + 1;  // keeps 3 blocks of 50
    });
  });
  Report report = Check();
  EXPECT_NE(Find(report, ProblemKind::kDataPastEof, b_), nullptr) << Describe(report);
  report = Check(true);
  EXPECT_TRUE(report.clean()) << Describe(report);
  EXPECT_EQ(Inode(b_).allocated_bytes, 3 * kBlock);
  ExpectCleanAndUsable();
}

TEST_F(FsckTest, DoubleMappingAndBadExtentsAreReportedNotRepaired) {
  Populate();
  auto [offset, extent] = FirstExtent(a_);
  Damage([&](Index& index, Index::Batch& batch) {
    // b's first block now points at a's data: two files share a block.
    ExtentRecord shared = extent;
    shared.length = kBlock;
    shared.block_checksums.resize(1);
    batch.Put(Family::kExtent, keys::Extent(b_, 0), shared.Encode());
    // An extent past the end of the data area, and one misaligned.
    ExtentRecord outside;
    outside.physical = sb_.data_size;
    outside.length = kBlock;
    outside.block_checksums = {1};
    batch.Put(Family::kExtent, keys::Extent(b_, 1 << 30), outside.Encode());
    ExtentRecord crooked = extent;
    crooked.physical += 17;
    crooked.length = kBlock;
    crooked.block_checksums = {1, 2};
    batch.Put(Family::kExtent, keys::Extent(b_, (1 << 30) + 8 * kBlock), crooked.Encode());
  });
  Report report = Check();
  const Problem* twice = Find(report, ProblemKind::kDoubleUse);
  ASSERT_NE(twice, nullptr) << Describe(report);
  EXPECT_EQ(twice->physical, extent.physical);
  EXPECT_NE(Find(report, ProblemKind::kExtentRange, b_), nullptr) << Describe(report);
  EXPECT_NE(Find(report, ProblemKind::kExtentAlignment, b_), nullptr) << Describe(report);
  EXPECT_NE(Find(report, ProblemKind::kChecksumCount, b_), nullptr) << Describe(report);

  report = Check(true);
  EXPECT_FALSE(report.clean()) << Describe(report);
  EXPECT_FALSE(Find(report, ProblemKind::kDoubleUse)->repaired);
  EXPECT_FALSE(Find(report, ProblemKind::kExtentRange)->repaired);
  EXPECT_GT(report.problems_remaining, 0u);
}

TEST_F(FsckTest, DedupSharingOneBlobIsNotADoubleUse) {
  Populate();
  auto [offset, extent] = FirstExtent(a_);
  Damage([&](Index& index, Index::Batch& batch) {
    // Make the extent a dedup blob named by a and b (what a dedup hit writes).
    ExtentRecord shared = extent;
    shared.blob_id = extent.physical;
    BlobRecord blob{std::string(16, 'x'), extent.length, 2, {}};
    batch.Put(Family::kBlob, keys::BlobByPhysical(extent.physical), blob.Encode());
    batch.Put(Family::kBlob, keys::BlobByHash(blob.hash), EncodeMetaU64(extent.physical));
    batch.Put(Family::kExtent, keys::Extent(a_, offset), shared.Encode());
    InodeRecord b = *index.GetInode(b_);
    batch.Put(Family::kExtent, keys::Extent(b_, 1 << 20), shared.Encode());
    b.size = (1 << 20) + shared.length;
    b.allocated_bytes += shared.length;
    batch.Put(Family::kInode, keys::Ino(b_), b.Encode());
  });
  Report report = Check(false, true);
  EXPECT_EQ(report.problems_found, 0u) << Describe(report);
}

TEST_F(FsckTest, ScrubNamesTheFileAndOffsetOfACorruptBlock) {
  Populate();
  // One write of 20 MiB: one extent, larger than a scrub batch (16 MiB), so
  // the bad block lies in the second piece the scrub reads.
  std::string data = Bytes(20 << 20, 6);
  InodeNumber victim = MakeFile(d_, "victim", data);
  // Dedup stores the file as 256 KiB blob extents: take the one holding the
  // bad block (file offsets and blocks below are relative to it).
  const uint64_t bad_file_offset = (17 << 20) + 5 * kBlock;
  std::pair<uint64_t, ExtentRecord> found;
  {
    CloseFs();
    auto volume = Volume::Open(dir_, Volume::OpenOptions{.read_only = true});
    ASSERT_TRUE(volume.ok());
    auto cursor = (*volume)->index().NewCursor(Family::kExtent, keys::Ino(victim));
    for (cursor->Seek(keys::Ino(victim)); cursor->Valid(); cursor->Next()) {
      auto record = *ExtentRecord::Decode(cursor->value());
      uint64_t at = keys::ExtentOffset(cursor->key());
      if (at <= bad_file_offset && bad_file_offset < at + record.length) found = {at, record};
    }
  }
  auto [offset, extent] = found;
  ASSERT_GT(extent.length, 0u) << "no extent holds the bad block";
  const uint64_t bad_block = (bad_file_offset - offset) / kBlock;
  CloseFs();
  {
    // Flip a byte of that block, through the data area itself.
    auto volume = Volume::Open(dir_, {});
    ASSERT_TRUE(volume.ok());
    AlignedBuffer block(kBlock);
    uint64_t physical = extent.physical + bad_block * kBlock;
    ASSERT_TRUE((*volume)->store().ReadAt(physical, block.data(), kBlock).ok());
    block.data()[100] ^= 0x5a;
    ASSERT_TRUE((*volume)->store().WriteAt(physical, block.data(), kBlock).ok());
    ASSERT_TRUE((*volume)->store().Flush().ok());
  }
  EXPECT_EQ(Check().problems_found, 0u) << "without --scrub the index alone is consistent";
  Report report = Check(false, true);
  const Problem* bad = Find(report, ProblemKind::kChecksumMismatch);
  ASSERT_NE(bad, nullptr) << Describe(report);
  EXPECT_EQ(bad->ino, victim);
  EXPECT_EQ(bad->path, "/d/victim");
  EXPECT_EQ(bad->file_offset, offset + bad_block * kBlock);
  EXPECT_EQ(bad->physical, extent.physical + bad_block * kBlock);
  EXPECT_EQ(bad->length, kBlock);
  EXPECT_EQ(report.problems_found, 1u) << Describe(report);
  EXPECT_GE(report.bytes_scrubbed, data.size());
  // The filesystem refuses the block too, and serves the others.
  EXPECT_EQ(ReadBytes(Fs(), victim, bad_file_offset, 10).status().code(), EIO);
  auto good = ReadBytes(Fs(), victim, bad_file_offset + kBlock, kBlock);
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(*good, data.substr(bad_file_offset + kBlock, kBlock));
  // Repair cannot make the bytes right: it stays reported.
  report = Check(true, true);
  EXPECT_FALSE(report.clean());
  EXPECT_FALSE(Find(report, ProblemKind::kChecksumMismatch)->repaired);
}

TEST_F(FsckTest, RepairNeedsAWritableVolume) {
  Populate();
  Damage([&](Index& index, Index::Batch& batch) { EditInode(index, batch, a_, [](InodeRecord& a) { a.nlink = 1; }); });
  auto volume = Volume::Open(dir_, Volume::OpenOptions{.read_only = true});
  ASSERT_TRUE(volume.ok());
  Checker::Options options;
  options.repair = true;
  Checker checker(**volume, options);
  auto report = checker.Run();
  EXPECT_FALSE(report.ok());
}

}  // namespace
}  // namespace spillfs
