// Unit tests for kvindex/records.h: every record round-trips, every truncation
// of a valid encoding is refused, unknown versions are refused, and random or
// damaged bytes never crash a decoder.
#include "spillfs/kvindex/records.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "spillfs/kvindex/coding.h"
#include "support/random_bytes.h"

namespace spillfs {
namespace {

InodeRecord FullInode() {
  InodeRecord r;
  r.mode = S_IFREG | 04755;
  r.uid = 1000;
  r.gid = UINT32_MAX;
  r.nlink = 65000;
  r.size = (1ull << 62) + 12345;
  r.atime_ns = -1;  // before the epoch
  r.mtime_ns = INT64_MAX;
  r.ctime_ns = INT64_MIN;
  r.btime_ns = 1700000000123456789;
  r.generation = UINT64_MAX;
  r.flags = kInodeEphemeral;
  r.rdev = 0x0803;
  r.symlink_target = std::string("a/b\0c\xff", 6);
  r.allocated_bytes = 1ull << 40;
  r.parent = 77;
  return r;
}

ExtentRecord FullExtent(size_t sums) {
  ExtentRecord r;
  r.physical = (1ull << 20) + 4096 * 17;
  r.length = 4096 * sums;
  r.flags = kExtentUnwritten;
  r.blob_id = 0xfeedfacecafebeefull;
  for (size_t i = 0; i < sums; ++i) r.block_checksums.push_back(static_cast<uint32_t>(i * 2654435761u));
  if (sums > 0) r.block_checksums[0] = 0;
  if (sums > 1) r.block_checksums[1] = UINT32_MAX;
  return r;
}

Superblock FullSuperblock() {
  Superblock sb;
  sb.uuid = std::string("\x00\x11\x22\x33\x44\x55\x46\x77\x88\x99\xaa\xbb\xcc\xdd\xee\xff", 16);
  sb.block_size = 4096;
  sb.data_offset = 1 << 20;
  sb.data_size = 1ull << 40;
  sb.backing = BackingKind::kBlockDevice;
  sb.device_path = "/dev/disk/by-id/nvme-some-long-name-part1";
  sb.created_ns = 1700000000000000001;
  sb.checksums = false;
  sb.dedup = true;
  return sb;
}

// Every strict prefix of `encoded` must be refused with a corruption status.
template <typename T>
void ExpectEveryTruncationRefused(const std::string& encoded,
                                  const std::function<Result<T>(std::string_view)>& decode) {
  ASSERT_TRUE(decode(encoded).ok());
  for (size_t len = 0; len < encoded.size(); ++len) {
    // Copy into an exact-size buffer so a read past the end is caught by ASan.
    std::string cut = encoded.substr(0, len);
    auto result = decode(cut);
    EXPECT_FALSE(result.ok()) << "prefix of " << len << " of " << encoded.size() << " bytes decoded";
    if (!result.ok()) {
      EXPECT_NE(result.status().code(), 0);
      EXPECT_EQ(result.status().code(), EUCLEAN) << result.status().ToString();
    }
  }
}

// ---- round trips ----

TEST(RecordsTest, InodeRoundTrip) {
  for (const InodeRecord& r : {InodeRecord{}, FullInode()}) {
    auto decoded = InodeRecord::Decode(r.Encode());
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    EXPECT_EQ(*decoded, r);
  }
  InodeRecord link = FullInode();
  link.mode = S_IFLNK | 0777;
  link.symlink_target = std::string(4095, 'x');
  auto decoded = InodeRecord::Decode(link.Encode());
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->symlink_target.size(), 4095u);
  EXPECT_EQ(*decoded, link);
}

TEST(RecordsTest, InodeFieldsAreIndependent) {
  // Changing one field changes the encoding, and the decoder gives it back.
  InodeRecord base = FullInode();
  std::vector<std::function<void(InodeRecord*)>> changes = {[](InodeRecord* r) { r->mode ^= 1; },
                                                            [](InodeRecord* r) { r->uid ^= 1; },
                                                            [](InodeRecord* r) { r->gid ^= 1; },
                                                            [](InodeRecord* r) { r->nlink ^= 1; },
                                                            [](InodeRecord* r) { r->size ^= 1; },
                                                            [](InodeRecord* r) { r->atime_ns ^= 1; },
                                                            [](InodeRecord* r) { r->mtime_ns ^= 1; },
                                                            [](InodeRecord* r) { r->ctime_ns ^= 1; },
                                                            [](InodeRecord* r) { r->btime_ns ^= 1; },
                                                            [](InodeRecord* r) { r->generation ^= 1; },
                                                            [](InodeRecord* r) { r->flags ^= 1; },
                                                            [](InodeRecord* r) { r->rdev ^= 1; },
                                                            [](InodeRecord* r) { r->symlink_target += "z"; },
                                                            [](InodeRecord* r) { r->allocated_bytes ^= 1; },
                                                            [](InodeRecord* r) { r->parent ^= 1; }};
  for (size_t i = 0; i < changes.size(); ++i) {
    InodeRecord changed = base;
    changes[i](&changed);
    ASSERT_FALSE(changed == base) << i;
    EXPECT_NE(changed.Encode(), base.Encode()) << "field " << i;
    auto decoded = InodeRecord::Decode(changed.Encode());
    ASSERT_TRUE(decoded.ok());
    EXPECT_EQ(*decoded, changed) << "field " << i;
  }
}

TEST(RecordsTest, DirentRoundTrip) {
  for (const DirentRecord& r : {DirentRecord{}, DirentRecord{kRootInode, S_IFDIR}, DirentRecord{UINT64_MAX, S_IFLNK},
                                DirentRecord{123456789, S_IFSOCK}}) {
    auto decoded = DirentRecord::Decode(r.Encode());
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    EXPECT_EQ(*decoded, r);
  }
}

TEST(RecordsTest, ExtentRoundTrip) {
  for (size_t sums : {0u, 1u, 2u, 3u, 256u, 2048u}) {
    ExtentRecord r = FullExtent(sums);
    auto decoded = ExtentRecord::Decode(r.Encode());
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    EXPECT_EQ(*decoded, r);
    EXPECT_TRUE(decoded->unwritten());
  }
  ExtentRecord written;
  written.physical = 4096;
  written.length = 8192;
  written.block_checksums = {1, 2};
  auto decoded = ExtentRecord::Decode(written.Encode());
  ASSERT_TRUE(decoded.ok());
  EXPECT_FALSE(decoded->unwritten());
  EXPECT_EQ(*decoded, written);
}

// Blob records carry their block checksums when known; a record without
// them encodes exactly as before they were kept (older volumes decode as is).
TEST(RecordsTest, BlobRoundTripWithAndWithoutChecksums) {
  BlobRecord plain{std::string(16, 'h'), 262144, 3, {}};
  std::string old_encoding = std::string(1, '\x01') + std::string(1, '\x10') + std::string(16, 'h');
  coding::PutVarint64(&old_encoding, 262144);
  coding::PutVarint64(&old_encoding, 3);
  EXPECT_EQ(plain.Encode(), old_encoding);
  auto decoded = BlobRecord::Decode(old_encoding);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(*decoded, plain);

  BlobRecord with_sums = plain;
  for (uint32_t i = 0; i < 64; ++i) with_sums.block_checksums.push_back(0x9e3779b9u * (i + 1));
  std::string encoded = with_sums.Encode();
  decoded = BlobRecord::Decode(encoded);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(*decoded, with_sums);
  for (size_t n = old_encoding.size() + 1; n < encoded.size(); ++n) {
    EXPECT_FALSE(BlobRecord::Decode(encoded.substr(0, n)).ok()) << n;
  }
  EXPECT_FALSE(BlobRecord::Decode(encoded + "x").ok());
}

// A blob of several units is kept as a head (a few bytes: what a reference
// count change rewrites) and a content record (its unit hashes and block
// checksums); each refuses damage, and the content must match the head.
TEST(RecordsTest, BlobOfSeveralUnitsIsAHeadAndAContent) {
  BlobRecord blob;
  for (char c : {'a', 'b', 'c'}) blob.hash += std::string(16, c);
  blob.length = 3 * 262144;
  blob.refs = 5;
  for (uint32_t i = 0; i < 3 * 64; ++i) blob.block_checksums.push_back(0x85ebca6bu * (i + 1));
  ASSERT_TRUE(blob.split());
  EXPECT_EQ(blob.unit_hash(1), std::string(16, 'b'));
  const std::string head = blob.Encode();
  EXPECT_LT(head.size(), 16u) << "the head holds no hashes or checksums";
  auto decoded = BlobRecord::Decode(head);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_TRUE(decoded->needs_content());
  EXPECT_EQ(decoded->length, blob.length);
  EXPECT_EQ(decoded->refs, 5u);
  EXPECT_EQ(decoded->Encode(), head) << "a head decoded alone encodes as itself";
  const std::string content = blob.EncodeContent();
  ASSERT_TRUE(decoded->DecodeContent(content).ok());
  EXPECT_FALSE(decoded->needs_content());
  EXPECT_EQ(decoded->hash, blob.hash);
  EXPECT_EQ(decoded->block_checksums, blob.block_checksums);
  EXPECT_EQ(decoded->Encode(), head);

  for (size_t n = 0; n < head.size(); ++n) EXPECT_FALSE(BlobRecord::Decode(head.substr(0, n)).ok()) << n;
  EXPECT_FALSE(BlobRecord::Decode(head + "x").ok());
  for (size_t n = 0; n < content.size(); ++n) {
    auto fresh = BlobRecord::Decode(head);
    EXPECT_FALSE(fresh->DecodeContent(content.substr(0, n)).ok()) << n;
  }
  BlobRecord two = blob;  // a content of two units under a head of three
  two.hash.resize(32);
  EXPECT_FALSE(BlobRecord::Decode(head)->DecodeContent(two.EncodeContent()).ok());
  // A version 1 record holds one unit's hash only.
  std::string v1 = std::string(1, '\x01') + std::string(1, '\x30') + blob.hash;
  coding::PutVarint64(&v1, blob.length);
  coding::PutVarint64(&v1, 1);
  EXPECT_FALSE(BlobRecord::Decode(v1).ok());
}

// The hash key's value: the blob's offset alone for its first unit (as
// volumes before blobs of several units hold it), with the unit after it.
TEST(RecordsTest, BlobUnitRefEncodings) {
  const BlobUnitRef first{1 << 20, 0}, third{1 << 20, 2};
  EXPECT_EQ(first.Encode().size(), 8u);
  EXPECT_EQ(third.Encode().size(), 16u);
  EXPECT_EQ(*BlobUnitRef::Decode(first.Encode()), first);
  EXPECT_EQ(*BlobUnitRef::Decode(third.Encode()), third);
  EXPECT_FALSE(BlobUnitRef::Decode(third.Encode().substr(0, 12)).ok());
  EXPECT_FALSE(BlobUnitRef::Decode(first.Encode() + std::string(8, '\0')).ok()) << "unit 0 has one encoding";
}

TEST(RecordsTest, SuperblockRoundTrip) {
  Superblock image;  // defaults: image file, checksums and dedup on
  image.uuid = std::string(16, '\x5a');
  image.data_offset = 1 << 20;
  image.data_size = 64 << 20;
  for (const Superblock& sb : {image, FullSuperblock()}) {
    auto decoded = Superblock::Decode(sb.Encode());
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    EXPECT_EQ(*decoded, sb);

    std::string block = sb.EncodeBlock();
    ASSERT_EQ(block.size(), sb.block_size);
    EXPECT_EQ(coding::DecodeFixed32BE(block.data()), kSuperblockMagic);
    EXPECT_EQ(block.substr(0, 4), "SPIL");
    auto from_block = Superblock::DecodeBlock(block);
    ASSERT_TRUE(from_block.ok()) << from_block.status().ToString();
    EXPECT_EQ(*from_block, sb);
  }
}

TEST(RecordsTest, SuperblockBlockOfOtherSizes) {
  for (uint32_t block_size : {512u, 1024u, 65536u}) {
    Superblock sb = FullSuperblock();
    sb.block_size = block_size;
    sb.data_offset = block_size * 4ull;
    std::string block = sb.EncodeBlock();
    ASSERT_EQ(block.size(), block_size);
    auto decoded = Superblock::DecodeBlock(block);
    ASSERT_TRUE(decoded.ok()) << block_size << ": " << decoded.status().ToString();
    EXPECT_EQ(*decoded, sb);
  }
}

TEST(RecordsTest, UuidString) {
  Superblock sb = FullSuperblock();
  EXPECT_EQ(sb.UuidString(), "00112233-4455-4677-8899-aabbccddeeff");
}

// ---- truncation ----

TEST(RecordsTest, EveryTruncationOfAnInodeIsRefused) {
  ExpectEveryTruncationRefused<InodeRecord>(FullInode().Encode(), InodeRecord::Decode);
  ExpectEveryTruncationRefused<InodeRecord>(InodeRecord{}.Encode(), InodeRecord::Decode);
}

TEST(RecordsTest, EveryTruncationOfADirentIsRefused) {
  ExpectEveryTruncationRefused<DirentRecord>(DirentRecord{UINT64_MAX, S_IFDIR}.Encode(), DirentRecord::Decode);
  ExpectEveryTruncationRefused<DirentRecord>(DirentRecord{}.Encode(), DirentRecord::Decode);
}

// A read of a few blocks of a large extent decodes only their checksums, and
// gets the same record as slicing the fully decoded one.
TEST(RecordsTest, ExtentViewSlicesEqualTheDecodedRecordsSlices) {
  ExtentRecord r;
  r.physical = 1 << 20;
  r.length = 8 * 4096;
  r.flags = 0;
  r.blob_id = 77;
  for (uint32_t i = 0; i < 8; ++i) r.block_checksums.push_back(0x01020304u * (i + 1));
  const std::string bytes = r.Encode();
  auto view = ExtentView::Parse(bytes);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  EXPECT_EQ(view->physical, r.physical);
  EXPECT_EQ(view->length, r.length);
  EXPECT_EQ(view->blob_id, r.blob_id);
  EXPECT_EQ(view->checksum_count, 8u);
  ExtentRecord slice = view->Slice(3 * 4096, 2 * 4096, 4096);
  EXPECT_EQ(slice.physical, r.physical + 3 * 4096);
  EXPECT_EQ(slice.length, 2u * 4096);
  EXPECT_EQ(slice.blob_id, r.blob_id);
  EXPECT_EQ(slice.block_checksums, (std::vector<uint32_t>{r.block_checksums[3], r.block_checksums[4]}));
  ExtentRecord whole = view->Slice(0, r.length, 4096);
  EXPECT_EQ(whole, r);
  EXPECT_EQ(*ExtentRecord::Decode(bytes), r);

  r.block_checksums.clear();  // checksums off: a slice has none either
  auto bare = ExtentView::Parse(r.Encode());
  ASSERT_TRUE(bare.ok());
  EXPECT_TRUE(bare->Slice(4096, 4096, 4096).block_checksums.empty());
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    EXPECT_FALSE(ExtentView::Parse(std::string_view(bytes).substr(0, cut)).ok()) << "cut at " << cut;
  }
}

TEST(RecordsTest, EveryTruncationOfAnExtentIsRefused) {
  for (size_t sums : {0u, 1u, 5u, 64u}) {
    ExpectEveryTruncationRefused<ExtentRecord>(FullExtent(sums).Encode(), ExtentRecord::Decode);
  }
}

TEST(RecordsTest, EveryTruncationOfASuperblockIsRefused) {
  ExpectEveryTruncationRefused<Superblock>(FullSuperblock().Encode(), Superblock::Decode);
  Superblock sb = FullSuperblock();
  std::string block = sb.EncodeBlock();
  size_t used = 8 + sb.Encode().size();
  ASSERT_TRUE(Superblock::DecodeBlock(block.substr(0, used)).ok());
  for (size_t len = 0; len < used; ++len) {
    std::string cut = block.substr(0, len);
    auto result = Superblock::DecodeBlock(cut);
    EXPECT_FALSE(result.ok()) << "block cut to " << len;
    if (!result.ok()) {
      EXPECT_EQ(result.status().code(), EUCLEAN);
    }
  }
}

// ---- versions and invalid contents ----

TEST(RecordsTest, UnknownVersionIsRefused) {
  const std::vector<std::pair<std::string, std::function<Status(std::string_view)>>> cases = {
      {FullInode().Encode(), [](std::string_view b) { return InodeRecord::Decode(b).status(); }},
      {DirentRecord{5, S_IFREG}.Encode(), [](std::string_view b) { return DirentRecord::Decode(b).status(); }},
      {FullExtent(3).Encode(), [](std::string_view b) { return ExtentRecord::Decode(b).status(); }},
      {FullSuperblock().Encode(), [](std::string_view b) { return Superblock::Decode(b).status(); }},
  };
  for (const auto& [encoded, decode] : cases) {
    ASSERT_TRUE(decode(encoded).ok());
    ASSERT_EQ(static_cast<uint8_t>(encoded[0]), 1u);  // the version all current encoders write
    for (int version : {0, 2, 3, 0x7f, 0x80, 0xff}) {
      std::string changed = encoded;
      changed[0] = static_cast<char>(version);
      Status s = decode(changed);
      EXPECT_FALSE(s.ok()) << "version " << version;
      EXPECT_EQ(s.code(), EUCLEAN) << s.ToString();
    }
  }
}

TEST(RecordsTest, UnsupportedFormatVersionIsRefused) {
  Superblock sb = FullSuperblock();
  sb.format_version = kFormatVersion + 1;
  auto decoded = Superblock::Decode(sb.Encode());
  ASSERT_FALSE(decoded.ok());
  EXPECT_EQ(decoded.status().code(), EUCLEAN);
  EXPECT_FALSE(Superblock::DecodeBlock(sb.EncodeBlock()).ok());
}

TEST(RecordsTest, InconsistentSuperblocksAreRefused) {
  std::vector<std::function<void(Superblock*)>> damage = {
      [](Superblock* sb) { sb->uuid = std::string(15, 'u'); },
      [](Superblock* sb) { sb->uuid = std::string(17, 'u'); },
      [](Superblock* sb) { sb->uuid.clear(); },
      [](Superblock* sb) { sb->backing = static_cast<BackingKind>(0); },
      [](Superblock* sb) { sb->backing = static_cast<BackingKind>(3); },
      [](Superblock* sb) { sb->block_size = 0; },
      [](Superblock* sb) { sb->block_size = 256; },
      [](Superblock* sb) { sb->block_size = 4097; },
      [](Superblock* sb) { sb->data_offset = 4096 * 3 + 1; },
      [](Superblock* sb) { sb->data_size = sb->data_offset - 4096; },
  };
  for (size_t i = 0; i < damage.size(); ++i) {
    Superblock sb = FullSuperblock();
    damage[i](&sb);
    auto decoded = Superblock::Decode(sb.Encode());
    EXPECT_FALSE(decoded.ok()) << "damage " << i;
    if (!decoded.ok()) {
      EXPECT_EQ(decoded.status().code(), EUCLEAN);
    }
  }
}

TEST(RecordsTest, SuperblockBlockWithBadMagicOrLengthIsRefused) {
  std::string block = FullSuperblock().EncodeBlock();
  {
    std::string bad = block;
    bad[0] ^= 0x01;
    EXPECT_FALSE(Superblock::DecodeBlock(bad).ok());
  }
  {
    std::string zeros(4096, '\0');
    EXPECT_FALSE(Superblock::DecodeBlock(zeros).ok());
  }
  for (uint32_t length : {uint32_t{4096 - 7}, uint32_t{4096}, UINT32_MAX, uint32_t{0}, uint32_t{3}}) {
    std::string bad = block;
    std::string field;
    coding::PutFixed32BE(&field, length);
    bad.replace(4, 4, field);
    auto decoded = Superblock::DecodeBlock(bad);
    EXPECT_FALSE(decoded.ok()) << "length " << length;
  }
}

TEST(RecordsTest, FieldsWiderThanTheirTypeAreRefused) {
  // An inode whose mode does not fit in 32 bits.
  std::string inode;
  inode.push_back('\x01');
  coding::PutVarint64(&inode, uint64_t{1} << 32);
  std::string rest = InodeRecord{}.Encode().substr(2);  // the remaining default fields
  inode += rest;
  EXPECT_FALSE(InodeRecord::Decode(inode).ok());
  // The same bytes with a fitting mode decode.
  std::string fine;
  fine.push_back('\x01');
  coding::PutVarint64(&fine, S_IFREG | 0644);
  fine += rest;
  auto decoded = InodeRecord::Decode(fine);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->mode, static_cast<uint32_t>(S_IFREG | 0644));

  // A dirent whose type does not fit in 32 bits.
  std::string dirent;
  dirent.push_back('\x01');
  coding::PutVarint64(&dirent, 9);
  coding::PutVarint64(&dirent, uint64_t{1} << 33);
  EXPECT_FALSE(DirentRecord::Decode(dirent).ok());
}

TEST(RecordsTest, ExtentWithAbsurdChecksumCountIsRefused) {
  for (uint64_t count :
       {uint64_t{1} << 62, (uint64_t{1} << 62) + 1, UINT64_MAX / 4 + 1, UINT64_MAX, uint64_t{1000}, uint64_t{3}}) {
    std::string bytes;
    bytes.push_back('\x01');
    coding::PutVarint64(&bytes, 4096);  // physical
    coding::PutVarint64(&bytes, 8192);  // length
    coding::PutVarint64(&bytes, 0);     // flags
    coding::PutVarint64(&bytes, 0);     // blob
    coding::PutVarint64(&bytes, count);
    bytes += std::string(8, '\x01');  // two checksums' worth
    auto decoded = ExtentRecord::Decode(bytes);
    EXPECT_FALSE(decoded.ok()) << "count " << count;
  }
}

// ---- garbage ----

TEST(RecordsTest, RandomGarbageNeverCrashes) {
  std::mt19937_64 rng(1234567);
  int decoded_ok = 0;
  for (int i = 0; i < 50000; ++i) {
    std::string bytes = testing::RandomGarbage(rng, 80);
    // Half the inputs carry the current version byte so decoding gets past it.
    if (!bytes.empty() && (i & 1)) bytes[0] = '\x01';
    const bool good_version = !bytes.empty() && bytes[0] == '\x01';

    auto inode = InodeRecord::Decode(bytes);
    auto dirent = DirentRecord::Decode(bytes);
    auto extent = ExtentRecord::Decode(bytes);
    auto sb = Superblock::Decode(bytes);
    auto block = Superblock::DecodeBlock(bytes);
    if (!good_version) {
      EXPECT_FALSE(inode.ok() || dirent.ok() || extent.ok() || sb.ok());
    }
    // Whatever decodes must survive its own round trip.
    if (inode.ok()) {
      ++decoded_ok;
      auto again = InodeRecord::Decode(inode->Encode());
      ASSERT_TRUE(again.ok());
      EXPECT_EQ(*again, *inode);
    }
    if (dirent.ok()) {
      ++decoded_ok;
      auto again = DirentRecord::Decode(dirent->Encode());
      ASSERT_TRUE(again.ok());
      EXPECT_EQ(*again, *dirent);
    }
    if (extent.ok()) {
      ++decoded_ok;
      EXPECT_LE(extent->block_checksums.size() * 4, bytes.size());
      auto again = ExtentRecord::Decode(extent->Encode());
      ASSERT_TRUE(again.ok());
      EXPECT_EQ(*again, *extent);
    }
    if (sb.ok()) {
      auto again = Superblock::Decode(sb->Encode());
      ASSERT_TRUE(again.ok());
      EXPECT_EQ(*again, *sb);
    }
    (void)block;
  }
  EXPECT_GT(decoded_ok, 0);  // the inputs did reach past the version byte
}

TEST(RecordsTest, DamagedEncodingsNeverCrash) {
  std::mt19937_64 rng(99);
  const std::string originals[] = {FullInode().Encode(), DirentRecord{42, S_IFDIR}.Encode(), FullExtent(8).Encode(),
                                   FullSuperblock().Encode(), FullSuperblock().EncodeBlock()};
  int refused = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string bytes = originals[i % 5];
    int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) bytes[rng() % bytes.size()] ^= static_cast<char>(1 + rng() % 255);
    if (rng() % 3 == 0) bytes.resize(rng() % (bytes.size() + 1));
    refused += !InodeRecord::Decode(bytes).ok();
    refused += !DirentRecord::Decode(bytes).ok();
    refused += !ExtentRecord::Decode(bytes).ok();
    refused += !Superblock::Decode(bytes).ok();
    refused += !Superblock::DecodeBlock(bytes).ok();
  }
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace spillfs
