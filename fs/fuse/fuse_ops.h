// Internal to the daemon (not installed): the FUSE low-level operations
// (fuse_ops.cc), for FuseDaemon's session.
#pragma once

#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 314
#endif
#include <fuse3/fuse_lowlevel.h>

#include "spillfs/common/handle_table.h"

namespace spillfs {

// The most a request carries through libfuse's own loop (FuseRing's too):
// libfuse 3.14 receives into buffers of 256 pages and lowers max_write at
// INIT to fit. FuseDeviceLoop is not bound by it (fuse_device_loop.h).
inline constexpr unsigned kLibfuseMaxRequestBytes = 1u << 20;

// Every operation spillfs serves; the session's userdata is its FuseDaemon.
fuse_lowlevel_ops MakeFuseOps();

// What the operations keep in fuse_file_info::fh (fuse_ops.cc): a directory's
// listing, a write-only file's DirectWriteHandle. (Control-plane handles are
// the ControlPlane's.) The FuseDaemon owns them, so a daemon that stops with
// files open frees them after its session (no request runs then).
struct DirHandle;
struct DirectWriteHandle;
struct FuseHandles {
  FuseHandles();
  ~FuseHandles();  // in fuse_ops.cc, where the handles are complete types
  HandleTable<DirHandle> dirs;
  HandleTable<DirectWriteHandle> direct_writes;
};

}  // namespace spillfs
