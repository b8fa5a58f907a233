// The fixture of the unit tests that drive the POSIX core (spillfs/core/filesystem.h)
// directly, no FUSE: a fresh 64 MiB volume in a temporary directory, opened
// as a Filesystem, and the helpers those tests share. The tests are filed by
// concern: file_data_test.cc, namespace_ops_test.cc, ram_tier_test.cc,
// read_ahead_test.cc, space_accounting_test.cc, volume_test.cc.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "spillfs/common/rounding.h"
#include "spillfs/core/filesystem.h"
#include "spillfs/kvindex/coding.h"
#include "spillfs/kvindex/keys.h"
#include "spillfs/store/volume.h"
#include "support/read_bytes.h"
#include "support/temp_dir.h"

namespace spillfs {

inline constexpr uint64_t kVolumeSize = 64ull << 20;
inline constexpr uint64_t kBlock = Volume::kBlockSize;

// Writes `tag` into the first 8 bytes of every block of `data`, so that no
// two blocks written with different tags are equal (dedup cannot share them).
inline void StampBlocks(std::string* data, uint64_t tag) {
  for (uint64_t at = 0; at + 8 <= data->size(); at += 4096) {
    uint64_t stamp = tag * 1000003 + at;
    std::memcpy(data->data() + at, &stamp, 8);
  }
}

// Compares file contents, reporting sizes and the first differing offset
// instead of printing megabytes of bytes.
inline ::testing::AssertionResult SameBytes(const std::string& got, const std::string& want) {
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
    dir_ = std::make_unique<testing::TempDir>();
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
  static inline std::unique_ptr<testing::TempDir> dir_;
};
inline ::testing::Environment* const kTemplateVolume = ::testing::AddGlobalTestEnvironment(new TemplateVolume);

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
  // Renames FROM_DIR/FROM to TO_DIR/TO; INO is then found under the new
  // name only.
  void ExpectRenamed(InodeNumber from_dir, std::string_view from, InodeNumber to_dir, std::string_view to,
                     InodeNumber ino) {
    ASSERT_TRUE(fs_->Rename(from_dir, from, to_dir, to, 0).ok());
    EXPECT_EQ(LookupErr(from_dir, from), ENOENT);
    EXPECT_EQ(LookupIno(to_dir, to), ino);
  }

  void WriteAt(InodeNumber ino, uint64_t offset, const std::string& data) {
    auto n = fs_->Write(ino, offset, data.data(), data.size());
    ASSERT_TRUE(n.ok()) << "write " << offset << "+" << data.size() << ": " << n.status().ToString();
    ASSERT_EQ(*n, data.size());
  }
  // A new regular file in the root directory holding DATA.
  InodeNumber MakeFileHolding(std::string_view name, const std::string& data) {
    InodeNumber ino = MakeFile(kRootInode, name);
    WriteAt(ino, 0, data);
    return ino;
  }
  Result<std::string> ReadAt(InodeNumber ino, uint64_t offset, size_t size) {
    return testing::ReadBytes(*fs_, ino, offset, size);
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
  // Every block of the data area is either free (exactly once) or mapped (or
  // in a dedup blob: a blob keeps its whole range while any extent names
  // part of it); a block mapped by several extents must belong to a blob.
  void ExpectSpaceAccountedFor() {
    FlushAll();
    const uint64_t blocks = (kVolumeSize - Volume::kDataOffset) / kBlock;
    std::vector<int> mapped(blocks, 0), unshared(blocks, 0), free(blocks, 0), in_blob(blocks, 0);
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
    auto blob_cursor = index().NewCursor(Family::kBlob, "p");
    for (blob_cursor->Seek("p"); blob_cursor->Valid(); blob_cursor->Next()) {
      auto blob = BlobRecord::Decode(blob_cursor->value());
      ASSERT_TRUE(blob.ok());
      const uint64_t physical = keys::DecodeIno(blob_cursor->key().substr(1));
      for (uint64_t b = block_of(physical); b < block_of(physical + blob->length); ++b) in_blob[b] = 1;
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
      bool ok = free[b] + (mapped[b] > 0 || in_blob[b] ? 1 : 0) == 1 && (mapped[b] <= 1 || unshared[b] == 0);
      if (!ok) {
        ADD_FAILURE() << "block at " << physical << ": free " << free[b] << " times, mapped " << mapped[b] << " times ("
                      << unshared[b] << " not by a dedup blob)";
        ++reported;
      }
    }
  }

  testing::TempDir dir_{"spillfs-fs-test"};
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
inline const auto kTiers = ::testing::Values(uint64_t{0}, uint64_t{32} << 20);
inline std::string TierName(const ::testing::TestParamInfo<uint64_t>& info) {
  return info.param == 0 ? "WriteThrough" : "RamTier";
}

// Each file with TEST_P(FilesystemDataTest, ...) instantiates it for itself:
// INSTANTIATE_TEST_SUITE_P(Tiers, FilesystemDataTest, kTiers, TierName).
class FilesystemDataTest : public FilesystemTestBase, public ::testing::WithParamInterface<uint64_t> {
 protected:
  uint64_t RamTier() const override { return GetParam(); }
};

}  // namespace spillfs
