// SegmentPlan: where segments of file data go on the SSD, planned in one
// step: the space reserved for all of them at once, the I/O slices that write
// them, and the extents (with their blocks' checksums) that a commit maps.
// Used by the RAM tier's flusher for each batch and by the core's
// write-through path.
//
// Thread safety: PlanSegments takes no lock but the allocator's own.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "spillfs/cache/dedup.h"
#include "spillfs/common/status.h"
#include "spillfs/kvindex/records.h"
#include "spillfs/store/allocator.h"
#include "spillfs/store/block_store.h"

namespace spillfs {

struct SegmentPlan {
  std::vector<PhysicalExtent> space;                       // reserved; the caller unreserves it on failure
  std::vector<std::pair<uint64_t, ExtentRecord>> extents;  // file offset -> extent, to map
  std::vector<IoSlice> slices;                             // the SSD writes
};

// Reserves space for all `segments` at once (`from_hold` of it promised
// before: Allocator::Reserve) and lays them out, one extent per run that is
// contiguous both in the file and on disk. A segment's block checksums are
// its own where HashSegments worked them out, else `block_sums` of its bytes.
// A segment with a blob hash becomes a dedup blob only when it lands whole in
// one piece of the space. ENOSPC when the space is not there.
Result<SegmentPlan> PlanSegments(Allocator* allocator, const std::vector<Segment>& segments, uint64_t from_hold,
                                 uint64_t block_size, const Dedup::BlockSums& block_sums);

}  // namespace spillfs
