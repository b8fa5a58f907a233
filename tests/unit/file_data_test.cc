// Unit tests of the POSIX core's data path: reads and writes at any
// alignment (core/file_data.cc), truncate, fallocate, hole punching,
// SEEK_DATA and SEEK_HOLE (core/file_space.cc), the errors of the data path,
// checksums catching a damaged block, and data surviving a reopen. Each runs
// with and without a RAM tier.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/falloc.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "filesystem_fixture.h"
#include "support/random_bytes.h"

namespace spillfs {
namespace {

using testing::RandomBytes;

INSTANTIATE_TEST_SUITE_P(Tiers, FilesystemDataTest, kTiers, TierName);

TEST_P(FilesystemDataTest, UnalignedWritesAcrossBlockBoundaries) {
  std::mt19937_64 rng(11);
  InodeNumber ino = MakeFile(kRootInode, "f");
  std::string model;
  const std::pair<uint64_t, size_t> writes[] = {
      {0, 1},      {4095, 2},   {4096, 4096},   {8191, 4098},     {12289, 1},   {1, 4094},  {20000, 12288},
      {4000, 200}, {100000, 1}, {65535, 65538}, {3 * 4096, 4096}, {50000, 100}, {99999, 3}, {0, 4096 * 5 + 7}};
  for (auto [offset, length] : writes) {
    std::string data = RandomBytes(rng, length);
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
      std::string data = RandomBytes(rng, length);
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
  std::string data = RandomBytes(rng, 16384);
  InodeNumber ino = MakeFileHolding("t", data);  // one write: one 4-block extent
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
  std::string data = RandomBytes(rng, 4096);
  InodeNumber ino = MakeFileHolding("t", data);
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
  std::string model = RandomBytes(rng, 65536);
  InodeNumber ino = MakeFileHolding("p", model);
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
    std::string bytes = RandomBytes(rng, length);
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
    std::string bytes = RandomBytes(rng, length);
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
  std::string model = RandomBytes(rng, 10000);
  InodeNumber ino = MakeFileHolding("fa", model);

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
  std::string data = RandomBytes(rng, 5000);
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
  WriteAt(ino, 0, RandomBytes(rng, 8192));
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

// ---- corruption ----

TEST_P(FilesystemDataTest, FlippedByteUnderAnExtentReadsAsEIO) {
  std::mt19937_64 rng(15);
  std::string data = RandomBytes(rng, 3 * kBlock);
  InodeNumber ino = MakeFileHolding("c", data);
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
  std::string fresh = RandomBytes(rng, kBlock);
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
    contents[name] = RandomBytes(rng, rng() % 300000);
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

}  // namespace
}  // namespace spillfs
