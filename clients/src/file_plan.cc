// Segments -> pieces (file_impl.h).
#include <algorithm>
#include <cerrno>
#include <numeric>
#include <string>

#include "error.h"
#include "file_impl.h"
#include "spillfs/common/rounding.h"

namespace spillfs::client {

int MakePlan(const spill_segment* segments, size_t n, bool for_write, uint64_t chunk_bytes, Plan* plan) {
  if (n > 0 && segments == nullptr) return Fail(EFAULT, "null segment array");
  plan->segs.clear();
  plan->segs.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const spill_segment& s = segments[i];
    if (s.length == 0) continue;
    if (s.ptr == nullptr) return Fail(EFAULT, "segment " + std::to_string(i) + " has a null pointer");
    if (s.file_offset + s.length < s.file_offset || s.file_offset + s.length > (1ull << 62)) {
      return Fail(EFBIG, "segment " + std::to_string(i) + " lies past the largest file offset");
    }
    if (s.device < -1)
      return Fail(EINVAL, "segment " + std::to_string(i) + " names device " + std::to_string(s.device));
    plan->segs.push_back(Seg{static_cast<char*>(s.ptr), s.length, s.file_offset, s.device});
  }
  auto& segs = plan->segs;
  std::stable_sort(segs.begin(), segs.end(), [](const Seg& a, const Seg& b) { return a.offset < b.offset; });
  plan->bytes = 0;
  plan->exact_end = 0;
  plan->max_end.resize(segs.size());
  plan->devices.clear();
  for (size_t i = 0; i < segs.size(); ++i) {
    if (for_write && i > 0 && segs[i].offset < plan->max_end[i - 1]) {
      return Fail(EINVAL, "segments overlap at file offset " + std::to_string(segs[i].offset));
    }
    plan->bytes += segs[i].length;
    plan->exact_end = std::max(plan->exact_end, segs[i].end());
    plan->max_end[i] = plan->exact_end;
    if (segs[i].device >= 0 &&
        std::find(plan->devices.begin(), plan->devices.end(), segs[i].device) == plan->devices.end()) {
      plan->devices.push_back(segs[i].device);
    }
  }

  // Runs of touched blocks (a block no segment touches is never in one),
  // cut at multiples of chunk_bytes so a whole dedup unit is never split.
  plan->pieces.clear();
  size_t i = 0;
  while (i < segs.size()) {
    uint64_t run_start = RoundDown(segs[i].offset, kBlock);
    uint64_t run_end = RoundUp(segs[i].end(), kBlock);
    size_t j = i + 1;
    while (j < segs.size() && RoundDown(segs[j].offset, kBlock) <= run_end) {
      run_end = std::max(run_end, RoundUp(segs[j].end(), kBlock));
      ++j;
    }
    for (uint64_t at = run_start; at < run_end;) {
      Piece p;
      p.start = at;
      p.end = std::min(run_end, RoundDown(at, chunk_bytes) + chunk_bytes);
      // Segments that may overlap: those from the first whose running max
      // end passes p.start, up to the first starting at or after p.end.
      p.first_seg = static_cast<size_t>(std::upper_bound(plan->max_end.begin() + static_cast<long>(i),
                                                         plan->max_end.begin() + static_cast<long>(j), p.start) -
                                        plan->max_end.begin());
      p.last_seg = static_cast<size_t>(std::lower_bound(segs.begin() + static_cast<long>(p.first_seg),
                                                        segs.begin() + static_cast<long>(j), p.end,
                                                        [](const Seg& s, uint64_t v) { return s.offset < v; }) -
                                       segs.begin());
      for (size_t k = p.first_seg; k < p.last_seg; ++k) {
        const Seg& s = segs[k];
        if (s.device < 0 && s.offset <= p.start && s.end() >= p.end &&
            reinterpret_cast<uintptr_t>(s.ptr + (p.start - s.offset)) % kBlock == 0) {
          p.direct = s.ptr + (p.start - s.offset);
          break;
        }
      }
      plan->pieces.push_back(p);
      at = p.end;
    }
    i = j;
  }
  return 0;
}

}  // namespace spillfs::client
