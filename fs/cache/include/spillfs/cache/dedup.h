// Dedup: content deduplication of flushed data, and the reference counts of
// the blobs it shares.
//
// What. A flush hashes every whole, aligned dedup unit (kDedupUnit: 256 KiB,
// one RAM-tier chunk) it writes (ContentHash128). A unit whose content the
// volume already stores as a blob is mapped to that blob instead of being
// written again (a SharedRef); the first copy of new content is written as
// a blob of its own, one extent whose blob_id is its physical offset. The
// index keeps each blob twice (keys.h): each unit's hash (-> the blob's
// physical offset and the unit within it, BlobUnitRef) and the blob by
// physical offset (-> BlobRecord {unit hashes, length, refs, checksums});
// refs counts the extent records that name the blob, and the blob's whole
// space is freed with its last reference, in the batch that drops it.
//
// The direct path's clients hash their units themselves: a commit
// (Filesystem::DirectCommit) makes a blob of each run of consecutive whole
// units it is given with their hashes (NewBlob), and the dedup control op
// (Filesystem::DirectDedup) maps units whose hash a blob holds by reference
// (FindBlobs, MapBlob), a run of units that lie one after another in one blob
// as one extent, taking the block checksums of a one-unit blob recorded
// without them from its bytes (TakeChecksums). Blobs of many units are what
// make a checkpoint's second save cheap: a tensor's unchanged units cost one
// extent record and one reference, not a record and a reference each.
//
// Why. Bytes written again (an unchanged tensor in the next checkpoint, a
// copied file) then cost neither an SSD write nor space. The 128-bit hash is
// trusted, not compared byte for byte (a client's hashes as far as the
// checksums are: the control file is root's). Only where the volume was made
// with dedup on and the mount does not turn it off (FilesystemOptions::dedup).
//
// Threading. Dedup holds no state of its own beyond its references: it reads
// the index without a lock. A hit found by Deduplicate may vanish before its
// batch commits (the blob's last other reference dropped meanwhile):
// CheckShared, under the commit lock, says so (EAGAIN) and the flush retries
// the batch without dedup. DirectDedup maps only the blobs still there under
// the commit lock: looked up again (FindBlobs) where a batch changed a blob
// record since its look-ups began (Filesystem::blob_epoch_, which
// ApplyBlobRefs' blobs_changed drives), else known as they are. The methods
// that write a batch (MapShared, ApplyBlobRefs) run under the commit lock
// (Filesystem::mu_), since the reference counts they read must not change
// before the batch commits.
// HashSegments and FindBlobs use up to four threads of their own.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "spillfs/cache/ram_tier.h"
#include "spillfs/common/status.h"
#include "spillfs/kvindex/index.h"
#include "spillfs/kvindex/records.h"
#include "spillfs/store/block_store.h"

namespace spillfs {

// Dedup works on whole, aligned units of this size (one RAM-tier chunk).
inline constexpr uint64_t kDedupUnit = RamTier::kChunkBytes;

// Contiguous file bytes in memory, to be written as one or more extents.
struct Segment {
  uint64_t file_offset;
  const char* data;
  uint64_t length;
  std::string blob_hash;  // non-empty: write as one dedup blob with this hash
  // Worked out ahead by HashSegments (empty: not yet): the checksum of each
  // block, and the dedup hash of a whole dedup unit.
  std::vector<uint32_t> block_sums;
  std::string content_hash;
};

// A whole dedup unit of a direct-path write, with the content hash the client
// took of the bytes it wrote (XXH3-128, 16 bytes laid out as Dedup::Hash's).
struct DirectUnit {
  uint64_t file_offset = 0;
  std::string hash;
};

// A dedup hit: this file range will reference an existing blob's unit.
struct SharedRef {
  uint64_t file_offset;
  BlobUnitRef at;
  std::string hash;
  const char* data;
};

// What Dedup::FindBlobs found: the blob unit holding each hash looked up (or
// nullopt), and the records of those blobs: their block checksums apart, as
// encoded (4 bytes big-endian a block; empty where the record keeps none), so
// that a run mapped into a file takes them as they are (MapBlob).
struct FoundBlobs {
  std::vector<std::optional<BlobUnitRef>> units;
  // By blob physical offset; a blob of several units without its block_checksums.
  std::unordered_map<uint64_t, BlobRecord> records;
  std::unordered_map<uint64_t, std::string> checksums;  // by blob physical offset
};

class Dedup {
 public:
  // The block checksums of `length` bytes (none where the volume keeps none).
  using BlockSums = std::function<std::vector<uint32_t>(const char* data, uint64_t length)>;

  Dedup(const Index& index, BlockSums block_sums) : index_(index), block_sums_(std::move(block_sums)) {}

  // The dedup hash of one dedup unit, as the blob keys hold it.
  static std::string Hash(const char* unit);
  // Whether `record` is a well-formed blob (a length of whole units, one hash
  // each) whose unit `unit` holds content of `hash`.
  static bool Holds(const BlobRecord& record, uint64_t unit, std::string_view hash);

  // --- blob records (records.h: one record, or a head and its content) ---
  // The blob at `physical`; a split one's content read too where `content`.
  Result<BlobRecord> LoadBlob(uint64_t physical, bool content) const;
  // Writes `record` into `batch`: a split one's head, and its content where
  // `content` (a new blob's; a reference count changes only the head).
  static void PutBlob(Index::Batch* batch, uint64_t physical, const BlobRecord& record, bool content);
  static void DeleteBlob(Index::Batch* batch, uint64_t physical, const BlobRecord& record);

  // --- planning a flush batch (no lock) ---
  // Hashes the segments (block checksums, and dedup hashes with `dedup`) on
  // several threads: one thread hashing a flush kept up with only ~2 GB/s.
  void HashSegments(std::vector<Segment>* segments, bool dedup) const;
  // Splits whole dedup units (the segments HashSegments gave a content hash)
  // whose content is already stored out of `segments` into `shared`, and tags
  // the other whole units as new blobs (within one call, only the first copy).
  void Deduplicate(std::vector<Segment>* segments, std::vector<SharedRef>* shared) const;

  // --- the direct path (Filesystem::DirectCommit, DirectDedup) ---
  // The blob unit that holds each of `hashes` (Holds), with the blobs'
  // records. follows[i]: unit i comes right after unit i - 1 in the file.
  // Units that start a run of the file are looked up first (multi-gets by
  // hash, then by physical offset of the distinct blobs found), and each run
  // followed along its blob as far as the blob's unit hashes agree; the units
  // no run reached are looked up after. A checkpoint saved again costs a
  // look-up a tensor, not a unit. On up to four threads where there are
  // thousands of keys.
  FoundBlobs FindBlobs(const std::vector<std::string_view>& hashes, const std::vector<bool>& follows) const;
  // Reads again the records of the blobs `found` names and keeps only the
  // units they still hold, with their reference counts as they are now.
  // REQUIRES: the commit lock, where the result must hold until a commit.
  void CheckFound(const std::vector<std::string_view>& hashes, FoundBlobs* found) const;
  // The record of a new blob of consecutive dedup units (no references yet):
  // `hashes`, 16 bytes a unit, and the units' block checksums.
  static BlobRecord NewBlob(std::string hashes, std::vector<uint32_t> block_checksums) {
    const uint64_t length = hashes.size() / BlobRecord::kHashBytes * kDedupUnit;
    return BlobRecord{std::move(hashes), length, 0, std::move(block_checksums)};
  }
  // Gives `record` (of a one-unit blob recorded without block checksums) the
  // checksums of `unit`, the blob's bytes, where they hash to its hash;
  // false (record unchanged) where they do not.
  bool TakeChecksums(const char* unit, BlobRecord* record) const;
  // Maps `units` dedup units of `ino` from `file_offset` to as many units of
  // the blob `record` from `first_unit`, with those units' block checksums
  // out of `checksums` (the whole blob's, encoded), in `batch`: one extent,
  // one reference.
  static void MapBlob(InodeNumber ino, uint64_t file_offset, BlobUnitRef first_unit, uint64_t units,
                      const BlobRecord& record, std::string_view checksums, Index::Batch* batch,
                      std::map<uint64_t, int64_t>* blob_refs);
  // `sums` encoded as extent and content records hold them.
  static std::string ChecksumBytes(const std::vector<uint32_t>& sums);

  // --- committing (under the commit lock) ---
  // EAGAIN ("dedup target vanished") when a blob `shared` names is gone or
  // holds other content now.
  Status CheckShared(const std::vector<SharedRef>& shared) const;
  // The BlobRecord (no references yet) of each new blob among `extents`
  // (blob_id set, planned from a segment with a blob_hash).
  static void NoteNewBlobs(const std::vector<std::pair<uint64_t, ExtentRecord>>& extents,
                           const std::vector<Segment>& segments, std::map<uint64_t, BlobRecord>* new_blobs);
  // Maps each shared unit of `ino` to its blob in `batch`, one reference each.
  void MapShared(InodeNumber ino, const std::vector<SharedRef>& shared, Index::Batch* batch,
                 std::map<uint64_t, int64_t>* blob_refs) const;
  // Applies reference deltas (blob physical offset -> delta) to the blob
  // records in `batch`; `new_blobs` are the records the batch writes anew
  // (blobs it first writes, counted from no references, and blobs whose
  // checksums DirectDedup took, from their references); `current` are
  // records the caller knows as they are now (DirectDedup's hits: not read
  // again); the others are read. A new blob's unit hashes are indexed where
  // no blob holds them yet. A blob whose last reference went is deleted
  // with the hash keys that name it, and its whole range freed. `*blobs_changed` (where given) is set when the
  // batch changes any blob record (its keys or its reference count).
  Status ApplyBlobRefs(const std::map<uint64_t, int64_t>& blob_refs, const std::map<uint64_t, BlobRecord>& new_blobs,
                       const std::unordered_map<uint64_t, const BlobRecord*>& current, Index::Batch* batch,
                       std::vector<PhysicalExtent>* freed, bool* blobs_changed = nullptr) const;

 private:
  // The blob unit the hash key of each of hashes[which[j]] names, into found->units.
  void LookUpUnits(const std::vector<std::string_view>& hashes, const std::vector<size_t>& which,
                   FoundBlobs* found) const;
  // The records (with content) of `blobs` into found->records; one that is
  // gone or malformed is dropped from it.
  void LoadRecords(std::vector<uint64_t> blobs, FoundBlobs* found) const;

  const Index& index_;
  const BlockSums block_sums_;
};

}  // namespace spillfs
