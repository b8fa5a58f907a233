// Checker: the consistency check (and safe repair) of an unmounted volume.
//
// It walks every family of the index and checks the invariants the
// filesystem keeps:
//  - every extent is block aligned, lies inside the data area, carries one
//    checksum per block (none when unwritten or checksums are off), and the
//    extents of one file do not overlap; written data never lies past EOF;
//  - the free list and the mapped extents partition [data_offset, data_size)
//    exactly: a byte in neither is a leak, a byte in both (or mapped twice,
//    unless both mappings share one nonzero dedup blob) is a double use;
//  - every dirent names a live inode of its type in a live directory; nlink
//    is the number of dirents (directories: 2 + subdirectories); every inode
//    but the root is reachable from the root; a directory's parent field
//    names the directory holding it; allocated_bytes is the sum of the
//    inode's extent lengths;
//  - no orphan is left on an unmounted volume, no inode has nlink 0 without
//    an orphan record, no extent or xattr belongs to a missing inode;
//  - meta next_ino is above every inode number; both superblock copies agree.
// With Options::scrub it also reads every written extent and verifies its
// block checksums, naming the file path and offset of each bad block.
//
// Repair (a volume opened read-write) fixes what is safe: leaked or doubly
// used free space (the free list is rebuilt as the complement of the mapped
// extents), dangling dirents and wrong dirent types, wrong nlink,
// allocated_bytes and parent fields, orphans and unlinked inodes (reclaimed),
// extents and xattrs of missing inodes, written extents past EOF, a low
// next_ino, and inodes with no name (linked into /lost+found). It then checks
// again; what the second pass still finds is reported as unrepaired.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "spillfs/common/status.h"
#include "spillfs/kvindex/records.h"
#include "spillfs/store/volume.h"

namespace spillfs::fsck {

enum class ProblemKind {
  kSuperblock,        // superblock copies differ or the geometry is wrong
  kBadRecord,         // a key or value that does not decode
  kNextIno,           // meta next_ino missing or not above every inode
  kExtentRange,       // extent outside the data area
  kExtentAlignment,   // extent not block aligned or empty
  kChecksumCount,     // checksum count does not match the extent length
  kExtentOverlap,     // two extents of one file cover the same file offset
  kDataPastEof,       // written extent beyond the end of the file
  kStrayExtent,       // extent of a missing inode or of a non-regular file
  kDoubleUse,         // physical space mapped twice, or both mapped and free
  kFreeOverlap,       // free-list records overlap, are misaligned or lie outside the area
  kLeak,              // physical space neither free nor mapped
  kDanglingDirent,    // dirent to a missing inode or the root, or in a missing directory
  kDirentType,        // dirent type differs from the inode's type
  kDirectoryLinks,    // a directory with more than one name
  kNlink,             // nlink differs from the links counted
  kParent,            // directory parent field is wrong
  kUnreachable,       // inode not reachable from the root
  kAllocatedBytes,    // allocated_bytes differs from the sum of extent lengths
  kOrphan,            // orphan left on an unmounted volume
  kUnlinkedInode,     // nlink 0 and no orphan record
  kStaleOrphan,       // orphan record of a missing or still linked inode
  kStrayXattr,        // xattr of a missing inode
  kBlob,              // dedup blob: refcount wrong, record missing or inconsistent, extent outside it
  kChecksumMismatch,  // scrub: block content differs from its checksum
  kReadError,         // scrub: the data area could not be read
};

// Short stable name, as printed and in JSON ("leak", "double-use", ...).
const char* ProblemKindName(ProblemKind kind);

struct Problem {
  ProblemKind kind = ProblemKind::kBadRecord;
  std::string message;
  InodeNumber ino = 0;                  // 0 when not about one inode
  std::string path;                     // of `ino`, when it has a name
  std::optional<uint64_t> file_offset;  // in the file
  std::optional<uint64_t> physical;     // in the data area
  std::optional<uint64_t> length;       // bytes concerned
  bool repaired = false;
};

// The extent map of one regular file (Options::list_extents).
struct FileExtents {
  struct Extent {
    uint64_t file_offset = 0;
    uint64_t physical = 0;
    uint64_t length = 0;
    uint32_t flags = 0;
    uint64_t blob_id = 0;
  };
  InodeNumber ino = 0;
  std::string path;
  uint64_t size = 0;
  std::vector<Extent> extents;
};

struct Report {
  std::vector<Problem> problems;                   // at most Options::max_problems_per_kind of each kind
  std::map<std::string, uint64_t> problem_counts;  // kind name -> problems found (all of them)
  uint64_t problems_found = 0;                     // first pass, all kinds
  uint64_t problems_remaining = 0;                 // after repair (== problems_found without repair)
  bool repair = false;
  bool scrub = false;

  uint64_t inodes = 0;
  uint64_t directories = 0;
  uint64_t files = 0;  // regular files
  uint64_t symlinks = 0;
  uint64_t specials = 0;  // devices, fifos, sockets
  uint64_t dirents = 0;
  uint64_t extents = 0;
  uint64_t orphans = 0;
  uint64_t xattrs = 0;
  uint64_t data_area_bytes = 0;  // data_size - data_offset
  uint64_t bytes_mapped = 0;     // sum of extent lengths (shared blobs counted once per mapping)
  uint64_t bytes_free = 0;       // sum of free-list lengths
  uint64_t bytes_scrubbed = 0;
  uint64_t blocks_scrubbed = 0;

  std::vector<FileExtents> file_extents;  // with Options::list_extents

  bool clean() const { return problems_remaining == 0; }
};

class Checker {
 public:
  struct Options {
    bool repair = false;        // needs a volume opened read-write
    bool scrub = false;         // read every written extent and verify checksums
    bool list_extents = false;  // fill Report::file_extents
    size_t max_problems_per_kind = 1000;
    // Called now and then with a phase name and how far it got.
    std::function<void(std::string_view phase, uint64_t done, uint64_t total)> progress;
  };

  Checker(Volume& volume, Options options);

  // Checks (and repairs) the volume. An error means fsck could not run (the
  // index cannot be scanned, repair asked of a read-only volume); problems
  // found are in the report, never an error.
  Result<Report> Run();

 private:
  Volume& volume_;
  Options options_;
};

}  // namespace spillfs::fsck
