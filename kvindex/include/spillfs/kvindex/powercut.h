// Power-cut simulation of the index: test-only behaviour, compiled in, off
// unless asked for.
//
// A SIGKILL of the daemon loses nothing that RocksDB wrote: unsynced WAL bytes
// survive in the page cache. A power cut loses them. With the environment
// variable SPILLFS_POWERCUT_INDEX_JOURNAL=PATH set when an Index is opened
// read-write, RocksDB reaches its files through a FileSystem wrapper
// (kvindex/src/powercut_fs.h) that appends to PATH, for every file under the
// index directory, how many of its bytes are durable. After the daemon is
// killed, ApplyIndexCut() does to the index directory what a power cut at
// that moment could have done, and RocksDB's point-in-time WAL recovery then
// opens the index at the last durable batch (or later, never earlier).
//
// The rules, kept simple on purpose (what they leave out is listed in
// docs/reliability.md):
//  - A file's durable length is its length when a Sync or Fsync of it last
//    returned. Appends after that are lost. RangeSync (sync_file_range) makes
//    nothing durable: it flushes neither the device cache nor metadata.
//  - A file created (or truncated) by NewWritableFile counts as absent until
//    its first Sync: a cut removes it. Directory fsyncs are not modelled: a
//    synced file keeps its name.
//  - A rename carries the durable state of the renamed file to the new name
//    (RocksDB syncs CURRENT's temporary file before renaming it); a delete is
//    durable at once.
//  - Files the journal never mentions (those present before the open, the
//    LOCK file, the info LOG) are left alone.
//  - The journal is opened (truncated) at Index::Open: nothing written before
//    that open is in doubt.
#pragma once

#include <cstdint>
#include <string>

#include "spillfs/common/status.h"

namespace spillfs::powercut {

// The environment variable that turns the index journal on (read at Index::Open).
inline constexpr const char* kIndexJournalEnv = "SPILLFS_POWERCUT_INDEX_JOURNAL";

// What ApplyIndexCut did.
struct IndexCut {
  uint64_t files_tracked = 0;    // files the journal knows at the cut
  uint64_t files_truncated = 0;  // cut back to their durable length
  uint64_t bytes_dropped = 0;    // bytes past the durable lengths
  uint64_t files_removed = 0;    // never synced: removed
};

// Applies the power cut described by `journal` to the index directory
// `index_dir` (which need not be the path the journal was written under: file
// names in the journal are relative to the index directory). The index must
// not be open. Truncates each tracked file to its durable length and removes
// tracked files that were never durable.
Result<IndexCut> ApplyIndexCut(const std::string& journal, const std::string& index_dir);

}  // namespace spillfs::powercut
