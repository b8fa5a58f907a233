// PlanSegments: where a flush batch's or a write's segments go on the SSD.
#include "spillfs/cache/segment_plan.h"

#include <algorithm>

namespace spillfs {

// Reserves space for all segments at once; one extent per run that is
// contiguous both in the file and on disk.
Result<SegmentPlan> PlanSegments(Allocator* allocator, const std::vector<Segment>& segments, uint64_t from_hold,
                                 uint64_t block_size, const Dedup::BlockSums& block_sums) {
  uint64_t total = 0;
  for (const Segment& s : segments) total += s.length;
  SegmentPlan plan;
  if (total == 0) return plan;
  SPILLFS_ASSIGN_OR_RETURN(plan.space, allocator->Reserve(total, from_hold));
  auto& extents = plan.extents;
  size_t piece = 0;
  uint64_t piece_used = 0;
  for (const Segment& segment : segments) {
    for (uint64_t done = 0; done < segment.length;) {
      const PhysicalExtent& target = plan.space[piece];
      uint64_t n = std::min(segment.length - done, target.length - piece_used);
      uint64_t physical = target.offset + piece_used;
      uint64_t file_offset = segment.file_offset + done;
      plan.slices.push_back(IoSlice{physical, const_cast<char*>(segment.data + done), n});
      std::vector<uint32_t> sums = segment.block_sums.empty()
                                       ? block_sums(segment.data + done, n)
                                       : std::vector<uint32_t>(segment.block_sums.begin() + done / block_size,
                                                               segment.block_sums.begin() + (done + n) / block_size);
      bool blob = !segment.blob_hash.empty() && n == segment.length;  // only unsplit units become blobs
      auto* last = extents.empty() ? nullptr : &extents.back();
      if (!blob && last && last->second.blob_id == 0 && last->first + last->second.length == file_offset &&
          last->second.physical + last->second.length == physical) {
        last->second.length += n;
        last->second.block_checksums.insert(last->second.block_checksums.end(), sums.begin(), sums.end());
      } else {
        ExtentRecord record;
        record.physical = physical;
        record.length = n;
        record.block_checksums = std::move(sums);
        if (blob) record.blob_id = physical;
        extents.emplace_back(file_offset, std::move(record));
      }
      done += n;
      piece_used += n;
      if (piece_used == target.length) {
        ++piece;
        piece_used = 0;
      }
    }
  }
  return plan;
}

}  // namespace spillfs
