// The power-cut simulation: two wrappers that journal what is durable, and
// two appliers that do to a killed daemon's volume what a power cut at the
// moment of the kill could have done. Test-only (target spillfs_testing,
// linked by the tests and by the test-only daemon spillfs-faulty, never by
// the product), kept beside the product the way RocksDB keeps
// FaultInjectionTestFS: the product offers seams (Volume::Wrappers,
// Index::Options::file_system) and knows nothing of power cuts.
//
// A SIGKILL of the daemon loses nothing it wrote: unsynced bytes survive in
// the page cache. A power cut loses them.
//
// Data area. The wrapper of the BlockStore (NewJournalingBlockStore) appends
// to its journal, before each write is issued, the pre-image of the bytes the
// write replaces, and empties the journal once a Flush (fdatasync) has
// returned; a Flush excludes writes while it runs, so a write in flight during
// the fdatasync is never taken for durable. The journal therefore holds, in
// write order, the pre-images of exactly the writes that are not yet durable.
// ApplyDataCut undoes all of them, or a chosen subset (a device may have
// written any of its cached writes).
//
// Index. The RocksDB FileSystem wrapper (NewJournalingFileSystem) appends to
// its journal, for every file under the index directory, how many of its
// bytes are durable. ApplyIndexCut truncates each file to that length, and
// RocksDB's point-in-time WAL recovery then opens the index at the last
// durable batch (or later, never earlier). The rules, kept simple on purpose
// (what they leave out is listed in docs/reliability.md):
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
//
// Both journals are created (emptied) when their wrapper is made, at the
// volume's open: nothing written before that open is in doubt. Each journal
// write is one write(2) (the data journal's records are fflush'd before their
// write is issued), so a journal survives a SIGKILL of the daemon; a record
// cut short by the kill belongs to a write that was never issued and is
// ignored.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "spillfs/common/status.h"
#include "spillfs/store/volume.h"

namespace rocksdb {
class FileSystem;
}  // namespace rocksdb

namespace spillfs::powercut {

// The environment variables that make spillfs-faulty (testing/
// spillfs_faulty_main.cc) mount with the journals: each names a journal file.
// Only that test-only binary reads them.
inline constexpr const char* kDataJournalEnv = "SPILLFS_POWERCUT_JOURNAL";
inline constexpr const char* kIndexJournalEnv = "SPILLFS_POWERCUT_INDEX_JOURNAL";

// ---- data area ----

// Wraps `base`: every write first journals its pre-image to `journal`
// (created or emptied now); Flush empties the journal once it has returned.
Result<std::unique_ptr<BlockStore>> NewJournalingBlockStore(std::unique_ptr<BlockStore> base,
                                                            const std::string& journal);

// What ApplyDataCut did.
struct DataCut {
  uint64_t undone = 0;  // writes whose bytes were (at least partly) rolled back
  uint64_t undone_bytes = 0;
  uint64_t survived = 0;  // writes kept as the daemon issued them
  uint64_t survived_bytes = 0;
  bool torn_tail = false;  // a record cut short by the kill (its write was never issued)
};

// The power cut in the data area `image` (a file), from the data journal.
// `survives` is asked once per journaled write, oldest first, whether that
// write reached the media; without it every one is lost. Each 4 KiB unit
// ends up holding what the newest surviving write to it wrote (the pre-image
// of the next journaled write to it, or the image's current bytes when there
// is none), or, when no write to it survived, the pre-image of the oldest one
// (what was durable). The image is fsync'd.
Result<DataCut> ApplyDataCut(const std::string& journal, const std::string& image,
                             const std::function<bool()>& survives = nullptr);

// Whether the data journal at `journal` holds a whole record, i.e. a write
// that is not yet durable (false when it holds none or cannot be read). Read
// while the daemon runs, the answer may be stale by the time it is used (a
// Flush may empty the journal); read after the daemon was killed and reaped,
// it says exactly whether the power cut has a data write to undo. The tests
// time their cuts with it, and check every cut with it.
bool DataJournalHoldsAWrite(const std::string& journal);

// ---- index ----

// Wraps `base`: files under `dir` journal their durable lengths to `journal`,
// which is created (or emptied) now.
Result<std::shared_ptr<rocksdb::FileSystem>> NewJournalingFileSystem(std::shared_ptr<rocksdb::FileSystem> base,
                                                                     const std::string& dir,
                                                                     const std::string& journal);
// The same over the local file system.
Result<std::shared_ptr<rocksdb::FileSystem>> NewJournalingFileSystem(const std::string& dir,
                                                                     const std::string& journal);

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

// ---- both ----

// The wrappers for Volume::OpenOptions: each journal where its path is not
// empty.
Volume::Wrappers Wrappers(const std::string& data_journal, const std::string& index_journal);

}  // namespace spillfs::powercut
