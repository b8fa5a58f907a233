// Dedup: content deduplication of flushed data, and the reference counts of
// the blobs it shares.
//
// What. A flush hashes every whole, aligned dedup unit (kDedupUnit: 256 KiB,
// one RAM-tier chunk) it writes (ContentHash128). A unit whose content the
// volume already stores as a blob is mapped to that blob instead of being
// written again (a SharedRef); the first copy of new content is written as
// a blob of its own, one extent whose blob_id is its physical offset. The
// index keeps each blob twice (keys.h): by hash (-> physical offset) and by
// physical offset (-> BlobRecord {hash, length, refs}); refs counts the
// extent records that name the blob, and the blob's space is freed with its
// last reference, in the batch that drops it.
//
// The direct path's clients hash their units themselves: a commit
// (Filesystem::DirectCommit) makes blobs of the whole units it is given with
// their hashes (NewBlobUnits, NewBlob), and the dedup control op
// (Filesystem::DirectDedup) maps units whose hash a blob holds by reference
// (FindBlobs, MapBlob), taking the block checksums of a blob recorded without
// them from its bytes (TakeChecksums).
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

#include "core/ram_tier.h"
#include "spillfs/common/status.h"
#include "spillfs/kvindex/index.h"
#include "spillfs/kvindex/records.h"
#include "store/block_store.h"

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

// A dedup hit: this file range will reference an existing blob.
struct SharedRef {
  uint64_t file_offset;
  uint64_t blob;  // physical offset
  std::string hash;
  const char* data;
};

class Dedup {
 public:
  // The block checksums of `length` bytes (none where the volume keeps none).
  using BlockSums = std::function<std::vector<uint32_t>(const char* data, uint64_t length)>;

  Dedup(const Index& index, BlockSums block_sums) : index_(index), block_sums_(std::move(block_sums)) {}

  // The dedup hash of one dedup unit, as the blob keys hold it.
  static std::string Hash(const char* unit);

  // --- planning a flush batch (no lock) ---
  // Hashes the segments (block checksums, and dedup hashes with `dedup`) on
  // several threads: one thread hashing a flush kept up with only ~2 GB/s.
  void HashSegments(std::vector<Segment>* segments, bool dedup) const;
  // Splits whole dedup units (the segments HashSegments gave a content hash)
  // whose content is already stored out of `segments` into `shared`, and tags
  // the other whole units as new blobs (within one call, only the first copy).
  void Deduplicate(std::vector<Segment>* segments, std::vector<SharedRef>* shared) const;

  // --- the direct path (Filesystem::DirectCommit, DirectDedup) ---
  // The blob that holds each of `hashes` (its physical offset and record,
  // whose hash and length agree), or nullopt; looked up together (a
  // multi-get by hash, then one by physical offset), on up to four threads
  // where there are thousands: a save's dedup request names every unit of a
  // checkpoint.
  std::vector<std::optional<std::pair<uint64_t, BlobRecord>>> FindBlobs(
      const std::vector<std::string_view>& hashes) const;
  // Of a commit's whole `units`, those that become new blobs (file offset ->
  // hash): the first of equal hashes, where no blob holds the hash yet.
  std::map<uint64_t, const std::string*> NewBlobUnits(const std::vector<DirectUnit>& units) const;
  // The record of a new blob of one dedup unit (no references yet).
  static BlobRecord NewBlob(const std::string& hash, std::vector<uint32_t> block_checksums) {
    return BlobRecord{hash, kDedupUnit, 0, std::move(block_checksums)};
  }
  // Gives `record` (of a blob recorded without block checksums) the
  // checksums of `unit`, the blob's bytes, where they hash to its hash;
  // false (record unchanged) where they do not.
  bool TakeChecksums(const char* unit, BlobRecord* record) const;
  // Maps the dedup unit at `file_offset` of `ino` to `blob` (with its
  // record's block checksums) in `batch`, one reference.
  static void MapBlob(InodeNumber ino, uint64_t file_offset, uint64_t blob, const BlobRecord& record,
                      Index::Batch* batch, std::map<uint64_t, int64_t>* blob_refs);

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
  // again); the others are read. A blob whose last reference went is deleted
  // and its whole range freed. `*blobs_changed` (where given) is set when the
  // batch changes any blob record (its keys or its reference count).
  Status ApplyBlobRefs(const std::map<uint64_t, int64_t>& blob_refs, const std::map<uint64_t, BlobRecord>& new_blobs,
                       const std::unordered_map<uint64_t, const BlobRecord*>& current, Index::Batch* batch,
                       std::vector<PhysicalExtent>* freed, bool* blobs_changed = nullptr) const;

 private:
  const Index& index_;
  const BlockSums block_sums_;
};

}  // namespace spillfs
