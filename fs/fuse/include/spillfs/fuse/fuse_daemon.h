// FuseDaemon: serves a Filesystem to the kernel through libfuse's low-level
// API, with its own pool of /dev/fuse workers (fs/fuse/fuse_device_loop.h:
// requests larger than libfuse's loop takes) or, asked for, FUSE over
// io_uring (fs/fuse/fuse_ring.h). It only translates: every decision about
// names, permissions of created inodes, sizes and errors is made by
// Filesystem; FUSE types never leave fuse_daemon.cc, fuse_ops.cc (the
// operations), fuse_device_loop.cc and fuse_ring.cc.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "spillfs/common/status.h"
#include "spillfs/control/control_plane.h"
#include "spillfs/core/filesystem.h"

struct fuse_session;

namespace spillfs {

class FuseDeviceLoop;
class FuseRing;
struct FuseHandles;

struct FuseOptions {
  std::string mountpoint;
  std::string fsname;         // shown as the mount source (the volume path)
  std::string extra_options;  // comma-separated -o options passed to FUSE (allow_other, ...)
  unsigned max_threads = 16;
  // Let the kernel cache writes and send them back in large asynchronous
  // requests (FUSE's writeback cache). Off by default: write() then cannot
  // report ENOSPC (fsync and close do), the kernel keeps its own file size, so
  // a size changed by a direct-path commit is not seen through this mount,
  // direct-path readers miss data still dirty in the kernel (until fsync or
  // close), and st_blocks lags until the data reaches the daemon.
  bool writeback_cache = false;
  // Carry requests over io_uring where the kernel offers it (FuseRing);
  // /dev/fuse otherwise, with a line in the log saying why.
  bool fuse_uring = false;
  unsigned ring_threads_per_cpu = 0;  // 0: FuseRing's default
  // The most payload one FUSE request carries (a multiple of the page size),
  // and the kernel's read-ahead for the mount (one request: the daemon reads
  // further ahead itself). Above 1 MiB it needs Linux 6.12+ with
  // fs.fuse.max_pages_limit raised to match (Mount lowers it to the kernel's
  // limit and says so); not with fuse_uring. 1 MiB by default: larger
  // requests need the kernel's limit raised and measured no faster (4 MiB
  // level with 1 MiB; 8 MiB level once a read straddling two read-ahead
  // windows was answered from both, 0627fd0), and a kernel read-ahead above
  // one request made streams of 1 MiB reads slower (docs/results.md, "FUSE
  // transport" and "Read path").
  size_t max_request_bytes = size_t{1} << 20;
  bool debug = false;
};

class FuseDaemon {
 public:
  FuseDaemon(std::unique_ptr<Filesystem> fs, FuseOptions options);
  ~FuseDaemon();
  FuseDaemon(const FuseDaemon&) = delete;
  FuseDaemon& operator=(const FuseDaemon&) = delete;

  // Mounts on the mountpoint; the caller may report success afterwards.
  Status Mount();
  // Serves requests until the filesystem is unmounted or a signal arrives.
  Status Run();

  Filesystem& fs() { return *fs_; }
  const FuseOptions& options() const { return options_; }
  ControlPlane& control() { return *control_; }
  // The handles the FUSE operations keep for open files and directories.
  FuseHandles& handles() { return *handles_; }
  // For notifications to the kernel; null before Mount.
  ::fuse_session* session() const { return session_; }
  // The io_uring transport; null unless FuseOptions::fuse_uring.
  FuseRing* ring() const { return ring_.get(); }
  // The /dev/fuse loop; null with FuseOptions::fuse_uring or before Mount.
  FuseDeviceLoop* device_loop() const { return device_loop_.get(); }
  // The most payload a request carries on this mount (set by Mount).
  size_t request_bytes() const { return request_bytes_; }
  // What request_bytes() will be for `options` on this kernel: max_request_bytes
  // lowered to fs.fuse.max_pages_limit (with *note saying so, if not null), or
  // libfuse's 1 MiB with fuse_uring. Known before mounting, so the filesystem's
  // read-ahead can be shaped to it (FilesystemOptions::read_request_bytes).
  static size_t RequestBytesFor(const FuseOptions& options, std::string* note);

 private:
  Status RouteThroughRing();
  Status RouteThroughDeviceLoop();

  std::unique_ptr<Filesystem> fs_;
  std::unique_ptr<ControlPlane> control_;
  // Freed after the session, so those of files still open when the daemon
  // stops too (the kernel sends no release for them).
  std::unique_ptr<FuseHandles> handles_;
  FuseOptions options_;
  ::fuse_session* session_ = nullptr;
  std::unique_ptr<FuseRing> ring_;               // with FuseOptions::fuse_uring
  std::unique_ptr<FuseDeviceLoop> device_loop_;  // without
  size_t request_bytes_ = size_t{1} << 20;
  std::string request_note_;  // why request_bytes_ is less than asked for ("" if it is not)
  std::string device_;        // "major:minor" of the mount, "" if not found
  bool mounted_ = false;
};

}  // namespace spillfs
