// Small rules about names and inode records shared by the namespace
// operations and the inode bookkeeping of Filesystem: internal to fs/src.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <string_view>

#include "spillfs/core/filesystem.h"
#include "spillfs/common/status.h"
#include "spillfs/kvindex/records.h"

namespace spillfs {

// ENOENT for an empty name, ENAMETOOLONG past kNameMax, EINVAL for '/' or NUL.
inline Status CheckName(std::string_view name) {
  if (name.empty()) return Status::Error(ENOENT, "empty name");
  if (name.size() > Filesystem::kNameMax) return Status::Error(ENAMETOOLONG, "name longer than 255 bytes");
  if (name.find('/') != std::string_view::npos || name.find('\0') != std::string_view::npos) {
    return Status::Error(EINVAL, "name contains '/' or NUL");
  }
  return Status::OK();
}

inline bool IsDir(const InodeRecord& r) { return S_ISDIR(r.mode); }

// A change to the inode (ctime); with `modify`, to its contents (mtime).
inline void Touch(InodeRecord* r, bool modify, int64_t now) {
  r->ctime_ns = now;
  if (modify) r->mtime_ns = now;
}

}  // namespace spillfs
