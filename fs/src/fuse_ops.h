// Internal to the daemon (not installed): the FUSE low-level operations
// (fuse_ops.cc), for FuseDaemon's session.
#pragma once

#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 314
#endif
#include <fuse3/fuse_lowlevel.h>

namespace spillfs {

// Every operation spillfs serves; the session's userdata is its FuseDaemon.
fuse_lowlevel_ops MakeFuseOps();

}  // namespace spillfs
