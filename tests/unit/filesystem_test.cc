// Unit tests for fs/filesystem.h and fs/volume.h: a volume made in a
// temporary directory, driven through Filesystem directly (no FUSE).
#include "core/filesystem.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "spillfs/fs/volume.h"
#include "spillfs/kvindex/coding.h"
#include "spillfs/kvindex/keys.h"
#include "support/eventually.h"
#include "support/read_bytes.h"
#include "support/temp_dir.h"

namespace spillfs {
namespace {

using testing::Eventually;
using testing::ReadBytes;
using testing::TempDir;

constexpr uint64_t kVolumeSize = 64ull << 20;
constexpr uint64_t kBlock = Volume::kBlockSize;

std::string RandomBytes(size_t n, std::mt19937_64* rng) {
  std::string out(n, '\0');
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = (*rng)();
    std::memcpy(out.data() + i, &v, 8);
  }
  for (; i < n; ++i) out[i] = static_cast<char>((*rng)());
  return out;
}

// Writes `tag` into the first 8 bytes of every block of `data`, so that no
// two blocks written with different tags are equal (dedup cannot share them).
void StampBlocks(std::string* data, uint64_t tag) {
  for (uint64_t at = 0; at + 8 <= data->size(); at += 4096) {
    uint64_t stamp = tag * 1000003 + at;
    std::memcpy(data->data() + at, &stamp, 8);
  }
}

uint64_t RoundUp(uint64_t v, uint64_t unit) { return (v + unit - 1) / unit * unit; }

Volume::CreateOptions SizedOptions(uint64_t size, bool force = false) {
  Volume::CreateOptions options;
  options.size = size;
  options.force = force;
  return options;
}

// Compares file contents, reporting sizes and the first differing offset
// instead of printing megabytes of bytes.
::testing::AssertionResult SameBytes(const std::string& got, const std::string& want) {
  if (got == want) return ::testing::AssertionSuccess();
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  std::ostringstream message;
  message << "got " << got.size() << " bytes, want " << want.size() << "; first difference at offset " << i;
  if (i < got.size() && i < want.size()) {
    message << std::hex << " (got 0x" << (static_cast<unsigned>(got[i]) & 0xff) << ", want 0x"
            << (static_cast<unsigned>(want[i]) & 0xff) << ")";
  }
  return ::testing::AssertionFailure() << message.str();
}

// Making a RocksDB index from scratch costs a few hundred milliseconds of
// fsyncs, so Volume::Create runs once per process and every test starts from
// a copy of that volume: the index files, and a sparse image with the
// superblock block copied over.
class TemplateVolume : public ::testing::Environment {
 public:
  static std::string Path() { return dir_->path() + "/template"; }
  void SetUp() override {
    dir_ = std::make_unique<TempDir>();
    Volume::CreateOptions options;
    options.size = kVolumeSize;
    auto sb = Volume::Create(Path(), options);
    ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  }
  void TearDown() override { dir_.reset(); }

  static void CloneTo(const std::string& dst) {
    namespace stdfs = std::filesystem;
    stdfs::create_directories(Volume::IndexPath(dst));
    for (const auto& entry : stdfs::directory_iterator(Volume::IndexPath(Path()))) {
      if (entry.path().filename() == "LOCK") continue;
      stdfs::copy_file(entry.path(), stdfs::path(Volume::IndexPath(dst)) / entry.path().filename());
    }
    ASSERT_TRUE(BlockStore::CreateImage(Volume::ImagePath(dst), kVolumeSize).ok());
    std::string block(kBlock, '\0');
    int in = open(Volume::ImagePath(Path()).c_str(), O_RDONLY | O_CLOEXEC);
    int out = open(Volume::ImagePath(dst).c_str(), O_WRONLY | O_CLOEXEC);
    ASSERT_GE(in, 0);
    ASSERT_GE(out, 0);
    EXPECT_EQ(pread(in, block.data(), block.size(), 0), static_cast<ssize_t>(block.size()));
    EXPECT_EQ(pwrite(out, block.data(), block.size(), 0), static_cast<ssize_t>(block.size()));
    close(in);
    close(out);
  }

 private:
  static inline std::unique_ptr<TempDir> dir_;
};
::testing::Environment* const kTemplateVolume = ::testing::AddGlobalTestEnvironment(new TemplateVolume);

// A fresh 64 MiB volume in a temporary directory, opened as a Filesystem.
// RamTier() sizes the write-back RAM tier (0: every write goes straight to
// new blocks). Helpers that look at the index flush the RAM tier first.
class FilesystemTestBase : public ::testing::Test {
 protected:
  virtual uint64_t RamTier() const { return 0; }
  virtual uint64_t ReadAheadBytes() const { return FilesystemOptions::kDefaultReadAheadBytes; }
  // Further options of a fixture (after the two above).
  virtual void Tune(FilesystemOptions* /*options*/) const {}

  void SetUp() override {
    vol_ = dir_.path() + "/vol";
    ASSERT_NO_FATAL_FAILURE(TemplateVolume::CloneTo(vol_));
    OpenFs();
    ASSERT_NE(fs_, nullptr);
    initial_free_ = fs_->StatFs().f_bfree;
    ASSERT_EQ(initial_free_, (kVolumeSize - Volume::kDataOffset) / kBlock);
  }

  void OpenFs() {
    auto volume = Volume::Open(vol_, Volume::OpenOptions{});
    ASSERT_TRUE(volume.ok()) << volume.status().ToString();
    FilesystemOptions options;
    options.ram_tier_bytes = RamTier();
    options.read_ahead_bytes = ReadAheadBytes();
    Tune(&options);
    auto fs = Filesystem::Open(std::move(volume).value(), options);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    fs_ = std::move(fs).value();
  }
  void Reopen() {
    fs_.reset();
    OpenFs();
  }
  Index& index() { return fs_->volume().index(); }
  // Writes out the RAM tier, so the index holds every file's data.
  void FlushAll() { ASSERT_TRUE(fs_->FlushAll().ok()); }
  // Free blocks once the RAM tier is written out.
  uint64_t FreeBlocks() {
    FlushAll();
    return fs_->StatFs().f_bfree;
  }

  InodeNumber MakeFile(InodeNumber parent, std::string_view name, uint32_t mode = S_IFREG | 0644) {
    auto e = fs_->MakeNode(parent, name, mode, 0, caller_);
    EXPECT_TRUE(e.ok()) << name << ": " << e.status().ToString();
    return e.ok() ? e->ino : 0;
  }
  InodeNumber MakeDir(InodeNumber parent, std::string_view name) {
    auto e = fs_->MakeDir(parent, name, 0755, caller_);
    EXPECT_TRUE(e.ok()) << name << ": " << e.status().ToString();
    return e.ok() ? e->ino : 0;
  }
  InodeNumber LookupIno(InodeNumber parent, std::string_view name) {
    auto e = fs_->Lookup(parent, name);
    return e.ok() ? e->ino : 0;
  }
  int LookupErr(InodeNumber parent, std::string_view name) { return fs_->Lookup(parent, name).status().code(); }

  void WriteAt(InodeNumber ino, uint64_t offset, const std::string& data) {
    auto n = fs_->Write(ino, offset, data.data(), data.size());
    ASSERT_TRUE(n.ok()) << "write " << offset << "+" << data.size() << ": " << n.status().ToString();
    ASSERT_EQ(*n, data.size());
  }
  Result<std::string> ReadAt(InodeNumber ino, uint64_t offset, size_t size) {
    return ReadBytes(*fs_, ino, offset, size);
  }
  std::string ReadAll(InodeNumber ino) {
    auto attr = fs_->GetAttr(ino);
    EXPECT_TRUE(attr.ok());
    if (!attr.ok()) return "";
    auto data = ReadAt(ino, 0, static_cast<size_t>(attr->attr.st_size) + 10);
    EXPECT_TRUE(data.ok()) << data.status().ToString();
    return data.ok() ? *data : "";
  }
  uint64_t Size(InodeNumber ino) {
    auto attr = fs_->GetAttr(ino);
    return attr.ok() ? static_cast<uint64_t>(attr->attr.st_size) : UINT64_MAX;
  }
  Status Truncate(InodeNumber ino, uint64_t size) {
    SetAttrRequest request;
    request.size = size;
    return fs_->SetAttr(ino, request).status();
  }

  // The extent map of `ino` as stored in the index.
  std::vector<std::pair<uint64_t, ExtentRecord>> Extents(InodeNumber ino) {
    FlushAll();
    std::vector<std::pair<uint64_t, ExtentRecord>> out;
    auto cursor = index().NewCursor(Family::kExtent, keys::Ino(ino));
    for (cursor->Seek(""); cursor->Valid(); cursor->Next()) {
      auto record = ExtentRecord::Decode(cursor->value());
      EXPECT_TRUE(record.ok());
      if (record.ok()) out.emplace_back(keys::ExtentOffset(cursor->key()), *record);
    }
    return out;
  }
  size_t CountKeys(Family family, const std::string& prefix = "") {
    FlushAll();
    size_t n = 0;
    auto cursor = index().NewCursor(family, prefix);
    for (cursor->Seek(""); cursor->Valid(); cursor->Next()) ++n;
    return n;
  }
  bool HasKey(Family family, const std::string& key) {
    std::string value;
    return index().Get(family, key, &value).ok();
  }

  // Structural invariants of one file's extent map: block aligned, sorted,
  // non-overlapping, written data only below the rounded-up size, and
  // st_blocks accounting for exactly the mapped bytes.
  void ExpectExtentMapSane(InodeNumber ino) {
    FlushAll();
    auto attr = fs_->GetAttr(ino);
    ASSERT_TRUE(attr.ok());
    uint64_t size = static_cast<uint64_t>(attr->attr.st_size);
    uint64_t mapped = 0, prev_end = 0;
    for (const auto& [offset, record] : Extents(ino)) {
      EXPECT_EQ(offset % kBlock, 0u);
      EXPECT_EQ(record.length % kBlock, 0u);
      EXPECT_GT(record.length, 0u);
      EXPECT_GE(offset, prev_end) << "extents overlap at file offset " << offset;
      if (!record.unwritten()) {
        EXPECT_LT(offset, RoundUp(size, kBlock))
            << "written extent at file offset " << offset << " lies past the end of a " << size << "-byte file";
        EXPECT_EQ(record.block_checksums.size(), record.length / kBlock);
      }
      EXPECT_GE(record.physical, Volume::kDataOffset);
      EXPECT_LE(record.physical + record.length, kVolumeSize);
      prev_end = offset + record.length;
      mapped += record.length;
    }
    EXPECT_EQ(static_cast<uint64_t>(attr->attr.st_blocks) * 512, mapped) << "st_blocks disagrees with the extent map";
  }

  // No physical block is mapped twice, over all files, and mapped + free
  // covers the data area exactly once.
  //
  // Every block of the data area is either free (exactly once) or mapped; a
  // block mapped by several extents must belong to a shared dedup blob.
  void ExpectSpaceAccountedFor() {
    FlushAll();
    const uint64_t blocks = (kVolumeSize - Volume::kDataOffset) / kBlock;
    std::vector<int> mapped(blocks, 0), unshared(blocks, 0), free(blocks, 0);
    auto block_of = [&](uint64_t physical) { return (physical - Volume::kDataOffset) / kBlock; };
    auto cursor = index().NewCursor(Family::kExtent, "");
    for (cursor->Seek(""); cursor->Valid(); cursor->Next()) {
      auto record = ExtentRecord::Decode(cursor->value());
      ASSERT_TRUE(record.ok());
      ASSERT_GE(record->physical, Volume::kDataOffset);
      ASSERT_LE(record->physical + record->length, kVolumeSize);
      for (uint64_t b = block_of(record->physical); b < block_of(record->physical + record->length); ++b) {
        ++mapped[b];
        if (record->blob_id == 0) ++unshared[b];
      }
    }
    auto free_cursor = index().NewCursor(Family::kFree, "");
    for (free_cursor->Seek(""); free_cursor->Valid(); free_cursor->Next()) {
      coding::Reader reader(free_cursor->value());
      uint64_t length = 0;
      ASSERT_TRUE(reader.GetVarint64(&length));
      uint64_t offset = keys::DecodeIno(free_cursor->key());
      ASSERT_GE(offset, Volume::kDataOffset);
      ASSERT_LE(offset + length, kVolumeSize);
      for (uint64_t b = block_of(offset); b < block_of(offset + length); ++b) ++free[b];
    }
    int reported = 0;
    for (uint64_t b = 0; b < blocks && reported < 5; ++b) {
      uint64_t physical = Volume::kDataOffset + b * kBlock;
      bool ok = free[b] + (mapped[b] > 0 ? 1 : 0) == 1 && (mapped[b] <= 1 || unshared[b] == 0);
      if (!ok) {
        ADD_FAILURE() << "block at " << physical << ": free " << free[b] << " times, mapped " << mapped[b] << " times ("
                      << unshared[b] << " not by a dedup blob)";
        ++reported;
      }
    }
  }

  TempDir dir_{"spillfs-fs-test"};
  std::string vol_;
  std::unique_ptr<Filesystem> fs_;
  uint64_t initial_free_ = 0;
  Caller caller_{};
};

// Namespace and volume tests: the RAM tier plays no part.
class FilesystemTest : public FilesystemTestBase {};

// Data tests run twice: writing straight through, and through a 32 MiB RAM
// tier (smaller than the volume, so memory pressure forces flushes too).
// The RAM tier sizes a data test runs with: none (every write goes straight
// through) and 32 MiB; named so in the test names.
const auto kTiers = ::testing::Values(uint64_t{0}, uint64_t{32} << 20);
std::string TierName(const ::testing::TestParamInfo<uint64_t>& info) {
  return info.param == 0 ? "WriteThrough" : "RamTier";
}

class FilesystemDataTest : public FilesystemTestBase, public ::testing::WithParamInterface<uint64_t> {
 protected:
  uint64_t RamTier() const override { return GetParam(); }
};

INSTANTIATE_TEST_SUITE_P(Tiers, FilesystemDataTest, kTiers, TierName);

// ---- namespace ----

TEST_F(FilesystemTest, CreateLookupAndReadDir) {
  auto root = fs_->GetAttr(kRootInode);
  ASSERT_TRUE(root.ok());
  EXPECT_TRUE(S_ISDIR(root->attr.st_mode));
  EXPECT_EQ(root->attr.st_nlink, 2u);

  auto a = fs_->MakeNode(kRootInode, "a", S_IFREG | 0640, 0, Caller{1000, 100});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->attr.st_mode, static_cast<mode_t>(S_IFREG | 0640));
  EXPECT_EQ(a->attr.st_nlink, 1u);
  EXPECT_EQ(a->attr.st_uid, 1000u);
  EXPECT_EQ(a->attr.st_gid, 100u);
  EXPECT_EQ(a->attr.st_size, 0);
  InodeNumber d = MakeDir(kRootInode, "d");
  ASSERT_NE(d, 0u);
  auto b = fs_->MakeNode(d, "b", 0600, 0, caller_);  // no type bits: a regular file
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(S_ISREG(b->attr.st_mode));
  std::string long_name(Filesystem::kNameMax, 'n');
  InodeNumber longest = MakeFile(kRootInode, long_name);
  auto link = fs_->Symlink(kRootInode, "s", "d/b", caller_);
  ASSERT_TRUE(link.ok());

  EXPECT_NE(a->ino, d);
  EXPECT_NE(b->ino, a->ino);
  EXPECT_EQ(LookupIno(kRootInode, "a"), a->ino);
  EXPECT_EQ(LookupIno(kRootInode, "d"), d);
  EXPECT_EQ(LookupIno(d, "b"), b->ino);
  EXPECT_EQ(LookupIno(kRootInode, long_name), longest);
  EXPECT_EQ(LookupIno(d, ".."), kRootInode);
  EXPECT_EQ(LookupIno(d, "."), d);
  EXPECT_EQ(LookupIno(kRootInode, ".."), kRootInode);
  EXPECT_EQ(LookupErr(kRootInode, "b"), ENOENT);
  EXPECT_EQ(LookupErr(a->ino, "x"), ENOTDIR);
  EXPECT_EQ(LookupErr(kRootInode, long_name + "n"), ENAMETOOLONG);

  EXPECT_EQ(fs_->MakeNode(kRootInode, "a", S_IFREG | 0644, 0, caller_).status().code(), EEXIST);
  EXPECT_EQ(fs_->MakeDir(kRootInode, "d", 0755, caller_).status().code(), EEXIST);
  EXPECT_EQ(fs_->MakeNode(kRootInode, long_name + "n", S_IFREG | 0644, 0, caller_).status().code(), ENAMETOOLONG);
  EXPECT_EQ(fs_->MakeNode(a->ino, "x", S_IFREG | 0644, 0, caller_).status().code(), ENOTDIR);
  EXPECT_EQ(fs_->MakeNode(kRootInode, "", S_IFREG | 0644, 0, caller_).status().code(), ENOENT);

  auto target = fs_->ReadLink(link->ino);
  ASSERT_TRUE(target.ok());
  EXPECT_EQ(*target, "d/b");
  EXPECT_EQ(fs_->ReadLink(a->ino).status().code(), EINVAL);

  auto hard = fs_->Link(a->ino, d, "a2");
  ASSERT_TRUE(hard.ok());
  EXPECT_EQ(hard->ino, a->ino);
  EXPECT_EQ(hard->attr.st_nlink, 2u);
  EXPECT_EQ(fs_->Link(d, kRootInode, "dirlink").status().code(), EPERM);
  EXPECT_EQ(fs_->Link(a->ino, d, "b").status().code(), EEXIST);

  root = fs_->GetAttr(kRootInode);
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(root->attr.st_nlink, 3u);  // ".", "..", and d's ".."

  auto check_listing = [&]() {
    auto entries = fs_->ReadDir(kRootInode);
    ASSERT_TRUE(entries.ok());
    ASSERT_EQ(entries->size(), 6u);
    EXPECT_EQ((*entries)[0].name, ".");
    EXPECT_EQ((*entries)[0].ino, kRootInode);
    EXPECT_EQ((*entries)[1].name, "..");
    std::map<std::string, std::pair<InodeNumber, uint32_t>> got;
    for (size_t i = 2; i < entries->size(); ++i) got[(*entries)[i].name] = {(*entries)[i].ino, (*entries)[i].type};
    std::map<std::string, std::pair<InodeNumber, uint32_t>> want = {
        {"a", {a->ino, S_IFREG}}, {"d", {d, S_IFDIR}}, {long_name, {longest, S_IFREG}}, {"s", {link->ino, S_IFLNK}}};
    EXPECT_EQ(got, want);
    auto sub = fs_->ReadDir(d);
    ASSERT_TRUE(sub.ok());
    ASSERT_EQ(sub->size(), 4u);
    EXPECT_EQ((*sub)[1].ino, kRootInode);
    EXPECT_EQ((*sub)[2].name, "a2");
    EXPECT_EQ((*sub)[3].name, "b");
  };
  check_listing();
  EXPECT_EQ(fs_->ReadDir(a->ino).status().code(), ENOTDIR);

  EXPECT_EQ(fs_->Rmdir(kRootInode, "d").code(), ENOTEMPTY);
  EXPECT_EQ(fs_->Unlink(kRootInode, "d").code(), EISDIR);
  EXPECT_EQ(fs_->Rmdir(kRootInode, "a").code(), ENOTDIR);
  EXPECT_EQ(fs_->Unlink(kRootInode, "missing").code(), ENOENT);

  // Everything is still there after the volume is closed and opened again.
  Reopen();
  check_listing();
  EXPECT_EQ(LookupIno(d, "b"), b->ino);
  EXPECT_EQ(*fs_->ReadLink(link->ino), "d/b");
  EXPECT_EQ(fs_->GetAttr(a->ino)->attr.st_nlink, 2u);
  EXPECT_EQ(fs_->GetAttr(a->ino)->attr.st_uid, 1000u);

  // Remove it all again.
  ASSERT_TRUE(fs_->Unlink(d, "b").ok());
  ASSERT_TRUE(fs_->Unlink(d, "a2").ok());
  ASSERT_TRUE(fs_->Rmdir(kRootInode, "d").ok());
  EXPECT_EQ(fs_->GetAttr(d).status().code(), ENOENT);
  EXPECT_EQ(fs_->GetAttr(kRootInode)->attr.st_nlink, 2u);
  EXPECT_EQ(fs_->GetAttr(a->ino)->attr.st_nlink, 1u);
}

// ---- data ----

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
  const std::string data = RandomBytes(8 << 20, &rng);  // nothing for dedup to share
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
  const std::string small = RandomBytes(64 << 10, &rng);
  WriteAt(ino, 4096, small);
  EXPECT_EQ(fs_->ram_tier_stats().dirty_bytes, small.size()) << "a small write goes to the tier";
  const std::string big = RandomBytes((1 << 20) + 4096, &rng);  // 5 chunks: more than the tier
  WriteAt(ino, 0, big);                                         // over the small one, still in the tier
  EXPECT_EQ(fs_->ram_tier_stats().room_wait_timeouts, 0u) << "the write waited for room that could never be";
  EXPECT_EQ(fs_->ram_tier_stats().dirty_bytes, 0u) << "the cached bytes under the write were not flushed first";
  EXPECT_TRUE(SameBytes(ReadAll(ino), big));
  Reopen();
  EXPECT_TRUE(SameBytes(ReadAll(ino), big)) << "after reopening";
}

TEST_F(TinyRamTierTest, AWaitingWriterHasRoomMadeForIt) {
  std::mt19937_64 rng(4);
  InodeNumber first = MakeFile(kRootInode, "first");
  const std::string half = RandomBytes(512 << 10, &rng);  // 2 chunks, under the watermark (3)
  WriteAt(first, 0, half);
  InodeNumber second = MakeFile(kRootInode, "second");
  const std::string more = RandomBytes(600 << 10, &rng);  // spans 3 chunks: 5 in all
  WriteAt(second, 0, more);
  EXPECT_EQ(fs_->ram_tier_stats().room_wait_timeouts, 0u) << "the writer waited 5 s in vain";
  EXPECT_EQ(fs_->ram_tier_stats().dirty_bytes, more.size()) << "the second write did not go to the tier";
  EXPECT_TRUE(SameBytes(ReadAll(first), half));
  EXPECT_TRUE(SameBytes(ReadAll(second), more));
}

TEST_P(FilesystemDataTest, UnalignedWritesAcrossBlockBoundaries) {
  std::mt19937_64 rng(11);
  InodeNumber ino = MakeFile(kRootInode, "f");
  std::string model;
  const std::pair<uint64_t, size_t> writes[] = {
      {0, 1},      {4095, 2},   {4096, 4096},   {8191, 4098},     {12289, 1},   {1, 4094},  {20000, 12288},
      {4000, 200}, {100000, 1}, {65535, 65538}, {3 * 4096, 4096}, {50000, 100}, {99999, 3}, {0, 4096 * 5 + 7}};
  for (auto [offset, length] : writes) {
    std::string data = RandomBytes(length, &rng);
    WriteAt(ino, offset, data);
    if (model.size() < offset + length) model.resize(offset + length, '\0');
    model.replace(offset, length, data);
    ASSERT_EQ(Size(ino), model.size());
    ASSERT_TRUE(SameBytes(ReadAll(ino), model)) << "after writing " << offset << "+" << length;
  }
  // Reads at awkward places return exactly the model's bytes, and stop at EOF.
  for (auto [offset, length] : std::vector<std::pair<uint64_t, size_t>>{{0, 1},
                                                                        {4095, 2},
                                                                        {4095, 4098},
                                                                        {12287, 3},
                                                                        {99990, 100},
                                                                        {model.size() - 1, 10},
                                                                        {model.size(), 10},
                                                                        {model.size() + 5000, 10},
                                                                        {7, 0}}) {
    auto got = ReadAt(ino, offset, length);
    ASSERT_TRUE(got.ok());
    std::string want = offset < model.size() ? model.substr(offset, length) : "";
    EXPECT_TRUE(SameBytes(*got, want)) << offset << "+" << length;
  }
  ExpectExtentMapSane(ino);
}

TEST_P(FilesystemDataTest, RandomWritesTruncatesAndReadsMatchAModel) {
  std::mt19937_64 rng(20240607);
  InodeNumber ino = MakeFile(kRootInode, "model");
  std::string model;
  for (int step = 0; step < 400; ++step) {
    int op = static_cast<int>(rng() % 10);
    if (op < 6) {
      uint64_t offset = rng() % 300000;
      size_t length = 1 + rng() % (rng() % 4 == 0 ? 70000 : 5000);
      std::string data = RandomBytes(length, &rng);
      WriteAt(ino, offset, data);
      if (model.size() < offset + length) model.resize(offset + length, '\0');
      model.replace(offset, length, data);
    } else if (op < 7) {
      uint64_t size = rng() % 300000;
      ASSERT_TRUE(Truncate(ino, size).ok());
      model.resize(size, '\0');
    } else {
      uint64_t offset = rng() % (model.size() + 1000);
      size_t length = rng() % 20000;
      auto got = ReadAt(ino, offset, length);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      std::string want = offset < model.size() ? model.substr(offset, length) : "";
      ASSERT_TRUE(SameBytes(*got, want)) << "step " << step << ": read " << offset << "+" << length;
    }
    ASSERT_EQ(Size(ino), model.size()) << "step " << step;
    if (step % 50 == 49) {
      ASSERT_TRUE(SameBytes(ReadAll(ino), model)) << "step " << step;
      ExpectExtentMapSane(ino);
      ExpectSpaceAccountedFor();
      if (HasFailure()) return;
    }
  }
  Reopen();
  EXPECT_TRUE(SameBytes(ReadAll(ino), model));
}

TEST_P(FilesystemDataTest, TruncateDownMidBlockThenUpReadsZeros) {
  std::mt19937_64 rng(3);
  InodeNumber ino = MakeFile(kRootInode, "t");
  std::string data = RandomBytes(16384, &rng);
  WriteAt(ino, 0, data);  // one write: one 4-block extent
  ASSERT_EQ(Extents(ino).size(), 1u);

  ASSERT_TRUE(Truncate(ino, 5000).ok());
  EXPECT_EQ(Size(ino), 5000u);
  EXPECT_TRUE(SameBytes(ReadAll(ino), data.substr(0, 5000)));
  // Nothing of the old data may stay mapped past the new end.
  for (const auto& [offset, record] : Extents(ino)) {
    EXPECT_LT(offset, 8192u) << "extent at file offset " << offset << " still mapped after truncate to 5000";
  }
  ExpectExtentMapSane(ino);
  ExpectSpaceAccountedFor();

  ASSERT_TRUE(Truncate(ino, 16384).ok());
  EXPECT_EQ(Size(ino), 16384u);
  std::string expected = data.substr(0, 5000) + std::string(16384 - 5000, '\0');
  EXPECT_TRUE(SameBytes(ReadAll(ino), expected)) << "bytes past the truncation point did not read as zeros";
  ExpectExtentMapSane(ino);

  // Truncating to a block boundary and to zero, then growing, also reads zeros.
  WriteAt(ino, 0, data);
  ASSERT_TRUE(Truncate(ino, 8192).ok());
  ASSERT_TRUE(Truncate(ino, 20000).ok());
  EXPECT_TRUE(SameBytes(ReadAll(ino), data.substr(0, 8192) + std::string(20000 - 8192, '\0')));
  ASSERT_TRUE(Truncate(ino, 0).ok());
  EXPECT_EQ(fs_->GetAttr(ino)->attr.st_blocks, 0);
  ASSERT_TRUE(Truncate(ino, 10000).ok());
  EXPECT_TRUE(SameBytes(ReadAll(ino), std::string(10000, '\0')));

  // Deleting the file gives every block back.
  ASSERT_TRUE(fs_->Unlink(kRootInode, "t").ok());
  EXPECT_EQ(FreeBlocks(), initial_free_);
  ExpectSpaceAccountedFor();
}

TEST_P(FilesystemDataTest, TruncateDownMidBlockOfASmallWriteReadsZerosAfterGrowing) {
  // The same, with the tail block mapped by an extent of its own.
  std::mt19937_64 rng(4);
  InodeNumber ino = MakeFile(kRootInode, "t");
  std::string data = RandomBytes(4096, &rng);
  WriteAt(ino, 0, data);
  ASSERT_TRUE(Truncate(ino, 100).ok());
  ASSERT_TRUE(Truncate(ino, 4096).ok());
  EXPECT_TRUE(SameBytes(ReadAll(ino), data.substr(0, 100) + std::string(4096 - 100, '\0')));
  // Writing past the end after a shrink leaves zeros in between.
  ASSERT_TRUE(Truncate(ino, 50).ok());
  WriteAt(ino, 3000, "xyz");
  EXPECT_TRUE(SameBytes(ReadAll(ino), data.substr(0, 50) + std::string(3000 - 50, '\0') + "xyz"));
  ExpectExtentMapSane(ino);
}

TEST_P(FilesystemDataTest, PunchHoleReadsZerosAndFreesWholeBlocks) {
  std::mt19937_64 rng(5);
  InodeNumber ino = MakeFile(kRootInode, "p");
  std::string model = RandomBytes(65536, &rng);
  WriteAt(ino, 0, model);
  EXPECT_EQ(FreeBlocks(), initial_free_ - 16);

  ASSERT_TRUE(fs_->Fallocate(ino, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 5000, 25000).ok());
  std::fill(model.begin() + 5000, model.begin() + 30000, '\0');
  EXPECT_EQ(Size(ino), 65536u);
  EXPECT_TRUE(SameBytes(ReadAll(ino), model));
  // Blocks 2..6 ([8192, 28672)) lie wholly inside the hole and are unmapped.
  EXPECT_EQ(fs_->GetAttr(ino)->attr.st_blocks * 512, 65536 - 5 * 4096);
  EXPECT_EQ(FreeBlocks(), initial_free_ - 11);
  for (const auto& [offset, record] : Extents(ino)) {
    EXPECT_FALSE(offset >= 8192 && offset < 28672) << "block at " << offset << " still mapped";
  }

  // A hole inside one block, and one running past the end of the file.
  ASSERT_TRUE(fs_->Fallocate(ino, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 40000, 10).ok());
  std::fill(model.begin() + 40000, model.begin() + 40010, '\0');
  ASSERT_TRUE(fs_->Fallocate(ino, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 60000, 100000).ok());
  std::fill(model.begin() + 60000, model.end(), '\0');
  EXPECT_EQ(Size(ino), 65536u);
  EXPECT_TRUE(SameBytes(ReadAll(ino), model));
  ExpectExtentMapSane(ino);

  EXPECT_EQ(fs_->Fallocate(ino, FALLOC_FL_PUNCH_HOLE, 0, 4096).code(), EOPNOTSUPP);
  EXPECT_EQ(fs_->Fallocate(ino, FALLOC_FL_KEEP_SIZE, 0, 0).code(), EINVAL);
  EXPECT_EQ(fs_->Fallocate(kRootInode, 0, 0, 4096).code(), EISDIR);
  EXPECT_TRUE(SameBytes(ReadAll(ino), model));

  Reopen();
  EXPECT_TRUE(SameBytes(ReadAll(ino), model));
}

// Holes, unwritten (fallocated) ranges and the tail past the last extent
// read as zeros even into a reused buffer full of other bytes: the read
// zeroes only what no extent covers, so nothing may be left out.
TEST_P(FilesystemDataTest, HolesReadAsZerosIntoAReusedBuffer) {
  std::mt19937_64 rng(11);
  InodeNumber ino = MakeFile(kRootInode, "holes");
  const uint64_t size = 3 * 1024 * 1024;
  std::string model(size, '\0');
  auto write = [&](uint64_t offset, size_t length) {
    std::string bytes = RandomBytes(length, &rng);
    WriteAt(ino, offset, bytes);
    model.replace(offset, length, bytes);
  };
  write(0, 8192);                                                              // data, then a hole
  write(1 << 20, 4096 + 100);                                                  // a block and a bit of the next
  ASSERT_TRUE(fs_->Fallocate(ino, FALLOC_FL_KEEP_SIZE, 2 << 20, 65536).ok());  // unwritten
  write((2 << 20) + 65536, 4096);                                              // right after it
  SetAttrRequest grow;
  grow.size = size;  // a tail that no extent covers
  ASSERT_TRUE(fs_->SetAttr(ino, grow).ok());
  ASSERT_TRUE(fs_->Fsync(ino, false).ok());  // on the SSD: read by ReadBlocks

  AlignedBuffer scratch(size + 8192);
  for (uint64_t offset : {uint64_t{0}, uint64_t{5000}, uint64_t{(1 << 20) - 4096}, uint64_t{2 << 20}}) {
    std::memset(scratch.data(), 0xAB, size + 8192);
    std::string bytes;
    auto n = fs_->Read(ino, offset, size, &scratch, [&](const iovec* pieces, int count) {
      for (int i = 0; i < count; ++i) bytes.append(static_cast<const char*>(pieces[i].iov_base), pieces[i].iov_len);
    });
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    ASSERT_EQ(bytes.size(), size - offset);
    EXPECT_TRUE(SameBytes(bytes, model.substr(offset))) << "read from " << offset;
  }
}

// A block that a write only partly covers keeps its old bytes elsewhere;
// past the end of the file those are zeros, even when the RAM tier hands the
// write a buffer that held another file's bytes (the pool reuses the most
// recently released first). Covers the sequential unaligned writer (every
// write ends in a partial block past the end), a gap past the end, and the
// end moved down by truncate before and after a flush.
TEST_P(FilesystemDataTest, PartialBlocksPastTheEndReadAsZerosInReusedBuffers) {
  std::mt19937_64 rng(12);
  InodeNumber junk = MakeFile(kRootInode, "junk");
  WriteAt(junk, 0, std::string(2 << 20, '\xCD'));
  ASSERT_TRUE(fs_->Unlink(kRootInode, "junk").ok());  // its RAM-tier buffers go back to the pool

  InodeNumber ino = MakeFile(kRootInode, "f");
  std::string model;
  auto write = [&](uint64_t offset, size_t length) {
    std::string bytes = RandomBytes(length, &rng);
    WriteAt(ino, offset, bytes);
    if (model.size() < offset + length) model.resize(offset + length, '\0');
    model.replace(offset, length, bytes);
  };
  auto truncate = [&](uint64_t size) {
    SetAttrRequest request;
    request.size = size;
    ASSERT_TRUE(fs_->SetAttr(ino, request).ok());
    model.resize(size, '\0');
  };
  for (uint64_t k = 0; k < 8; ++k) write(320 + k * 65536, 65536);  // torch.save's offsets
  write((1 << 20) + 100, 10);                                      // a gap past the end
  ASSERT_TRUE(SameBytes(ReadAll(ino), model)) << "unaligned sequential writes and a gap";
  truncate(500000);
  write(600007, 5);
  ASSERT_TRUE(SameBytes(ReadAll(ino), model)) << "after truncate in the RAM tier";
  ASSERT_TRUE(fs_->Fsync(ino, false).ok());
  truncate(1000);
  write(5000, 10);
  ASSERT_TRUE(SameBytes(ReadAll(ino), model)) << "after truncate of flushed data";
  ASSERT_TRUE(fs_->Fsync(ino, false).ok());
  EXPECT_TRUE(SameBytes(ReadAll(ino), model)) << "from the SSD";
  ExpectExtentMapSane(ino);
}

TEST_P(FilesystemDataTest, FallocateAndZeroRange) {
  std::mt19937_64 rng(6);
  InodeNumber ino = MakeFile(kRootInode, "fa");
  std::string model = RandomBytes(10000, &rng);
  WriteAt(ino, 0, model);

  // Mode 0 past the end grows the file; the new range reads as zeros.
  ASSERT_TRUE(fs_->Fallocate(ino, 0, 8000, 30000).ok());
  model.resize(38000, '\0');
  EXPECT_EQ(Size(ino), 38000u);
  EXPECT_TRUE(SameBytes(ReadAll(ino), model));
  EXPECT_EQ(fs_->GetAttr(ino)->attr.st_blocks * 512, RoundUp(38000, kBlock));
  EXPECT_EQ(FreeBlocks(), initial_free_ - RoundUp(38000, kBlock) / kBlock);

  // KEEP_SIZE allocates without changing the size.
  ASSERT_TRUE(fs_->Fallocate(ino, FALLOC_FL_KEEP_SIZE, 40960, 8192).ok());
  EXPECT_EQ(Size(ino), 38000u);
  EXPECT_TRUE(SameBytes(ReadAll(ino), model));

  // Writes into preallocated space read back; ZERO_RANGE zeroes.
  std::string data = RandomBytes(5000, &rng);
  WriteAt(ino, 20000, data);
  model.replace(20000, 5000, data);
  ASSERT_TRUE(fs_->Fallocate(ino, FALLOC_FL_ZERO_RANGE, 3000, 19000).ok());
  std::fill(model.begin() + 3000, model.begin() + 22000, '\0');
  EXPECT_TRUE(SameBytes(ReadAll(ino), model));
  ExpectExtentMapSane(ino);

  ASSERT_TRUE(fs_->Unlink(kRootInode, "fa").ok());
  EXPECT_EQ(FreeBlocks(), initial_free_);
}

TEST_P(FilesystemDataTest, SeekDataAndSeekHole) {
  InodeNumber ino = MakeFile(kRootInode, "sparse");
  std::mt19937_64 rng(7);
  WriteAt(ino, 0, RandomBytes(8192, &rng));
  WriteAt(ino, 65536, std::string(100, 'b'));
  const uint64_t size = 65636;
  ASSERT_EQ(Size(ino), size);
  auto seek = [&](uint64_t offset, int whence) -> int64_t {
    auto r = fs_->Lseek(ino, offset, whence);
    return r.ok() ? static_cast<int64_t>(*r) : -r.status().code();
  };
  EXPECT_EQ(seek(0, SEEK_DATA), 0);
  EXPECT_EQ(seek(5000, SEEK_DATA), 5000);
  EXPECT_EQ(seek(0, SEEK_HOLE), 8192);
  EXPECT_EQ(seek(5000, SEEK_HOLE), 8192);
  EXPECT_EQ(seek(8192, SEEK_DATA), 65536);
  EXPECT_EQ(seek(30000, SEEK_DATA), 65536);
  EXPECT_EQ(seek(8192, SEEK_HOLE), 8192);
  EXPECT_EQ(seek(30000, SEEK_HOLE), 30000);
  EXPECT_EQ(seek(65536, SEEK_DATA), 65536);
  EXPECT_EQ(seek(65536, SEEK_HOLE), static_cast<int64_t>(size));  // the implicit hole at EOF
  EXPECT_EQ(seek(65600, SEEK_HOLE), static_cast<int64_t>(size));
  EXPECT_EQ(seek(size, SEEK_DATA), -ENXIO);
  EXPECT_EQ(seek(size, SEEK_HOLE), -ENXIO);
  EXPECT_EQ(seek(1ull << 40, SEEK_DATA), -ENXIO);
  EXPECT_EQ(seek(0, 12345), -EINVAL);

  // Two adjacent extents are one run of data.
  WriteAt(ino, 8192, std::string(4096, 'c'));
  EXPECT_EQ(seek(0, SEEK_HOLE), 12288);

  // Punching the start moves the first data.
  ASSERT_TRUE(fs_->Fallocate(ino, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 12288).ok());
  EXPECT_EQ(seek(0, SEEK_DATA), 65536);
  EXPECT_EQ(seek(0, SEEK_HOLE), 0);

  // A file that is all hole.
  InodeNumber empty = MakeFile(kRootInode, "hole");
  ASSERT_TRUE(Truncate(empty, 1 << 20).ok());
  auto data = fs_->Lseek(empty, 0, SEEK_DATA);
  EXPECT_EQ(data.status().code(), ENXIO);
  auto hole = fs_->Lseek(empty, 0, SEEK_HOLE);
  ASSERT_TRUE(hole.ok());
  EXPECT_EQ(*hole, 0u);
  hole = fs_->Lseek(empty, 12345, SEEK_HOLE);
  ASSERT_TRUE(hole.ok());
  EXPECT_EQ(*hole, 12345u);
  EXPECT_TRUE(SameBytes(ReadAll(empty), std::string(1 << 20, '\0')));
}

// ---- rename ----

TEST_F(FilesystemTest, RenameWithinAndAcrossDirectories) {
  InodeNumber d1 = MakeDir(kRootInode, "d1");
  InodeNumber f = MakeFile(kRootInode, "f");
  WriteAt(f, 0, "contents of f");
  ASSERT_TRUE(fs_->Rename(kRootInode, "f", kRootInode, "g", 0).ok());
  EXPECT_EQ(LookupErr(kRootInode, "f"), ENOENT);
  EXPECT_EQ(LookupIno(kRootInode, "g"), f);
  ASSERT_TRUE(fs_->Rename(kRootInode, "g", d1, "h", 0).ok());
  EXPECT_EQ(LookupErr(kRootInode, "g"), ENOENT);
  EXPECT_EQ(LookupIno(d1, "h"), f);
  EXPECT_TRUE(SameBytes(ReadAll(f), "contents of f"));
  EXPECT_EQ(fs_->GetAttr(d1)->attr.st_nlink, 2u);

  // A directory moves with its ".." and its parents' link counts.
  InodeNumber sub = MakeDir(d1, "sub");
  InodeNumber inner = MakeFile(sub, "inner");
  EXPECT_EQ(fs_->GetAttr(d1)->attr.st_nlink, 3u);
  ASSERT_TRUE(fs_->Rename(d1, "sub", kRootInode, "moved", 0).ok());
  EXPECT_EQ(fs_->GetAttr(d1)->attr.st_nlink, 2u);
  EXPECT_EQ(fs_->GetAttr(kRootInode)->attr.st_nlink, 4u);  // d1 and moved
  EXPECT_EQ(LookupIno(sub, ".."), kRootInode);
  EXPECT_EQ(LookupIno(sub, "inner"), inner);
  EXPECT_EQ((*fs_->ReadDir(sub))[1].ino, kRootInode);

  // Errors change nothing.
  EXPECT_EQ(fs_->Rename(kRootInode, "nope", kRootInode, "x", 0).code(), ENOENT);
  EXPECT_EQ(fs_->Rename(kRootInode, "moved", f, "x", 0).code(), ENOTDIR);
  EXPECT_EQ(fs_->Rename(kRootInode, "moved", kRootInode, "x", RENAME_NOREPLACE | RENAME_EXCHANGE).code(), EINVAL);
  EXPECT_EQ(fs_->Rename(kRootInode, "moved", kRootInode, std::string(256, 'x'), 0).code(), ENAMETOOLONG);
  EXPECT_EQ(LookupIno(kRootInode, "moved"), sub);

  // Renaming onto itself, or onto another link of the same inode, does nothing.
  ASSERT_TRUE(fs_->Rename(d1, "h", d1, "h", 0).ok());
  EXPECT_EQ(LookupIno(d1, "h"), f);
  ASSERT_TRUE(fs_->Link(f, kRootInode, "h-link").ok());
  ASSERT_TRUE(fs_->Rename(d1, "h", kRootInode, "h-link", 0).ok());
  EXPECT_EQ(LookupIno(d1, "h"), f);
  EXPECT_EQ(LookupIno(kRootInode, "h-link"), f);
  EXPECT_EQ(fs_->GetAttr(f)->attr.st_nlink, 2u);
}

TEST_P(FilesystemDataTest, RenameOverAnExistingFileReplacesIt) {
  std::mt19937_64 rng(8);
  InodeNumber x = MakeFile(kRootInode, "x");
  InodeNumber y = MakeFile(kRootInode, "y");
  WriteAt(x, 0, "xxxx");
  WriteAt(y, 0, RandomBytes(1 << 20, &rng));
  EXPECT_EQ(FreeBlocks(), initial_free_ - 1 - 256);

  EXPECT_EQ(fs_->Rename(kRootInode, "x", kRootInode, "y", RENAME_NOREPLACE).code(), EEXIST);
  EXPECT_EQ(LookupIno(kRootInode, "x"), x);
  EXPECT_EQ(LookupIno(kRootInode, "y"), y);

  ASSERT_TRUE(fs_->Rename(kRootInode, "x", kRootInode, "y", 0).ok());
  EXPECT_EQ(LookupErr(kRootInode, "x"), ENOENT);
  EXPECT_EQ(LookupIno(kRootInode, "y"), x);
  EXPECT_TRUE(SameBytes(ReadAll(x), "xxxx"));
  EXPECT_EQ(fs_->GetAttr(y).status().code(), ENOENT);
  EXPECT_EQ(FreeBlocks(), initial_free_ - 1) << "the replaced file's blocks were not freed";
  EXPECT_EQ(CountKeys(Family::kExtent, keys::Ino(y)), 0u);

  ASSERT_TRUE(fs_->Rename(kRootInode, "y", kRootInode, "z", RENAME_NOREPLACE).ok());
  EXPECT_EQ(LookupIno(kRootInode, "z"), x);
  auto entries = fs_->ReadDir(kRootInode);
  ASSERT_TRUE(entries.ok());
  EXPECT_EQ(entries->size(), 3u);
}

TEST_F(FilesystemTest, RenameExchange) {
  InodeNumber d1 = MakeDir(kRootInode, "d1");
  InodeNumber d2 = MakeDir(kRootInode, "d2");
  InodeNumber f = MakeFile(d1, "f");
  WriteAt(f, 0, "file f");
  InodeNumber g = MakeDir(d2, "g");
  InodeNumber child = MakeFile(g, "child");
  ASSERT_EQ(fs_->GetAttr(d1)->attr.st_nlink, 2u);
  ASSERT_EQ(fs_->GetAttr(d2)->attr.st_nlink, 3u);

  ASSERT_TRUE(fs_->Rename(d1, "f", d2, "g", RENAME_EXCHANGE).ok());
  EXPECT_EQ(LookupIno(d1, "f"), g);
  EXPECT_EQ(LookupIno(d2, "g"), f);
  EXPECT_EQ(fs_->GetAttr(d1)->attr.st_nlink, 3u) << "d1 gained a subdirectory";
  EXPECT_EQ(fs_->GetAttr(d2)->attr.st_nlink, 2u) << "d2 lost a subdirectory";
  EXPECT_EQ(LookupIno(g, ".."), d1);
  EXPECT_EQ(LookupIno(g, "child"), child);
  EXPECT_TRUE(SameBytes(ReadAll(f), "file f"));
  auto listing = fs_->ReadDir(d1);
  ASSERT_TRUE(listing.ok());
  ASSERT_EQ(listing->size(), 3u);
  EXPECT_EQ((*listing)[2].name, "f");
  EXPECT_EQ((*listing)[2].type, static_cast<uint32_t>(S_IFDIR));
  listing = fs_->ReadDir(d2);
  ASSERT_TRUE(listing.ok());
  ASSERT_EQ(listing->size(), 3u);
  EXPECT_EQ((*listing)[2].type, static_cast<uint32_t>(S_IFREG));

  // Two files in one directory swap names.
  InodeNumber a = MakeFile(kRootInode, "a");
  InodeNumber b = MakeFile(kRootInode, "b");
  WriteAt(a, 0, "AAAA");
  WriteAt(b, 0, "BB");
  ASSERT_TRUE(fs_->Rename(kRootInode, "a", kRootInode, "b", RENAME_EXCHANGE).ok());
  EXPECT_EQ(LookupIno(kRootInode, "a"), b);
  EXPECT_EQ(LookupIno(kRootInode, "b"), a);
  EXPECT_TRUE(SameBytes(ReadAll(LookupIno(kRootInode, "a")), "BB"));
  EXPECT_EQ(fs_->GetAttr(kRootInode)->attr.st_nlink, 4u);

  // Exchange needs both names.
  EXPECT_EQ(fs_->Rename(kRootInode, "a", kRootInode, "missing", RENAME_EXCHANGE).code(), ENOENT);
  EXPECT_EQ(LookupIno(kRootInode, "a"), b);

  // Two directories in different parents swap, with their "..".
  InodeNumber e1 = MakeDir(d1, "e1");
  InodeNumber e2 = MakeDir(d2, "e2");
  ASSERT_TRUE(fs_->Rename(d1, "e1", d2, "e2", RENAME_EXCHANGE).ok());
  EXPECT_EQ(LookupIno(d1, "e1"), e2);
  EXPECT_EQ(LookupIno(d2, "e2"), e1);
  EXPECT_EQ(LookupIno(e1, ".."), d2);
  EXPECT_EQ(LookupIno(e2, ".."), d1);
  EXPECT_EQ(fs_->GetAttr(d1)->attr.st_nlink, 4u);
  EXPECT_EQ(fs_->GetAttr(d2)->attr.st_nlink, 3u);

  Reopen();
  EXPECT_EQ(LookupIno(d1, "f"), g);
  EXPECT_EQ(LookupIno(g, ".."), d1);
  EXPECT_EQ(LookupIno(e1, ".."), d2);
  EXPECT_EQ(fs_->GetAttr(d1)->attr.st_nlink, 4u);
}

TEST_F(FilesystemTest, RenameReplacesAnEmptyDirectory) {
  InodeNumber p1 = MakeDir(kRootInode, "p1");
  InodeNumber p2 = MakeDir(kRootInode, "p2");
  InodeNumber src = MakeDir(p1, "src");
  InodeNumber inside = MakeFile(src, "inside");
  InodeNumber dst = MakeDir(p2, "dst");
  InodeNumber full = MakeDir(p2, "full");
  MakeFile(full, "keep");
  InodeNumber file = MakeFile(p2, "file");
  ASSERT_EQ(fs_->GetAttr(p1)->attr.st_nlink, 3u);
  ASSERT_EQ(fs_->GetAttr(p2)->attr.st_nlink, 4u);

  EXPECT_EQ(fs_->Rename(p1, "src", p2, "full", 0).code(), ENOTEMPTY);
  EXPECT_EQ(fs_->Rename(p1, "src", p2, "file", 0).code(), ENOTDIR);
  EXPECT_EQ(fs_->Rename(p2, "file", p2, "dst", 0).code(), EISDIR);
  EXPECT_EQ(LookupIno(p2, "full"), full);
  EXPECT_EQ(LookupIno(p2, "file"), file);

  ASSERT_TRUE(fs_->Rename(p1, "src", p2, "dst", 0).ok());
  EXPECT_EQ(LookupErr(p1, "src"), ENOENT);
  EXPECT_EQ(LookupIno(p2, "dst"), src);
  EXPECT_EQ(LookupIno(src, ".."), p2);
  EXPECT_EQ(LookupIno(src, "inside"), inside);
  EXPECT_EQ(fs_->GetAttr(dst).status().code(), ENOENT) << "the replaced directory still exists";
  EXPECT_EQ(fs_->GetAttr(p1)->attr.st_nlink, 2u);
  EXPECT_EQ(fs_->GetAttr(p2)->attr.st_nlink, 4u);  // lost dst, gained src

  // Within one directory.
  InodeNumber e = MakeDir(p2, "empty");
  ASSERT_EQ(fs_->GetAttr(p2)->attr.st_nlink, 5u);
  ASSERT_TRUE(fs_->Rename(p2, "dst", p2, "empty", 0).ok());
  EXPECT_EQ(LookupIno(p2, "empty"), src);
  EXPECT_EQ(fs_->GetAttr(e).status().code(), ENOENT);
  EXPECT_EQ(fs_->GetAttr(p2)->attr.st_nlink, 4u);

  Reopen();
  EXPECT_EQ(LookupIno(p2, "empty"), src);
  EXPECT_EQ(fs_->GetAttr(p2)->attr.st_nlink, 4u);
  EXPECT_EQ(CountKeys(Family::kInode, keys::Ino(dst)), 0u);
  EXPECT_EQ(CountKeys(Family::kDirent, keys::Ino(dst)), 0u);
}

// ---- open-unlinked files and orphans ----

TEST_P(FilesystemDataTest, UnlinkedOpenFileKeepsItsDataUntilRelease) {
  std::mt19937_64 rng(10);
  InodeNumber ino = MakeFile(kRootInode, "open");
  std::string data = RandomBytes(1 << 20, &rng);
  WriteAt(ino, 0, data);
  const uint64_t with_file = FreeBlocks();
  EXPECT_EQ(with_file, initial_free_ - 256);

  ASSERT_TRUE(fs_->Open(ino).ok());
  ASSERT_TRUE(fs_->Open(ino).ok());  // two handles
  ASSERT_TRUE(fs_->Unlink(kRootInode, "open").ok());
  EXPECT_EQ(LookupErr(kRootInode, "open"), ENOENT);
  EXPECT_EQ(fs_->ReadDir(kRootInode)->size(), 2u);
  auto attr = fs_->GetAttr(ino);
  ASSERT_TRUE(attr.ok());
  EXPECT_EQ(attr->attr.st_nlink, 0u);
  EXPECT_TRUE(HasKey(Family::kOrphan, keys::Ino(ino)));
  EXPECT_TRUE(SameBytes(ReadAll(ino), data));
  EXPECT_EQ(FreeBlocks(), with_file) << "space of an open unlinked file was freed early";

  // It stays writable.
  WriteAt(ino, 1 << 20, "tail");
  EXPECT_TRUE(SameBytes(ReadAll(ino), data + "tail"));

  ASSERT_TRUE(fs_->Release(ino).ok());
  EXPECT_TRUE(fs_->GetAttr(ino).ok()) << "freed while a handle is still open";
  EXPECT_EQ(ReadAll(ino).size(), data.size() + 4);
  ASSERT_TRUE(fs_->Release(ino).ok());
  EXPECT_EQ(fs_->GetAttr(ino).status().code(), ENOENT);
  EXPECT_EQ(FreeBlocks(), initial_free_);
  EXPECT_FALSE(HasKey(Family::kOrphan, keys::Ino(ino)));
  EXPECT_EQ(CountKeys(Family::kExtent, keys::Ino(ino)), 0u);
  ExpectSpaceAccountedFor();
}

TEST_P(FilesystemDataTest, UnlinkOfOneOfTwoLinksKeepsTheData) {
  InodeNumber ino = MakeFile(kRootInode, "one");
  WriteAt(ino, 0, "shared");
  ASSERT_TRUE(fs_->Link(ino, kRootInode, "two").ok());
  ASSERT_TRUE(fs_->Unlink(kRootInode, "one").ok());
  EXPECT_EQ(fs_->GetAttr(ino)->attr.st_nlink, 1u);
  EXPECT_FALSE(HasKey(Family::kOrphan, keys::Ino(ino)));
  EXPECT_TRUE(SameBytes(ReadAll(ino), "shared"));
  ASSERT_TRUE(fs_->Unlink(kRootInode, "two").ok());
  EXPECT_EQ(fs_->GetAttr(ino).status().code(), ENOENT);
  EXPECT_EQ(FreeBlocks(), initial_free_);
}

TEST_P(FilesystemDataTest, OrphanIsReclaimedWhenTheVolumeIsOpenedAgain) {
  std::mt19937_64 rng(12);
  InodeNumber ino = MakeFile(kRootInode, "orphan");
  WriteAt(ino, 0, RandomBytes(512 << 10, &rng));
  InodeNumber keep = MakeFile(kRootInode, "keep");
  std::string kept = RandomBytes(10000, &rng);
  WriteAt(keep, 0, kept);
  ASSERT_TRUE(fs_->Open(ino).ok());
  ASSERT_TRUE(fs_->Unlink(kRootInode, "orphan").ok());
  EXPECT_TRUE(HasKey(Family::kOrphan, keys::Ino(ino)));
  EXPECT_EQ(FreeBlocks(), initial_free_ - 128 - 3);

  // The daemon goes away without releasing the handle.
  Reopen();
  EXPECT_FALSE(HasKey(Family::kOrphan, keys::Ino(ino)));
  EXPECT_FALSE(HasKey(Family::kInode, keys::Ino(ino)));
  EXPECT_EQ(CountKeys(Family::kExtent, keys::Ino(ino)), 0u);
  EXPECT_EQ(fs_->GetAttr(ino).status().code(), ENOENT);
  EXPECT_EQ(FreeBlocks(), initial_free_ - 3);
  EXPECT_TRUE(SameBytes(ReadAll(keep), kept));
  ExpectSpaceAccountedFor();

  // And the reclaimed space stays free across another open.
  Reopen();
  EXPECT_EQ(FreeBlocks(), initial_free_ - 3);
  EXPECT_EQ(CountKeys(Family::kOrphan), 0u);
}

// ---- space accounting ----

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
        std::string data = RandomBytes(1 + rng() % 40000, &rng);
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
  const std::string same = RandomBytes(1 << 20, &rng);
  std::vector<InodeNumber> copies;
  for (int i = 0; i < 3; ++i) {
    std::string name = "copy" + std::to_string(i);
    copies.push_back(MakeFile(dir, name));
    names.emplace_back(dir, name);
    WriteAt(copies.back(), i == 2 ? 256 << 10 : 0, same);
    FlushAll();
  }
  std::string changed = RandomBytes(5000, &rng);
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

TEST_P(FilesystemDataTest, ErrorsOfTheDataPath) {
  InodeNumber ino = MakeFile(kRootInode, "e");
  WriteAt(ino, 0, "abc");
  EXPECT_EQ(fs_->Write(ino, 1ull << 62, "x", 1).status().code(), EFBIG);
  EXPECT_EQ(fs_->Write(ino, UINT64_MAX - 1, "xyz", 3).status().code(), EFBIG);
  EXPECT_EQ(Truncate(ino, (1ull << 62) + 1).code(), EFBIG);
  EXPECT_EQ(Truncate(kRootInode, 0).code(), EISDIR);
  EXPECT_EQ(ReadAt(kRootInode, 0, 10).status().code(), EISDIR);
  EXPECT_EQ(fs_->Write(ino, 10, "", 0).status().code(), 0);
  EXPECT_EQ(fs_->GetAttr(999999).status().code(), ENOENT);
  EXPECT_EQ(fs_->Open(999999).code(), ENOENT);
  EXPECT_EQ(fs_->Symlink(kRootInode, "long", std::string(Filesystem::kSymlinkMax + 1, 's'), caller_).status().code(),
            ENAMETOOLONG);
  EXPECT_EQ(Size(ino), 3u);
  EXPECT_TRUE(SameBytes(ReadAll(ino), "abc"));
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
  std::string chunk = RandomBytes(4 << 20, &rng);
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
  WriteAt(a, 0, RandomBytes(1 << 20, &rng));
  // Everything but 512 KiB is taken.
  InodeNumber filler = MakeFile(kRootInode, "filler");
  const uint64_t fill = FreeBlocks() * kBlock - (512 << 10);
  for (uint64_t at = 0; at < fill; at += 4 << 20) {  // pieces the RAM tier takes at once
    WriteAt(filler, at, RandomBytes(std::min<uint64_t>(4 << 20, fill - at), &rng));
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
  std::string b_data = RandomBytes(256 << 10, &rng);
  WriteAt(b, 0, b_data);
  EXPECT_FALSE(overlaps(physical(b), old)) << "a's blocks reused before its unlink was durable";
  EXPECT_LT(index().durable_commit(), unlink) << "synced although there was room";

  // 512 KiB more fits only in a's old space: the write syncs, then reuses it.
  InodeNumber c = MakeFile(kRootInode, "c");
  std::string c_data = RandomBytes(512 << 10, &rng);
  WriteAt(c, 0, c_data);
  EXPECT_TRUE(overlaps(physical(c), old));
  EXPECT_GE(index().durable_commit(), unlink);
  EXPECT_TRUE(SameBytes(ReadAll(b), b_data));
  EXPECT_TRUE(SameBytes(ReadAll(c), c_data));
  ExpectSpaceAccountedFor();
}

// ---- corruption ----

TEST_P(FilesystemDataTest, FlippedByteUnderAnExtentReadsAsEIO) {
  std::mt19937_64 rng(15);
  InodeNumber ino = MakeFile(kRootInode, "c");
  std::string data = RandomBytes(3 * kBlock, &rng);
  WriteAt(ino, 0, data);
  ASSERT_TRUE(fs_->SyncAll().ok());
  auto extents = Extents(ino);
  ASSERT_EQ(extents.size(), 1u);
  ASSERT_EQ(extents[0].first, 0u);
  const uint64_t physical = extents[0].second.physical;
  ASSERT_EQ(extents[0].second.block_checksums.size(), 3u);

  // Damage one byte of the second block in the image itself.
  const uint64_t where = physical + kBlock + 123;
  int fd = open(Volume::ImagePath(vol_).c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  char byte = 0;
  ASSERT_EQ(pread(fd, &byte, 1, static_cast<off_t>(where)), 1);
  ASSERT_EQ(byte, data[kBlock + 123]) << "the extent map does not point at the file's bytes";
  byte = static_cast<char>(byte ^ 0x40);
  ASSERT_EQ(pwrite(fd, &byte, 1, static_cast<off_t>(where)), 1);
  ASSERT_EQ(fsync(fd), 0);
  close(fd);

  const uint64_t before = fs_->counters().checksum_errors.load();
  auto whole = ReadAt(ino, 0, data.size());
  ASSERT_FALSE(whole.ok()) << "damaged data was returned";
  EXPECT_EQ(whole.status().code(), EIO);
  EXPECT_EQ(fs_->counters().checksum_errors.load(), before + 1);
  auto inside = ReadAt(ino, kBlock + 100, 10);
  ASSERT_FALSE(inside.ok());
  EXPECT_EQ(inside.status().code(), EIO);
  EXPECT_EQ(fs_->counters().checksum_errors.load(), before + 2);

  // The undamaged blocks still read.
  auto first = ReadAt(ino, 0, kBlock);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_TRUE(SameBytes(*first, data.substr(0, kBlock)));
  auto third = ReadAt(ino, 2 * kBlock, kBlock);
  ASSERT_TRUE(third.ok());
  EXPECT_TRUE(SameBytes(*third, data.substr(2 * kBlock)));
  EXPECT_EQ(fs_->counters().checksum_errors.load(), before + 2);

  // Overwriting the whole damaged block repairs the file.
  std::string fresh = RandomBytes(kBlock, &rng);
  WriteAt(ino, kBlock, fresh);
  data.replace(kBlock, kBlock, fresh);
  EXPECT_TRUE(SameBytes(ReadAll(ino), data));
}

// ---- volumes ----

TEST_P(FilesystemDataTest, DataSurvivesReopen) {
  std::mt19937_64 rng(16);
  std::map<std::string, std::string> contents;
  for (int i = 0; i < 5; ++i) {
    std::string name = "p" + std::to_string(i);
    contents[name] = RandomBytes(rng() % 300000, &rng);
    WriteAt(MakeFile(kRootInode, name), 0, contents[name]);
  }
  SetAttrRequest chmod;
  chmod.mode = 0600;
  chmod.mtime_ns = 1234567890123456789;
  ASSERT_TRUE(fs_->SetAttr(LookupIno(kRootInode, "p0"), chmod).ok());
  Reopen();
  for (const auto& [name, data] : contents) {
    InodeNumber ino = LookupIno(kRootInode, name);
    ASSERT_NE(ino, 0u) << name;
    EXPECT_TRUE(SameBytes(ReadAll(ino), data)) << name;
  }
  auto attr = fs_->GetAttr(LookupIno(kRootInode, "p0"));
  ASSERT_TRUE(attr.ok());
  EXPECT_EQ(attr->attr.st_mode, static_cast<mode_t>(S_IFREG | 0600));
  EXPECT_EQ(attr->attr.st_mtim.tv_sec, 1234567890);
  EXPECT_EQ(attr->attr.st_mtim.tv_nsec, 123456789);
}

// ---- read-ahead ----

class ReadAheadTest : public FilesystemDataTest {
 protected:
  // A 24 MiB file "seq" of seeded bytes (`*data`), flushed to the SSD.
  InodeNumber MakeFlushedFile(uint64_t seed, std::string* data) {
    std::mt19937_64 rng(seed);
    *data = RandomBytes(24 << 20, &rng);
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
// spillfs mount takes the volume lock, then forks the daemon, whose
// Volume::Open takes it over: the volume stays locked throughout, and is free
// again once the volume is closed.
TEST(VolumeLockTest, OpenTakesOverAHeldLock) {
  TempDir dir("spillfs-volume-lock-test");
  const std::string vol = dir.path() + "/vol";
  ASSERT_TRUE(Volume::Create(vol, SizedOptions(64 << 20)).ok());
  auto lock = LockVolume(vol);
  ASSERT_TRUE(lock.ok()) << lock.status().ToString();
  {
    auto volume = Volume::Open(vol, {.lock_fd = *lock});
    ASSERT_TRUE(volume.ok()) << volume.status().ToString();
    EXPECT_EQ(LockVolume(vol).status().code(), EBUSY);
  }
  auto again = LockVolume(vol);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  close(*again);
}

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

  std::string patch = RandomBytes(1 << 20, &rng);
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
  std::string patch = RandomBytes(1 << 20, &rng);
  StampBlocks(&patch, 45);
  WriteAt(ino, 6 << 20, patch);  // inside a window already fetched
  if (GetParam() != 0) FlushAll();
  data.replace(6 << 20, patch.size(), patch);
  ExpectSequentialReads(ino, data, 6 << 20, 10 << 20);
}

// Reads of data still in the RAM tier reach the sink straight from its chunks
// (no copy); unaligned edges are cut exactly.
TEST_P(FilesystemDataTest, RamTierReadsPointIntoTheChunks) {
  std::mt19937_64 rng(46);
  std::string data = RandomBytes((3 << 20) + 1234, &rng);
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
  std::string patch = RandomBytes(8192, &rng);
  WriteAt(ino, 4096, patch);
  data.replace(4096, patch.size(), patch);
  auto got = ReadAt(ino, 0, data.size());
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(*got == data);
}

// chmod, chown and utimens change attributes only: data not yet flushed
// from the RAM tier keeps its size and bytes.
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

TEST_P(FilesystemDataTest, AttributeChangesKeepUnflushedData) {
  std::mt19937_64 rng(17);
  InodeNumber ino = MakeFile(kRootInode, "attrs");
  std::string data = RandomBytes(100000, &rng);
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

TEST_F(FilesystemTest, SecondOpenOfAVolumeIsRefusedWhileItIsOpen) {
  auto second = Volume::Open(vol_, Volume::OpenOptions{});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), EBUSY) << second.status().ToString();
  auto read_only = Volume::Open(vol_, Volume::OpenOptions{.read_only = true});
  ASSERT_FALSE(read_only.ok());
  EXPECT_EQ(read_only.status().code(), EBUSY);
  // The first holder is unaffected.
  InodeNumber ino = MakeFile(kRootInode, "still-works");
  WriteAt(ino, 0, "yes");
  EXPECT_TRUE(SameBytes(ReadAll(ino), "yes"));

  fs_.reset();
  auto now = Volume::Open(vol_, Volume::OpenOptions{});
  ASSERT_TRUE(now.ok()) << now.status().ToString();
  EXPECT_EQ(now->get()->superblock().data_size, kVolumeSize);
}

TEST_F(FilesystemTest, VolumeOpenRefusesIndexAndDataOfDifferentVolumes) {
  std::string a = dir_.path() + "/a", b = dir_.path() + "/b";
  auto sa = Volume::Create(a, SizedOptions(Volume::kMinimumSize));
  auto sb = Volume::Create(b, SizedOptions(Volume::kMinimumSize));
  ASSERT_TRUE(sa.ok());
  ASSERT_TRUE(sb.ok());
  ASSERT_NE(sa->uuid, sb->uuid);
  ASSERT_TRUE(Volume::Open(a, {}).ok());  // (closed again at once)

  const auto copy = std::filesystem::copy_options::overwrite_existing;
  std::filesystem::copy_file(Volume::ImagePath(a), dir_.path() + "/a-data.img");
  std::filesystem::copy_file(Volume::ImagePath(b), Volume::ImagePath(a), copy);
  {
    auto mixed = Volume::Open(a, {});
    ASSERT_FALSE(mixed.ok()) << "a volume opened with another volume's data area";
    EXPECT_EQ(mixed.status().code(), EUCLEAN) << mixed.status().ToString();
    EXPECT_NE(mixed.status().message().find("different volumes"), std::string::npos) << mixed.status().ToString();
  }
  // With its own data area back, a opens again: the refusal left no lock behind.
  std::filesystem::copy_file(dir_.path() + "/a-data.img", Volume::ImagePath(a), copy);
  EXPECT_TRUE(Volume::Open(a, {}).ok());
  EXPECT_TRUE(Volume::Open(b, {}).ok());

  // A data area with no superblock at all.
  int fd = open(Volume::ImagePath(a).c_str(), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  std::string zeros(kBlock, '\0');
  ASSERT_EQ(pwrite(fd, zeros.data(), zeros.size(), 0), static_cast<ssize_t>(zeros.size()));
  close(fd);
  EXPECT_FALSE(Volume::Open(a, {}).ok());

  // Not a volume at all.
  EXPECT_EQ(Volume::Open(dir_.path() + "/nothing", {}).status().code(), ENOENT);
  std::filesystem::create_directory(dir_.path() + "/empty");
  EXPECT_EQ(Volume::Open(dir_.path() + "/empty", {}).status().code(), EINVAL);
}

TEST_F(FilesystemTest, VolumeCreateRefusals) {
  EXPECT_TRUE(Volume::Exists(vol_));
  fs_.reset();
  auto again = Volume::Create(vol_, SizedOptions(kVolumeSize));
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), EEXIST);
  auto small = Volume::Create(dir_.path() + "/small", SizedOptions(Volume::kMinimumSize - kBlock));
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.status().code(), EINVAL);

  // --force replaces the volume with an empty one.
  OpenFs();
  MakeFile(kRootInode, "old");
  auto uuid = fs_->volume().superblock().uuid;
  EXPECT_EQ(Volume::Create(vol_, SizedOptions(kVolumeSize, /*force=*/true)).status().code(), EBUSY)
      << "a volume in use was replaced";
  fs_.reset();
  auto forced = Volume::Create(vol_, SizedOptions(kVolumeSize, /*force=*/true));
  ASSERT_TRUE(forced.ok()) << forced.status().ToString();
  EXPECT_NE(forced->uuid, uuid);
  OpenFs();
  EXPECT_EQ(LookupErr(kRootInode, "old"), ENOENT);
  EXPECT_EQ(FreeBlocks(), initial_free_);
}

}  // namespace
}  // namespace spillfs
