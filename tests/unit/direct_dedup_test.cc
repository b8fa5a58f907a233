// Unit tests of checkpoint dedup on the direct path (Filesystem::DirectDedup,
// DirectCommit's blobs, spillfs/cache/dedup.h): units the volume holds are mapped by
// reference with their blob's checksums and reference counts, take no space,
// and go with their last reference; a commit's run of whole units is one blob,
// and a run of units found in one blob is mapped as one extent.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "filesystem_fixture.h"
#include "spillfs/common/aligned_buffer.h"
#include "spillfs/common/block_checksum.h"
#include "spillfs/inspect/fsck.h"
#include "support/random_bytes.h"

namespace spillfs {
namespace {

using testing::RandomBytes;

// The dedup control op (DirectDedup), with a RAM tier whose flushes make
// the blobs: units the volume holds are mapped by reference with their
// blob's checksums and reference counts, in one batch; others are left to
// the caller.
class FilesystemDedupTest : public FilesystemTestBase {
 protected:
  uint64_t RamTier() const override { return 32 << 20; }
  void Tune(FilesystemOptions* options) const override {
    options->dedup_looked_up = [this] {
      if (between_lookup_and_commit_) between_lookup_and_commit_();
    };
  }
  // Run by DirectDedup after its look-ups, before its locks.
  std::function<void()> between_lookup_and_commit_;

  static std::string Hash(const std::string& data, size_t unit) {
    XXH128_hash_t h = ContentHash128(data.data() + unit * Filesystem::dedup_unit(), Filesystem::dedup_unit());
    return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
  }
  // physical offset -> blob record, of every blob.
  std::map<uint64_t, BlobRecord> Blobs() {
    std::map<uint64_t, BlobRecord> out;
    auto cursor = index().NewCursor(Family::kBlob, "p");
    for (cursor->Seek("p"); cursor->Valid(); cursor->Next()) {
      auto blob = BlobRecord::Decode(cursor->value());
      EXPECT_TRUE(blob.ok());
      if (!blob.ok()) continue;
      const uint64_t physical = coding::DecodeFixed64BE(cursor->key().data() + 1);
      if (blob->needs_content()) {  // a blob of several units: its hashes and checksums
        std::string content;
        EXPECT_TRUE(index().Get(Family::kBlob, keys::BlobContent(physical), &content).ok()) << physical;
        EXPECT_TRUE(blob->DecodeContent(content).ok()) << physical;
      }
      out.emplace(physical, *blob);
    }
    return out;
  }
  // A file `name` in the root holding `data`, flushed: its whole units are
  // blobs.
  InodeNumber WriteFlushed(const char* name, const std::string& data) {
    InodeNumber ino = MakeFile(kRootInode, name);
    WriteAt(ino, 0, data);
    FlushAll();
    return ino;
  }
  // The end of a test: unlinks `names` from the root; every blob goes with
  // its last reference, and every block is free again.
  void RemoveAll(std::initializer_list<const char*> names) {
    for (const char* name : names) ASSERT_TRUE(fs_->Unlink(kRootInode, name).ok()) << name;
    EXPECT_TRUE(Blobs().empty());
    EXPECT_EQ(FreeBlocks(), initial_free_);
  }
  // The blob unit the hash key of `hash` names, if any.
  std::optional<BlobUnitRef> HashKey(const std::string& hash) {
    std::string value;
    if (!index().Get(Family::kBlob, keys::BlobByHash(hash), &value).ok()) return std::nullopt;
    auto at = BlobUnitRef::Decode(value);
    EXPECT_TRUE(at.ok());
    return at.ok() ? std::optional<BlobUnitRef>(*at) : std::nullopt;
  }
  // Writes `data` (whole blocks) as the client of the direct path does:
  // reserved space written by the caller, then committed with the hashes of
  // all its whole units.
  void CommitDirect(InodeNumber ino, const std::string& data) {
    const uint64_t unit = Filesystem::dedup_unit();
    std::vector<uint32_t> sums;
    std::vector<PhysicalExtent> space = WriteReserved(data, &sums);
    ASSERT_FALSE(space.empty());
    std::vector<DirectUnit> units;
    for (uint64_t u = 0; u < data.size() / unit; ++u) units.push_back(DirectUnit{u * unit, Hash(data, u)});
    Status committed = fs_->DirectCommit(ino, 0, space, sums, data.size(), units);
    ASSERT_TRUE(committed.ok()) << committed.ToString();
  }
  // A new file `name` of `units` random units (from `seed`), committed as
  // CommitDirect does; its bytes.
  std::string CommitRandomUnits(const std::string& name, uint64_t units, uint64_t seed, InodeNumber* ino) {
    std::mt19937_64 rng(seed);
    std::string data = RandomBytes(rng, units * Filesystem::dedup_unit());
    *ino = MakeFile(kRootInode, name);
    CommitDirect(*ino, data);
    return data;
  }
  // Space reserved for `data` (whole blocks) and written with it, as the
  // client of the direct path writes; *sums gets its block checksums. Empty
  // where that failed (the failure reported).
  std::vector<PhysicalExtent> WriteReserved(const std::string& data, std::vector<uint32_t>* sums) {
    auto space = fs_->DirectReserve(data.size());
    EXPECT_TRUE(space.ok()) << space.status().ToString();
    AlignedBuffer aligned;  // the store is O_DIRECT
    if (!space.ok() || !aligned.Resize(data.size()).ok()) return {};
    std::memcpy(aligned.data(), data.data(), data.size());
    Status written = fs_->volume().store().Write(*space, aligned.data());
    EXPECT_TRUE(written.ok()) << written.ToString();
    if (!written.ok()) return {};
    for (uint64_t b = 0; b < data.size(); b += kBlock) sums->push_back(BlockChecksum(data.data() + b, kBlock));
    return *space;
  }
  // fsck of the closed volume finds nothing; the volume is opened again.
  void ExpectFsckClean() {
    fs_.reset();
    {
      auto volume = Volume::Open(vol_, Volume::OpenOptions{.read_only = true});
      ASSERT_TRUE(volume.ok()) << volume.status().ToString();
      fsck::Checker checker(**volume, fsck::Checker::Options{});
      auto report = checker.Run();
      ASSERT_TRUE(report.ok()) << report.status().ToString();
      for (const fsck::Problem& problem : report->problems) ADD_FAILURE() << "fsck: " << problem.message;
      EXPECT_TRUE(report->clean());
    }
    OpenFs();
  }
};

// A commit's run of whole units is one blob (one head, one content record,
// a hash key a unit); a dedup of units that lie one after another in it maps
// them as one extent with one reference, wherever the run starts; units in
// another order map as extents of their own; an overwrite of part of a file
// splits its extent, the blob keeps its whole range until its last
// reference goes.
TEST_F(FilesystemDedupTest, CommitOfARunIsOneBlobAndDedupMapsARunAsOneExtent) {
  const uint64_t unit = Filesystem::dedup_unit();
  std::mt19937_64 rng(80);
  InodeNumber a = 0;
  const std::string data = CommitRandomUnits("a", 8, 80, &a);
  auto blobs = Blobs();
  ASSERT_EQ(blobs.size(), 1u);
  const auto& [blob, record] = *blobs.begin();
  EXPECT_EQ(record.units(), 8u);
  EXPECT_EQ(record.length, 8 * unit);
  EXPECT_EQ(record.refs, 1u);
  EXPECT_EQ(record.block_checksums.size(), 8 * unit / kBlock);
  for (uint64_t u = 0; u < 8; ++u) {
    EXPECT_EQ(record.unit_hash(u), Hash(data, u)) << u;
    EXPECT_EQ(HashKey(Hash(data, u)), (BlobUnitRef{blob, u})) << u;
  }
  ASSERT_EQ(Extents(a).size(), 1u);
  const uint64_t free_before = FreeBlocks();

  std::vector<std::string> all;
  for (uint64_t u = 0; u < 8; ++u) all.push_back(Hash(data, u));
  InodeNumber b = MakeFile(kRootInode, "b");
  auto mapped = fs_->DirectDedup(b, 0, all);
  ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
  EXPECT_EQ(*mapped, std::vector<bool>(8, true));
  auto extents = Extents(b);
  ASSERT_EQ(extents.size(), 1u) << "a run of units of one blob: one extent";
  EXPECT_EQ(extents.begin()->second.physical, blob);
  EXPECT_EQ(extents.begin()->second.length, 8 * unit);
  EXPECT_EQ(extents.begin()->second.blob_id, blob);
  EXPECT_EQ(Blobs().at(blob).refs, 2u);
  EXPECT_TRUE(SameBytes(ReadAll(b), data));

  // Units 2..5 of the blob, from file offset 0: one extent into its middle.
  InodeNumber c = MakeFile(kRootInode, "c");
  mapped = fs_->DirectDedup(c, 0, {all[2], all[3], all[4], all[5]});
  ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
  extents = Extents(c);
  ASSERT_EQ(extents.size(), 1u);
  EXPECT_EQ(extents.begin()->second.physical, blob + 2 * unit);
  EXPECT_EQ(extents.begin()->second.length, 4 * unit);
  EXPECT_TRUE(SameBytes(ReadAll(c), data.substr(2 * unit, 4 * unit)));

  // Units in reverse order: not one after another in the blob, an extent each.
  InodeNumber d = MakeFile(kRootInode, "d");
  mapped = fs_->DirectDedup(d, 0, {all[7], all[6], all[5], all[4]});
  ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
  EXPECT_EQ(Extents(d).size(), 4u);
  std::string reversed;
  for (int u = 7; u >= 4; --u) reversed += data.substr(u * unit, unit);
  EXPECT_TRUE(SameBytes(ReadAll(d), reversed));
  EXPECT_EQ(Blobs().at(blob).refs, 1u + 1u + 1u + 4u);
  EXPECT_EQ(FreeBlocks(), free_before) << "mapping by reference takes no space";

  // An overwrite inside b splits its extent: one more reference.
  std::string b_data = data;
  const std::string patch = RandomBytes(rng, 3 * kBlock);
  b_data.replace(3 * unit + kBlock, patch.size(), patch);
  WriteAt(b, 3 * unit + kBlock, patch);
  FlushAll();
  EXPECT_TRUE(SameBytes(ReadAll(b), b_data));
  EXPECT_EQ(Blobs().at(blob).refs, 8u);
  for (InodeNumber ino : {a, b, c, d}) ExpectExtentMapSane(ino);
  ExpectSpaceAccountedFor();
  ExpectFsckClean();

  // The blob is freed, whole, with its last reference; its keys go with it.
  ASSERT_TRUE(fs_->Unlink(kRootInode, "a").ok());
  ASSERT_TRUE(fs_->Unlink(kRootInode, "b").ok());
  ASSERT_TRUE(fs_->Unlink(kRootInode, "d").ok());
  EXPECT_EQ(Blobs().at(blob).refs, 1u);
  EXPECT_TRUE(SameBytes(ReadAll(c), data.substr(2 * unit, 4 * unit)));
  ExpectSpaceAccountedFor();
  ASSERT_TRUE(fs_->Unlink(kRootInode, "c").ok());
  EXPECT_EQ(CountKeys(Family::kBlob), 0u) << "no head, content or hash key left";
  EXPECT_EQ(FreeBlocks(), initial_free_);
  ExpectFsckClean();
}

// A checkpoint saved again with one unit changed: the units before and
// after it are found (the first by its hash key, the rest by following the
// blob) and mapped as two extents; the changed one is left to the caller.
// A unit written through the mount whose content is a unit inside a blob
// shares that unit.
TEST_F(FilesystemDedupTest, SecondSaveMapsTheUnchangedRunsAround) {
  const uint64_t unit = Filesystem::dedup_unit();
  InodeNumber a = 0;
  const std::string data = CommitRandomUnits("a", 8, 81, &a);
  const uint64_t blob = Blobs().begin()->first;
  std::vector<std::string> hashes;
  for (uint64_t u = 0; u < 8; ++u) hashes.push_back(Hash(data, u));
  hashes[3] = std::string(16, 'c');  // changed
  InodeNumber b = MakeFile(kRootInode, "b");
  auto mapped = fs_->DirectDedup(b, 0, hashes);
  ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
  EXPECT_EQ(*mapped, (std::vector<bool>{true, true, true, false, true, true, true, true}));
  auto by_offset = [&](InodeNumber ino) {
    auto list = Extents(ino);
    return std::map<uint64_t, ExtentRecord>(list.begin(), list.end());
  };
  auto extents = by_offset(b);
  ASSERT_EQ(extents.size(), 2u);
  EXPECT_EQ(extents.at(0).physical, blob);
  EXPECT_EQ(extents.at(0).length, 3 * unit);
  EXPECT_EQ(extents.at(4 * unit).physical, blob + 4 * unit);
  EXPECT_EQ(extents.at(4 * unit).length, 4 * unit);
  EXPECT_EQ(Blobs().at(blob).refs, 3u);
  std::string want = data;
  std::memset(want.data() + 3 * unit, 0, unit);  // a hole until the caller writes it
  EXPECT_TRUE(SameBytes(ReadAll(b), want));

  // Through the mount: unit 5's content, flushed, shares unit 5 of the blob.
  InodeNumber m = MakeFile(kRootInode, "m");
  WriteAt(m, unit, data.substr(5 * unit, unit));
  FlushAll();
  extents = by_offset(m);
  ASSERT_EQ(extents.size(), 1u);
  EXPECT_EQ(extents.at(unit).physical, blob + 5 * unit);
  EXPECT_EQ(extents.at(unit).blob_id, blob);
  EXPECT_EQ(Blobs().at(blob).refs, 4u);
  EXPECT_TRUE(SameBytes(ReadAll(m).substr(unit), data.substr(5 * unit, unit)));
  ExpectSpaceAccountedFor();
  ExpectFsckClean();
  for (const char* name : {"a", "b", "m"}) ASSERT_TRUE(fs_->Unlink(kRootInode, name).ok()) << name;
  EXPECT_EQ(CountKeys(Family::kBlob), 0u);
  EXPECT_EQ(FreeBlocks(), initial_free_);
}

TEST_F(FilesystemDedupTest, DirectDedupMapsHeldUnitsByReference) {
  const uint64_t unit = Filesystem::dedup_unit();
  std::mt19937_64 rng(77);
  const std::string data = RandomBytes(rng, 4 * unit);
  WriteFlushed("a", data);
  auto blobs = Blobs();
  ASSERT_EQ(blobs.size(), 4u);
  for (const auto& [physical, blob] : blobs) {
    EXPECT_EQ(blob.refs, 1u);
    EXPECT_EQ(blob.block_checksums.size(), unit / kBlock) << "a flushed blob keeps its checksums";
  }
  const uint64_t free_before = FreeBlocks();

  // b: the four units, then one the volume does not hold.
  InodeNumber b = MakeFile(kRootInode, "b");
  std::vector<std::string> hashes = {Hash(data, 0), Hash(data, 1), Hash(data, 2), Hash(data, 3), std::string(16, 'u')};
  auto mapped = fs_->DirectDedup(b, 0, hashes);
  ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
  EXPECT_EQ(*mapped, (std::vector<bool>{true, true, true, true, false}));
  EXPECT_EQ(Size(b), 4 * unit);
  EXPECT_TRUE(SameBytes(ReadAll(b), data));
  EXPECT_EQ(FreeBlocks(), free_before) << "mapping by reference takes no space";
  for (const auto& [physical, blob] : Blobs()) EXPECT_EQ(blob.refs, 2u);
  ExpectExtentMapSane(b);
  ExpectSpaceAccountedFor();

  // A blob from before blobs kept their checksums: read once, checked
  // against its hash, and its record gets them.
  const uint64_t stripped = Blobs().begin()->first;
  {
    BlobRecord old = Blobs().begin()->second;
    old.block_checksums.clear();
    Index::Batch batch(index());
    batch.Put(Family::kBlob, keys::BlobByPhysical(stripped), old.Encode());
    ASSERT_TRUE(index().Commit(&batch).ok());
  }
  InodeNumber c = MakeFile(kRootInode, "c");
  // Cached data of the range is flushed first, never left to land on top.
  WriteAt(c, 0, RandomBytes(rng, 2 * unit + 100));
  mapped = fs_->DirectDedup(c, unit, {Hash(data, 0), Hash(data, 1), Hash(data, 2), Hash(data, 3)});
  ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
  EXPECT_EQ(*mapped, std::vector<bool>(4, true));
  EXPECT_EQ(Size(c), 5 * unit);
  auto back = ReadAll(c);
  EXPECT_TRUE(SameBytes(back.substr(unit), data));  // every block verified against the checksums mapped
  EXPECT_EQ(Blobs().at(stripped).block_checksums.size(), unit / kBlock);
  // data's four blobs, and the one c's own first unit became when flushed.
  auto now = Blobs();
  EXPECT_EQ(now.size(), 5u);
  for (const auto& [physical, blob] : blobs) EXPECT_EQ(now.at(physical).refs, 3u);
  ExpectExtentMapSane(c);
  ExpectSpaceAccountedFor();

  // Refused: a misaligned offset, a hash of the wrong size.
  EXPECT_EQ(fs_->DirectDedup(c, 4096, {Hash(data, 0)}).status().code(), EINVAL);
  EXPECT_EQ(fs_->DirectDedup(c, 0, {"short"}).status().code(), EINVAL);

  // The shared units go with their last reference.
  Reopen();
  EXPECT_TRUE(SameBytes(ReadAll(b), data));
  RemoveAll({"a", "b", "c"});
}

// The units form: units anywhere in the file, in one call (one flush, one
// batch); the same blob twice; bad input refused with the unit named and
// nothing mapped.
TEST_F(FilesystemDedupTest, DirectDedupOfScatteredUnitsInOneCall) {
  const uint64_t unit = Filesystem::dedup_unit();
  std::mt19937_64 rng(78);
  const std::string data = RandomBytes(rng, 4 * unit);
  WriteFlushed("a", data);
  std::map<std::string, uint64_t> blob_of;  // hash -> physical
  for (const auto& [physical, blob] : Blobs()) blob_of[blob.hash] = physical;
  ASSERT_EQ(blob_of.size(), 4u);
  const uint64_t free_before = FreeBlocks();
  auto refs = [&](size_t u) { return Blobs().at(blob_of.at(Hash(data, u))).refs; };

  InodeNumber b = MakeFile(kRootInode, "b");
  auto mapped = fs_->DirectDedup(b, std::vector<DirectUnit>{{0, Hash(data, 0)},
                                                            {3 * unit, Hash(data, 2)},
                                                            {5 * unit, std::string(16, 'u')},
                                                            {6 * unit, Hash(data, 3)},
                                                            {9 * unit, Hash(data, 3)}});
  ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
  EXPECT_EQ(*mapped, (std::vector<bool>{true, true, false, true, true}));
  EXPECT_EQ(Size(b), 10 * unit);
  const std::string zeros(unit, '\0');
  auto u = [&](size_t i) { return data.substr(i * unit, unit); };
  EXPECT_TRUE(SameBytes(ReadAll(b), u(0) + zeros + zeros + u(2) + zeros + zeros + u(3) + zeros + zeros + u(3)));
  EXPECT_EQ(refs(0), 2u);
  EXPECT_EQ(refs(1), 1u) << "not asked for";
  EXPECT_EQ(refs(2), 2u);
  EXPECT_EQ(refs(3), 3u) << "mapped twice into b";
  EXPECT_EQ(FreeBlocks(), free_before) << "mapping by reference takes no space";
  ExpectExtentMapSane(b);
  ExpectSpaceAccountedFor();

  // Refused, naming the unit; nothing mapped.
  InodeNumber c = MakeFile(kRootInode, "c");
  struct Bad {
    std::vector<DirectUnit> units;
    const char* says;
  };
  for (const Bad& bad : {
           Bad{{{2 * unit, Hash(data, 0)}, {unit, Hash(data, 1)}}, "unit 1 at 262144 comes after unit 0 at 524288"},
           Bad{{{unit, Hash(data, 0)}, {unit, Hash(data, 1)}}, "unit 1 at 262144 repeats unit 0 at 262144"},
           Bad{{{0, Hash(data, 0)}, {unit + 4096, Hash(data, 1)}}, "unit 1 at file offset 266240 is not at a multiple"},
           Bad{{{0, Hash(data, 0)}, {unit, "short"}}, "the hash of dedup unit 1 is not 16 bytes"},
       }) {
    auto refused = fs_->DirectDedup(c, bad.units);
    ASSERT_FALSE(refused.ok()) << bad.says;
    EXPECT_EQ(refused.status().code(), EINVAL) << refused.status().ToString();
    EXPECT_NE(refused.status().message().find(bad.says), std::string::npos) << refused.status().ToString();
  }
  EXPECT_EQ(Size(c), 0u);
  EXPECT_EQ(refs(0), 2u);
  EXPECT_EQ(refs(1), 1u);

  // Nothing held: nothing mapped (and no flush, no batch).
  auto none = fs_->DirectDedup(c, std::vector<DirectUnit>{{0, std::string(16, 'x')}, {unit, std::string(16, 'y')}});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, (std::vector<bool>{false, false}));
  EXPECT_EQ(Size(c), 0u);

  ASSERT_TRUE(fs_->Unlink(kRootInode, "b").ok());
  EXPECT_EQ(refs(3), 1u);
  RemoveAll({"a"});
}

// A commit of other files between DirectDedup's look-ups and its own commit:
// a blob it found gets another reference, or is gone. It counts from the
// references as they are now, and maps only what is still there.
TEST_F(FilesystemDedupTest, DirectDedupAfterOtherCommitsChangedItsBlobs) {
  const uint64_t unit = Filesystem::dedup_unit();
  std::mt19937_64 rng(78);
  const std::string data = RandomBytes(rng, 3 * unit);
  WriteAt(MakeFile(kRootInode, "a"), 0, data.substr(0, 2 * unit));
  WriteAt(MakeFile(kRootInode, "x"), 0, data.substr(2 * unit));  // unit 2's blob: x's alone
  FlushAll();
  ASSERT_EQ(Blobs().size(), 3u);
  auto blob_of = [&](size_t u) {
    for (const auto& [physical, blob] : Blobs()) {
      if (blob.hash == Hash(data, u)) return physical;
    }
    return uint64_t{0};
  };
  const uint64_t blob0 = blob_of(0), blob1 = blob_of(1);
  const InodeNumber d = MakeFile(kRootInode, "d");
  // Runs `change` once, in the first DirectDedup that reaches the seam.
  auto between = [&](std::function<void()> change) {
    auto once = std::make_shared<bool>(true);
    between_lookup_and_commit_ = [once, change] {
      if (*once) {
        *once = false;
        change();
      }
    };
  };

  // Only a reference count changed (another file mapped unit 0's blob).
  between([&] {
    auto more = fs_->DirectDedup(d, 0, {Hash(data, 0)});
    ASSERT_TRUE(more.ok()) << more.status().ToString();
    EXPECT_EQ(*more, std::vector<bool>{true});
  });
  const InodeNumber b = MakeFile(kRootInode, "b");
  auto mapped = fs_->DirectDedup(b, 0, {Hash(data, 0), Hash(data, 1)});
  ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
  EXPECT_EQ(*mapped, (std::vector<bool>{true, true}));
  EXPECT_EQ(Blobs().at(blob0).refs, 3u) << "a, d and b";
  EXPECT_EQ(Blobs().at(blob1).refs, 2u) << "a and b";

  // A blob went (x, its only reference, was removed).
  between([&] { ASSERT_TRUE(fs_->Unlink(kRootInode, "x").ok()); });
  const InodeNumber c = MakeFile(kRootInode, "c");
  mapped = fs_->DirectDedup(c, 0, {Hash(data, 0), Hash(data, 1), Hash(data, 2)});
  ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
  EXPECT_EQ(*mapped, (std::vector<bool>{true, true, false}));
  auto now = Blobs();
  EXPECT_EQ(now.size(), 2u);
  EXPECT_EQ(now.at(blob0).refs, 4u);
  EXPECT_EQ(now.at(blob1).refs, 3u);
  EXPECT_EQ(Size(c), 2 * unit);
  EXPECT_TRUE(SameBytes(ReadAll(c), data.substr(0, 2 * unit)));
  ExpectExtentMapSane(c);
  ExpectSpaceAccountedFor();
  between_lookup_and_commit_ = nullptr;
  RemoveAll({"a", "b", "c", "d"});
}

// A ranged commit: reserved space laid over several file ranges at once,
// a whole unit of one becoming a blob; ranges that break the rules refused.
TEST_F(FilesystemDedupTest, DirectCommitOverSeveralFileRanges) {
  const uint64_t unit = Filesystem::dedup_unit();
  std::mt19937_64 rng(79);
  const uint64_t length = 4096 + unit + 8192;
  const std::string bytes = RandomBytes(rng, length);
  std::vector<uint32_t> sums;
  const std::vector<PhysicalExtent> reserved = WriteReserved(bytes, &sums);
  ASSERT_FALSE(reserved.empty());
  InodeNumber f = MakeFile(kRootInode, "f");
  // Refusals first (the space stays reserved).
  struct Bad {
    Filesystem::FileRanges ranges;
    std::vector<DirectUnit> units;
    const char* says;
  };
  for (const Bad& bad : {
           Bad{{{0, 4096}, {2048, 2048 + unit + 8192}}, {}, "file range 1 [2048"},
           Bad{{{unit, unit + 4096}, {0, unit + 8192}}, {}, "range 1 starts at 0, before range 0 ends"},
           Bad{{{0, 4096}, {unit, 2 * unit}}, {}, "the file ranges hold"},
           Bad{{{0, 4096}, {unit, unit + 8192}, {2 * unit, 3 * unit}}, {{0, Hash(bytes, 0)}}, "unit at file offset 0"},
       }) {
    Status refused = fs_->DirectCommit(f, bad.ranges, reserved, sums, 3 * unit, bad.units);
    EXPECT_EQ(refused.code(), EINVAL) << refused.ToString();
    EXPECT_NE(refused.message().find(bad.says), std::string::npos) << refused.ToString();
  }
  // [0, 4 KiB), [unit, unit + 8 KiB), [2 units, 3 units): the last a whole unit.
  const std::string unit_bytes = bytes.substr(4096 + 8192);
  XXH128_hash_t h = ContentHash128(unit_bytes.data(), unit);
  const std::string hash(reinterpret_cast<const char*>(&h), sizeof(h));
  Status committed = fs_->DirectCommit(f, {{0, 4096}, {unit, unit + 8192}, {2 * unit, 3 * unit}}, reserved, sums,
                                       3 * unit - 100, {{2 * unit, hash}});
  ASSERT_TRUE(committed.ok()) << committed.ToString();
  std::string want(3 * unit - 100, '\0');
  want.replace(0, 4096, bytes.substr(0, 4096));
  want.replace(unit, 8192, bytes.substr(4096, 8192));
  want.replace(2 * unit, unit - 100, unit_bytes.substr(0, unit - 100));
  EXPECT_EQ(Size(f), 3 * unit - 100);
  EXPECT_TRUE(SameBytes(ReadAll(f), want));
  auto blobs = Blobs();
  ASSERT_EQ(blobs.size(), 1u);
  EXPECT_EQ(blobs.begin()->second.hash, hash);
  EXPECT_EQ(blobs.begin()->second.refs, 1u);
  ExpectExtentMapSane(f);
  ExpectSpaceAccountedFor();
  // The blob shares: a dedup of its hash maps it.
  InodeNumber g = MakeFile(kRootInode, "g");
  auto mapped = fs_->DirectDedup(g, std::vector<DirectUnit>{{unit, hash}});
  ASSERT_TRUE(mapped.ok());
  EXPECT_EQ(*mapped, std::vector<bool>{true});
  EXPECT_EQ(Blobs().begin()->second.refs, 2u);
  Reopen();
  EXPECT_TRUE(SameBytes(ReadAll(f), want));
  for (const char* name : {"f", "g"}) ASSERT_TRUE(fs_->Unlink(kRootInode, name).ok()) << name;
  EXPECT_EQ(FreeBlocks(), initial_free_);
}

}  // namespace
}  // namespace spillfs
