// fsck --scrub: every mapped block read back and checked against its
// checksum, in large batches.
#include "fsck_pass.h"

#include <fmt/format.h>

#include <algorithm>

#include "spillfs/common/block_checksum.h"
#include "spillfs/kvindex/keys.h"

namespace spillfs::fsck::internal {

void Pass::VerifyExtent(const ExtentInfo& e, const std::vector<uint32_t>& sums, const char* data) {
  uint64_t blocks = e.length / bs_;
  report_.bytes_scrubbed += e.length;
  report_.blocks_scrubbed += blocks;
  if (sums.size() != blocks) return;  // reported as kChecksumCount already (or checksums are off)
  uint64_t run_start = 0, run_blocks = 0;
  auto flush = [&] {
    if (run_blocks == 0) return;
    uint64_t file_offset = e.file_offset + run_start * bs_;
    uint64_t physical = e.physical + run_start * bs_;
    Add(ProblemKind::kChecksumMismatch, e.ino,
        fmt::format("{}: {} bytes at file offset {} do not match their checksums (physical {})", Who(e.ino),
                    run_blocks * bs_, file_offset, physical),
        file_offset, physical, run_blocks * bs_);
    run_blocks = 0;
  };
  for (uint64_t b = 0; b < blocks; ++b) {
    bool good = BlockChecksum(data + b * bs_, bs_) == sums[b];
    if (good) {
      flush();
    } else {
      if (run_blocks == 0) run_start = b;
      ++run_blocks;
    }
  }
  flush();
}

Status Pass::ScrubBatch(std::vector<std::pair<ExtentInfo, std::vector<uint32_t>>>* batch, AlignedBuffer* buffer) {
  if (batch->empty()) return Status::OK();
  uint64_t total = 0;
  for (const auto& [e, sums] : *batch) total += e.length;
  SPILLFS_RETURN_IF_ERROR(buffer->Resize(total));
  std::vector<IoSlice> slices;
  uint64_t at = 0;
  for (const auto& [e, sums] : *batch) {
    slices.push_back(IoSlice{e.physical, buffer->data() + at, e.length});
    at += e.length;
  }
  Status read = volume_.store().ReadSlices(slices);
  at = 0;
  for (size_t i = 0; i < batch->size(); ++i) {
    const auto& [e, sums] = (*batch)[i];
    if (!read.ok()) {
      // Find which extent failed.
      Status one = volume_.store().ReadAt(e.physical, buffer->data() + at, e.length);
      if (!one.ok()) {
        Add(ProblemKind::kReadError, e.ino,
            fmt::format("{}: cannot read {} bytes at file offset {} (physical {}): {}", Who(e.ino), e.length,
                        e.file_offset, e.physical, one.ToString()),
            e.file_offset, e.physical, e.length);
        at += e.length;
        continue;
      }
    }
    VerifyExtent(e, sums, buffer->data() + at);
    at += e.length;
  }
  batch->clear();
  return Status::OK();
}

Status Pass::Scrub() {
  uint64_t total = 0;
  for (const ExtentInfo& e : extents_) {
    if (e.sane && !e.unwritten()) total += e.length;
  }
  auto cursor = index_.NewCursor(Family::kExtent, "");
  std::vector<std::pair<ExtentInfo, std::vector<uint32_t>>> batch;
  uint64_t batch_bytes = 0;
  AlignedBuffer buffer;
  Progress("scrub", 0, total);
  for (cursor->Seek(""); cursor->Valid(); cursor->Next()) {
    if (cursor->key().size() != 16) continue;
    auto record = ExtentRecord::Decode(cursor->value());
    if (!record.ok() || record->unwritten()) continue;
    ExtentInfo e;
    e.ino = keys::DecodeIno(cursor->key());
    e.file_offset = keys::ExtentOffset(cursor->key());
    e.physical = record->physical;
    e.length = record->length;
    e.flags = record->flags;
    if (e.length == 0 || e.length % bs_ != 0 || e.physical % bs_ != 0 || e.physical < sb_.data_offset ||
        e.physical + e.length > sb_.data_size || e.physical + e.length < e.physical) {
      continue;  // reported already; nothing sane to read
    }
    // Large extents are read in pieces of at most one batch.
    const std::vector<uint32_t>& sums = record->block_checksums;
    bool sums_fit = sums.size() == e.length / bs_;
    for (uint64_t done = 0; done < e.length; done += kScrubBatchBytes) {
      ExtentInfo piece = e;
      piece.file_offset += done;
      piece.physical += done;
      piece.length = std::min(kScrubBatchBytes, e.length - done);
      std::vector<uint32_t> piece_sums;
      if (sums_fit) {
        piece_sums.assign(sums.begin() + static_cast<long>(done / bs_),
                          sums.begin() + static_cast<long>((done + piece.length) / bs_));
      }
      if (batch_bytes + piece.length > kScrubBatchBytes && !batch.empty()) {
        SPILLFS_RETURN_IF_ERROR(ScrubBatch(&batch, &buffer));
        batch_bytes = 0;
        Progress("scrub", report_.bytes_scrubbed, total);
      }
      batch_bytes += piece.length;
      batch.emplace_back(piece, std::move(piece_sums));
    }
  }
  SPILLFS_RETURN_IF_ERROR(cursor->status());
  SPILLFS_RETURN_IF_ERROR(ScrubBatch(&batch, &buffer));
  Progress("scrub", report_.bytes_scrubbed, total);
  return Status::OK();
}

}  // namespace spillfs::fsck::internal
