// Internal to the daemon (not installed): the FUSE low-level operations
// (fuse_ops.cc), for FuseDaemon's session.
#pragma once

#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 314
#endif
#include <fuse3/fuse_lowlevel.h>

namespace spillfs {

// The kernel's own read-ahead for the mount: one request (1 MiB), offered at
// INIT and set on the mount's bdi before INIT (which can only lower it). The
// daemon reads further ahead itself (ReadAhead). Measured on the CPU VM, a
// buffered 1 GiB read (tools/bench/RESULTS.md): 1118-1512 MB/s at the
// kernel's default 128 KiB, 1760-2285 at 1 MiB; 442-556 at 4 MiB and 320-389
// at 8 MiB, where the kernel's requests ran so far ahead, out of order, that
// ReadAhead dropped windows still wanted (since mended, still slower).
inline constexpr unsigned kKernelReadAheadKib = 1024;

// Every operation spillfs serves; the session's userdata is its FuseDaemon.
fuse_lowlevel_ops MakeFuseOps();

}  // namespace spillfs
