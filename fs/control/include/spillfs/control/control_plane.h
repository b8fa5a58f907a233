// ControlPlane: the hidden `.spillfs` directory in the mount root, and the
// one dispatcher of the control protocol (spillfs/common/control_protocol.h).
//
//   .spillfs/control  write one JSON request (at offset 0), then read the JSON
//                     reply; root only (mode 0600), like the backing store.
//   .spillfs/stats    Prometheus text of the live volume statistics.
//
// These are virtual inodes with reserved numbers at the top of the inode
// space; they never touch the index. Replies are computed at the first read
// of a handle and served by offset, so `cat` and pread both work.
//
// Dispatch: a request is parsed once here and routed by its op: the
// inspection ops (stat, ls, du) to Inspector's read-only queries (ls and du
// after the RAM tier is flushed, as listings show extents), the direct-path
// ops (layout, reserve, commit) to Filesystem, with the handle as the lease.
#pragma once

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

  // One open handle of a virtual file. For the direct path it is also the
  // lease: blocks of layouts given through it stay unreused (pin), and space
  // reserved through it is returned at close unless committed.
  //
  // Locks, in the order they are taken (outer first): a Handle's mu, then
  // the plane's mu_, then Filesystem's (core/filesystem.h), which the
  // dispatch calls under them.
  struct Handle {
    InodeNumber ino;  // set at Open, then only read
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
  // The handle is the plane's until Release (or the plane's end).
  Result<Handle*> Open(InodeNumber ino, int flags, uint32_t uid);
  Result<size_t> Write(Handle* handle, uint64_t offset, std::string_view data);
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
  void ReturnReserved(Handle& handle) EXCLUDES(handle.mu);
  // The reply to the handle's request (the dispatcher).
  std::string Answer(Handle& handle) REQUIRES(handle.mu) EXCLUDES(mu_);
  // The direct-path ops; `request` has one of them as its op.
  std::string AnswerDirect(Handle& handle, const nlohmann::json& request, const Inspector& inspector)
      REQUIRES(handle.mu);

  std::function<void(InodeNumber)> invalidate_;
  const std::atomic<uint64_t>* fuse_ring_requests_ = nullptr;

  Filesystem* fs_;
  std::chrono::steady_clock::time_point started_;
  // Inspection replies (stat, ls, du...) are built one at a time; direct ops
  // take none. It guards no member: the replies read the index and atomic
  // counters. Taken under a Handle's mu, before Filesystem's locks.
  Mutex mu_;
  HandleTable<Handle> handles_;  // every open handle
};

}  // namespace spillfs
