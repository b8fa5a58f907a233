// The consistency checker (see fsck.h for the invariants it checks).
//
// One Pass reads the whole index into a compact model and checks it,
// collecting problems (fsck_pass.cc). Repair edits that model, writes one
// index batch that brings the index in line with it (fsck_repair.cc), and a
// second Pass verifies the result.
#include "spillfs/inspect/fsck.h"

#include <set>
#include <tuple>

#include "fsck_pass.h"

namespace spillfs::fsck {
namespace {

using internal::Pass;

// Problems a repair may fix; the others stay unrepaired without a recheck.
bool Repairable(ProblemKind kind) {
  switch (kind) {
    case ProblemKind::kNextIno:
    case ProblemKind::kDataPastEof:
    case ProblemKind::kStrayExtent:
    case ProblemKind::kDoubleUse:
    case ProblemKind::kFreeOverlap:
    case ProblemKind::kLeak:
    case ProblemKind::kDanglingDirent:
    case ProblemKind::kDirentType:
    case ProblemKind::kNlink:
    case ProblemKind::kParent:
    case ProblemKind::kUnreachable:
    case ProblemKind::kAllocatedBytes:
    case ProblemKind::kOrphan:
    case ProblemKind::kUnlinkedInode:
    case ProblemKind::kStaleOrphan:
    case ProblemKind::kStrayXattr:
    case ProblemKind::kBlob:
      return true;
    default:
      return false;
  }
}

using ProblemKey = std::tuple<int, InodeNumber, uint64_t, uint64_t>;

ProblemKey KeyOf(const Problem& p) {
  return {static_cast<int>(p.kind), p.ino, p.file_offset.value_or(UINT64_MAX), p.physical.value_or(UINT64_MAX)};
}

}  // namespace

const char* ProblemKindName(ProblemKind kind) {
  switch (kind) {
    case ProblemKind::kSuperblock:
      return "superblock";
    case ProblemKind::kBadRecord:
      return "bad-record";
    case ProblemKind::kNextIno:
      return "next-ino";
    case ProblemKind::kExtentRange:
      return "extent-range";
    case ProblemKind::kExtentAlignment:
      return "extent-alignment";
    case ProblemKind::kChecksumCount:
      return "checksum-count";
    case ProblemKind::kExtentOverlap:
      return "extent-overlap";
    case ProblemKind::kDataPastEof:
      return "data-past-eof";
    case ProblemKind::kStrayExtent:
      return "stray-extent";
    case ProblemKind::kDoubleUse:
      return "double-use";
    case ProblemKind::kFreeOverlap:
      return "free-list";
    case ProblemKind::kLeak:
      return "leak";
    case ProblemKind::kDanglingDirent:
      return "dangling-dirent";
    case ProblemKind::kDirentType:
      return "dirent-type";
    case ProblemKind::kDirectoryLinks:
      return "directory-links";
    case ProblemKind::kNlink:
      return "nlink";
    case ProblemKind::kParent:
      return "parent";
    case ProblemKind::kUnreachable:
      return "unreachable";
    case ProblemKind::kAllocatedBytes:
      return "allocated-bytes";
    case ProblemKind::kOrphan:
      return "orphan";
    case ProblemKind::kUnlinkedInode:
      return "unlinked-inode";
    case ProblemKind::kStaleOrphan:
      return "stale-orphan";
    case ProblemKind::kStrayXattr:
      return "stray-xattr";
    case ProblemKind::kBlob:
      return "blob";
    case ProblemKind::kChecksumMismatch:
      return "checksum-mismatch";
    case ProblemKind::kReadError:
      return "read-error";
  }
  return "unknown";
}

Checker::Checker(Volume& volume, Options options) : volume_(volume), options_(std::move(options)) {}

Result<Report> Checker::Run() {
  Pass first(volume_, options_, options_.scrub);
  SPILLFS_RETURN_IF_ERROR(first.Run());
  Report report = std::move(first.report_);
  report.repair = options_.repair;
  if (!options_.repair || report.problems_found == 0) return report;

  // The repair edits the first pass's model; a second pass verifies it.
  if (options_.progress) options_.progress("repair", 0, 0);
  Status repaired = internal::Repair(first);
  if (!repaired.ok()) return repaired.WithContext("repair");
  Checker::Options verify_options;
  verify_options.max_problems_per_kind = options_.max_problems_per_kind;
  verify_options.progress = options_.progress;
  Pass verify(volume_, verify_options, /*scrub=*/false);
  SPILLFS_RETURN_IF_ERROR(verify.Run());
  const Report& after = verify.report_;

  std::set<ProblemKey> left;
  for (const Problem& p : after.problems) left.insert(KeyOf(p));
  std::set<ProblemKey> before;
  for (Problem& p : report.problems) {
    before.insert(KeyOf(p));
    auto count = after.problem_counts.find(ProblemKindName(p.kind));
    uint64_t remaining = count == after.problem_counts.end() ? 0 : count->second;
    // Only a kind whose list was not cut short can be matched one by one.
    p.repaired = Repairable(p.kind) && left.count(KeyOf(p)) == 0 && remaining < options_.max_problems_per_kind;
  }
  for (const Problem& p : after.problems) {
    if (before.count(KeyOf(p)) != 0) continue;
    Problem added = p;
    added.message = "after repair: " + added.message;
    report.problems.push_back(std::move(added));
  }
  // The verifying pass does not scrub: bad blocks found by the first remain.
  uint64_t scrub_problems = 0;
  for (ProblemKind kind : {ProblemKind::kChecksumMismatch, ProblemKind::kReadError}) {
    auto count = report.problem_counts.find(ProblemKindName(kind));
    if (count != report.problem_counts.end()) scrub_problems += count->second;
  }
  report.problems_remaining = after.problems_found + scrub_problems;
  return report;
}

}  // namespace spillfs::fsck
