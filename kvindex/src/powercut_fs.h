// The RocksDB FileSystem wrapper behind SPILLFS_POWERCUT_INDEX_JOURNAL
// (spillfs/kvindex/powercut.h says what it models and what it does not).
//
// Every operation is passed to the wrapped FileSystem unchanged; for files
// under the index directory the wrapper also appends one line to the journal
// after the operation succeeded (one write(2) each, O_APPEND, so it survives
// a SIGKILL of the writer; it is the observer, not part of the simulated
// machine):
//
//   N <tab> name                 created or truncated by NewWritableFile
//   S <tab> size <tab> name      a Sync / Fsync of it returned: `size` bytes durable
//   T <tab> size <tab> name      truncated to `size`
//   R <tab> from <tab> to        renamed (ReuseWritableFile too, followed by N)
//   L <tab> from <tab> to        hard-linked
//   D <tab> name                 deleted
//   U <tab> name                 no longer followed (opened as a random-access
//                                writable file, or renamed in from elsewhere)
//
// Names are relative to the index directory. A line cut short by a kill has
// no newline and is ignored by ApplyIndexCut.
#pragma once

#include <rocksdb/file_system.h>

#include <memory>
#include <string>

#include "spillfs/common/status.h"

namespace spillfs::powercut {

// Wraps `base`: files under `dir` journal their durable lengths to `journal`,
// which is created (or emptied) now.
Result<std::shared_ptr<rocksdb::FileSystem>> NewJournalingFileSystem(std::shared_ptr<rocksdb::FileSystem> base,
                                                                     const std::string& dir,
                                                                     const std::string& journal);

}  // namespace spillfs::powercut
