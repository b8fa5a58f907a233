// ControlPlane: the hidden `.spillfs` directory in the mount root, and the
// one dispatcher of the control protocol (spillfs/common/control_protocol.h).
//
//   .spillfs/control  write one JSON request (at offset 0), then read the JSON
//                     reply. Mode 0666: anyone may open it; a caller that is
//                     not root may send only the ops of
//                     control::kUnprivilegedOps (the others hand out or trust
//                     claims about the data area, as root's backing store).
//   .spillfs/stats    Prometheus text of the live volume statistics.
//
// These are virtual inodes with reserved numbers at the top of the inode
// space; they never touch the index. Replies are computed at the first read
// of a handle and served by offset, so `cat` and pread both work.
//
// Dispatch: a request is parsed once here and routed by its op: the
// inspection ops (stat, ls, du) to Inspector's read-only queries (ls and du
// after the RAM tier is flushed, as listings show extents), the direct-path
// ops (layout, reserve, commit) to Filesystem, with the handle as the lease,
// and the memory I/O ops (mem_write, mem_read) to Filesystem's MemoryWrite
// and MemoryRead, on the file and memfd of the caller's that the request
// names, checked in /proc (caller_files.h).
//
// The caller of a request is whoever wrote it: FUSE's context of the write
// (uid, and pid: the writing thread) comes with Write; the reply is worked
// out at the next read, for that caller.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "spillfs/common/control_protocol.h"
#include "spillfs/common/handle_table.h"
#include "spillfs/common/mutex.h"
#include "spillfs/control/caller_files.h"
#include "spillfs/core/filesystem.h"
#include "spillfs/inspect/inspector.h"
#include "spillfs/store/reclaim_gate.h"

namespace spillfs {

class ControlPlane {
 public:
  static constexpr InodeNumber kDirIno = UINT64_MAX - 16;
  static constexpr InodeNumber kControlIno = UINT64_MAX - 15;
  static constexpr InodeNumber kStatsIno = UINT64_MAX - 14;
  static constexpr const char* kDirName = control::kDirName;

  explicit ControlPlane(Filesystem* fs);
  // Releases the handles still open (a daemon stopped with them open gets no
  // release from the kernel); `fs` must still be alive.
  ~ControlPlane();
  ControlPlane(const ControlPlane&) = delete;
  ControlPlane& operator=(const ControlPlane&) = delete;

  static bool Owns(InodeNumber ino) { return ino >= kDirIno && ino <= kStatsIno; }

  // Lookup of `name` in `parent`; nullopt when the name is not ours.
  std::optional<Entry> Lookup(InodeNumber parent, std::string_view name) const;
  Result<Entry> GetAttr(InodeNumber ino) const;
  Result<std::vector<DirEntry>> ReadDir(InodeNumber ino) const;

  // Who wrote a request: FUSE's context of the write.
  struct RequestCaller {
    uint32_t uid = 0;
    pid_t pid = 0;  // the writing thread's id; 0 where the daemon's pid namespace cannot see it
  };
  // One open handle of a virtual file. For the direct path it is also the
  // lease: blocks of layouts given through it stay unreused (pin), and space
  // reserved through it is returned at close unless committed.
  //
  // Locks, in the order they are taken (outer first): a Handle's mu, then
  // the plane's mu_, then Filesystem's (core/filesystem.h), which the
  // dispatch calls under them.
  struct Handle {
    InodeNumber ino;  // set at Open, then only read
    // Who opened it (FUSE's context of the open), set at Open, then only
    // read. A root-only op needs it to be root as well as the request's
    // writer, and a memory op needs the writer to be the opener: else a
    // user could hand the handle to a set-user-ID program as its output
    // and have it write a request (the kernel's files check the opener's
    // credentials for the same reason).
    uint32_t opener_uid = 0;
    // Taken by each write, read and release of the handle (FUSE may send
    // them for one handle on several threads at once); held while its reply
    // is worked out, direct-path calls into Filesystem included.
    Mutex mu;
    std::string request GUARDED_BY(mu);
    // Shared with reads still sending it: the client may close the handle or
    // write its next request as soon as the kernel has copied the bytes, on
    // another thread, before the sending thread is done with them.
    std::shared_ptr<const std::string> reply GUARDED_BY(mu);
    std::unique_ptr<ReclaimGate::Reader> pin GUARDED_BY(mu);
    std::vector<PhysicalExtent> reserved GUARDED_BY(mu);
    std::optional<InodeNumber> invalidate GUARDED_BY(mu);  // a direct commit changed it: drop the kernel's cache
    // The caller of the request: set by its write at offset 0 (or the
    // handle's first write); a write of the same request by another caller
    // (uid or thread) makes it `mixed`, refused, so no request runs with one
    // caller's rights on another's descriptors. None before any write: not
    // root.
    std::optional<RequestCaller> caller GUARDED_BY(mu);
    bool mixed GUARDED_BY(mu) = false;
    // The writing thread as that write saw it (or why it could not): the
    // memory I/O ops look up the caller's descriptors in its /proc.
    Result<CallerThread> writer GUARDED_BY(mu) = Status::Error(ESRCH, "no request written yet");
    // The caller's memfd as last mapped, kept while requests name the same
    // memfd at the same size (checked again each time) and while at most
    // kMaxKeptMappings handles keep one; unmapped at Release.
    std::optional<CallerMemory> memory GUARDED_BY(mu);
  };
  // Part of a reply, with what keeps it alive while it is sent.
  struct ReplyBytes {
    std::shared_ptr<const std::string> owner;
    std::string_view bytes;
  };
  // Called after a direct commit changed a file behind the kernel's back.
  void SetInvalidator(std::function<void(InodeNumber)> invalidate) { invalidate_ = std::move(invalidate); }
  // Counts FUSE requests answered over io_uring (shown by stat); must outlive this.
  void SetFuseRingRequests(const std::atomic<uint64_t>* requests) { fuse_ring_requests_ = requests; }
  // The mount's device ("major:minor", as mountinfo names it), set once
  // mounted, before the first request: memory I/O takes only files with it
  // (bind mounts of the mount have it; another mount, spillfs or not, has
  // not). Without it (not found) memory I/O is off: the volume op says
  // "memory_io": false and mem_write and mem_read are refused (ENOTSUP).
  void SetMountDevice(std::string device) { mount_device_ = std::move(device); }
  // The handle is the plane's until Release (or the plane's end).
  Result<Handle*> Open(InodeNumber ino, int flags, uint32_t opener_uid);
  Result<size_t> Write(Handle* handle, uint64_t offset, std::string_view data, const RequestCaller& caller);
  // Bytes of the reply at [offset, offset + size) (the reply is worked out at
  // the first read after a request).
  ReplyBytes Read(Handle* handle, uint64_t offset, size_t size);
  // Returns the space reserved through `handle` unless committed, and frees it.
  void Release(Handle* handle);

  RuntimeStats Runtime() const;

  // The dispatch of the inspection ops alone, which needs no Filesystem: the
  // reply text to `request` (JSON text) over `inspector` and `runtime`, as a
  // mount answers it, with a direct-path op refused as unknown (an unmounted
  // volume has no direct path). For tests and fuzzers over a volume opened
  // read-only.
  static std::string AnswerInspection(const Inspector& inspector, std::string_view request,
                                      const RuntimeStats& runtime);

 private:
  Entry MakeEntry(InodeNumber ino) const;
  // Returns the space reserved through `handle` unless committed, and drops
  // its memfd mapping.
  void ReleaseHandle(Handle& handle) EXCLUDES(handle.mu);
  void DropMemory(Handle& handle) REQUIRES(handle.mu);
  // The reply to the handle's request (the dispatcher).
  std::string Answer(Handle& handle) REQUIRES(handle.mu) EXCLUDES(mu_);
  // The direct-path ops; `request` has one of them as its op.
  std::string AnswerDirect(Handle& handle, const nlohmann::json& request, const Inspector& inspector)
      REQUIRES(handle.mu);
  // The memory I/O ops; `request` has one of them as its op.
  std::string AnswerMemory(Handle& handle, const nlohmann::json& request) REQUIRES(handle.mu);

  // Set before the first request, then only read.
  std::function<void(InodeNumber)> invalidate_;
  const std::atomic<uint64_t>* fuse_ring_requests_ = nullptr;
  std::string mount_device_;
  // Handles keeping a memfd mapped. Each mapping is an area of the daemon's
  // address space, which holds at most vm.max_map_count (65,530 by
  // default): past kMaxKeptMappings a mapping lasts one request, so no
  // number of handles a caller opens can use them up.
  static constexpr uint64_t kMaxKeptMappings = 1024;
  std::atomic<uint64_t> mappings_kept_{0};

  Filesystem* fs_;
  std::chrono::steady_clock::time_point started_;
  // Inspection replies (stat, ls, du...) are built one at a time; direct ops
  // take none. It guards no member: the replies read the index and atomic
  // counters. Taken under a Handle's mu, before Filesystem's locks.
  Mutex mu_;
  HandleTable<Handle> handles_;  // every open handle
};

}  // namespace spillfs
