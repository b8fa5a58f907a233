// The FUSE low-level operations: each translates one request into a call
// on Filesystem (or the ControlPlane) and its answer; FuseDaemon (which owns
// the session) is the request's userdata.
#define FUSE_USE_VERSION 314
#include "fuse_ops.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/xattr.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <vector>

#include "spillfs/fuse/fuse_daemon.h"
#include "spillfs/fuse/fuse_guard.h"

namespace spillfs {

// Directory listing taken at the first readdir (offset 0), served by index.
struct DirHandle {
  std::vector<DirEntry> entries;
};

// The state of a write-only handle that skips the page cache (see
// ChoosePageCacheUse).
struct DirectWriteHandle {
  // Filesystem::privilege_epoch() when a write last found nothing to strip.
  std::atomic<uint64_t> clean_epoch{0};
};

FuseHandles::FuseHandles() = default;
FuseHandles::~FuseHandles() = default;

namespace {

// Attributes may change without a request the kernel sees (st_blocks when the
// flusher maps cached data; the direct path invalidates what it changes), so
// the kernel keeps them a second. Names change only through this mount's own
// requests (the control plane creates, renames and removes none), so the
// kernel keeps entries, and the absence of a name, for a day, as ext4's dcache
// does: an unlink or stat of a name looked up before needs no LOOKUP.
constexpr double kAttrTimeout = 1.0;
constexpr double kEntryTimeout = 86400.0;
constexpr unsigned kMaxBackground = 64;

FuseDaemon& Daemon(fuse_req_t req) { return *static_cast<FuseDaemon*>(fuse_req_userdata(req)); }
Filesystem& Fs(fuse_req_t req) { return Daemon(req).fs(); }
ControlPlane& Control(fuse_req_t req) { return Daemon(req).control(); }

// Names and inodes of the control plane cannot be created, changed or removed.
bool Reserved(fuse_ino_t parent, const char* name) {
  return ControlPlane::Owns(parent) || (parent == kRootInode && std::strcmp(name, ControlPlane::kDirName) == 0);
}

Caller CallerOf(fuse_req_t req) {
  const fuse_ctx* ctx = fuse_req_ctx(req);
  return Caller{ctx->uid, ctx->gid};
}

void ReplyError(fuse_req_t req, const Status& status) { fuse_reply_err(req, status.ok() ? 0 : status.code()); }

fuse_entry_param EntryParam(const Entry& entry) {
  fuse_entry_param param{};
  param.ino = entry.ino;
  param.generation = entry.generation;
  param.attr = entry.attr;
  param.attr_timeout = kAttrTimeout;
  param.entry_timeout = kEntryTimeout;
  return param;
}

void ReplyEntry(fuse_req_t req, const Result<Entry>& entry) {
  if (!entry.ok()) return ReplyError(req, entry.status());
  fuse_entry_param param = EntryParam(*entry);
  if (fuse_reply_entry(req, &param) == -ENOENT) Fs(req).Forget(entry->ino, 1);  // request was interrupted
}

void ReplyAttr(fuse_req_t req, const Result<Entry>& entry) {
  if (!entry.ok()) return ReplyError(req, entry.status());
  fuse_reply_attr(req, &entry->attr, kAttrTimeout);
}

FuseHandles& Handles(fuse_req_t req) { return Daemon(req).handles(); }

DirHandle* Dir(fuse_file_info* fi) { return reinterpret_cast<DirHandle*>(fi->fh); }

// ---- operations ----

void OnInit(void* userdata, fuse_conn_info* conn) {
  const FuseDaemon& daemon = *static_cast<FuseDaemon*>(userdata);
  const FuseOptions& options = daemon.options();
  // FuseDeviceLoop raises it in the reply to request_bytes, which its buffers
  // hold (so they also hold it where it cannot patch the reply).
  conn->max_write = std::min<unsigned>(kLibfuseMaxRequestBytes, static_cast<unsigned>(daemon.request_bytes()));
  // One request: the bdi is set to it before INIT (fuse_daemon.cc).
  conn->max_readahead = static_cast<unsigned>(daemon.request_bytes());
  // Read-ahead and background writes run as "background" requests; the
  // kernel's default of 12 in flight starves the worker threads and the SSD.
  conn->max_background = kMaxBackground;
  conn->congestion_threshold = kMaxBackground * 3 / 4;
  if (conn->capable & FUSE_CAP_PARALLEL_DIROPS) conn->want |= FUSE_CAP_PARALLEL_DIROPS;
  if (options.writeback_cache) {
    if (conn->capable & FUSE_CAP_WRITEBACK_CACHE) {
      conn->want |= FUSE_CAP_WRITEBACK_CACHE;
    } else {
      fmt::print(stderr, "spillfs: the kernel does not offer FUSE's writeback cache; --writeback-cache ignored\n");
    }
  }
  conn->want &= ~FUSE_CAP_HANDLE_KILLPRIV;  // the kernel clears suid/sgid on write and chown
}

void OnDestroy(void* userdata) {
  Filesystem& fs = static_cast<FuseDaemon*>(userdata)->fs();
  Status s = fs.SettleAll();
  if (s.ok()) s = fs.SyncAll();
  if (!s.ok()) fmt::print(stderr, "spillfs: sync at unmount failed: {}\n", s.ToString());
}

void OnLookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  if (auto entry = Control(req).Lookup(parent, name)) return ReplyEntry(req, *entry);
  if (ControlPlane::Owns(parent)) return ReplyError(req, Status::NotFound());
  Result<Entry> entry = Fs(req).Lookup(parent, name);
  if (!entry.ok() && entry.status().code() == ENOENT) {
    fuse_entry_param negative{};  // ino 0: the kernel keeps the name's absence (see kEntryTimeout)
    negative.entry_timeout = kEntryTimeout;
    return static_cast<void>(fuse_reply_entry(req, &negative));
  }
  ReplyEntry(req, entry);
}

void OnForget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
  if (!ControlPlane::Owns(ino)) Fs(req).Forget(ino, nlookup);
  fuse_reply_none(req);
}

void OnForgetMulti(fuse_req_t req, size_t count, fuse_forget_data* forgets) {
  for (size_t i = 0; i < count; ++i) {
    if (!ControlPlane::Owns(forgets[i].ino)) Fs(req).Forget(forgets[i].ino, forgets[i].nlookup);
  }
  fuse_reply_none(req);
}

void OnGetattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  if (ControlPlane::Owns(ino)) return ReplyAttr(req, Control(req).GetAttr(ino));
  ReplyAttr(req, Fs(req).GetAttr(ino));
}

int64_t TimespecNs(const struct timespec& ts) { return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec; }

void OnSetattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info*) {
  if (ControlPlane::Owns(ino)) {
    // O_TRUNC of the control file arrives as a size change: nothing to keep.
    if (to_set == FUSE_SET_ATTR_SIZE && ino == ControlPlane::kControlIno)
      return ReplyAttr(req, Control(req).GetAttr(ino));
    return ReplyError(req, Status::Error(EPERM, "control plane"));
  }
  SetAttrRequest request;
  if (to_set & FUSE_SET_ATTR_MODE) request.mode = attr->st_mode;
  if (to_set & FUSE_SET_ATTR_UID) request.uid = attr->st_uid;
  if (to_set & FUSE_SET_ATTR_GID) request.gid = attr->st_gid;
  if (to_set & FUSE_SET_ATTR_SIZE) request.size = static_cast<uint64_t>(attr->st_size);
  if (to_set & FUSE_SET_ATTR_ATIME_NOW) {
    request.atime_ns = SetAttrRequest::kTimeNow;
  } else if (to_set & FUSE_SET_ATTR_ATIME) {
    request.atime_ns = TimespecNs(attr->st_atim);
  }
  if (to_set & FUSE_SET_ATTR_MTIME_NOW) {
    request.mtime_ns = SetAttrRequest::kTimeNow;
  } else if (to_set & FUSE_SET_ATTR_MTIME) {
    request.mtime_ns = TimespecNs(attr->st_mtim);
  }
  if (to_set & FUSE_SET_ATTR_CTIME) request.ctime_ns = TimespecNs(attr->st_ctim);
  ReplyAttr(req, Fs(req).SetAttr(ino, request));
}

void OnReadlink(fuse_req_t req, fuse_ino_t ino) {
  auto target = Fs(req).ReadLink(ino);
  if (!target.ok()) return ReplyError(req, target.status());
  fuse_reply_readlink(req, target->c_str());
}

void OnMknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev) {
  if (Reserved(parent, name)) return ReplyError(req, Status::Error(EEXIST, ""));
  ReplyEntry(req, Fs(req).MakeNode(parent, name, mode, rdev, CallerOf(req)));
}

void OnMkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  if (Reserved(parent, name)) return ReplyError(req, Status::Error(EEXIST, ""));
  ReplyEntry(req, Fs(req).MakeDir(parent, name, mode, CallerOf(req)));
}

void OnUnlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  if (Reserved(parent, name)) return ReplyError(req, Status::Error(EPERM, ""));
  ReplyError(req, Fs(req).Unlink(parent, name));
}

void OnRmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  if (Reserved(parent, name)) return ReplyError(req, Status::Error(EPERM, ""));
  ReplyError(req, Fs(req).Rmdir(parent, name));
}

void OnSymlink(fuse_req_t req, const char* target, fuse_ino_t parent, const char* name) {
  if (Reserved(parent, name)) return ReplyError(req, Status::Error(EEXIST, ""));
  ReplyEntry(req, Fs(req).Symlink(parent, name, target, CallerOf(req)));
}

void OnRename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t new_parent, const char* new_name,
              unsigned flags) {
  if (Reserved(parent, name) || Reserved(new_parent, new_name)) return ReplyError(req, Status::Error(EPERM, ""));
  ReplyError(req, Fs(req).Rename(parent, name, new_parent, new_name, flags));
}

void OnLink(fuse_req_t req, fuse_ino_t ino, fuse_ino_t new_parent, const char* new_name) {
  if (ControlPlane::Owns(ino) || Reserved(new_parent, new_name)) return ReplyError(req, Status::Error(EPERM, ""));
  ReplyEntry(req, Fs(req).Link(ino, new_parent, new_name));
}

// A write-only handle (torch.save, np.save, an activation spill) skips the
// page cache (direct_io): its write()s reach the daemon as they are, without
// the kernel first copying them into page-cache pages: about twice the
// ingest of 1 MiB writes, and faster unaligned writers once a partial block
// past EOF is zeroed instead of read (a448212, 8d6a2dd; docs/results.md,
// "Write path"). Nothing is lost: the handle neither reads nor maps, the
// RAM tier is the cache, and the kernel drops cached pages of the range it
// writes directly (handles that can read keep the page cache). Not under
// --writeback-cache, whose point is that the kernel gathers small writes.
// fi->fh of such a handle points to its DirectWriteHandle (other regular-file
// handles have fh 0), held in Handles(req).direct_writes until release.
DirectWriteHandle* DirectHandleOf(const fuse_file_info* fi) { return reinterpret_cast<DirectWriteHandle*>(fi->fh); }

void ChoosePageCacheUse(fuse_req_t req, fuse_file_info* fi) {
  // A reader's close has nothing to write out (Filesystem::Flush is for the
  // data a writer leaves in the RAM tier) and the daemon keeps no POSIX
  // locks for FLUSH to drop (the kernel's own do), so the kernel skips it.
  if ((fi->flags & O_ACCMODE) == O_RDONLY) fi->noflush = 1;
  if ((fi->flags & O_ACCMODE) != O_WRONLY || Daemon(req).options().writeback_cache) return;
  fi->direct_io = 1;
  fi->fh = reinterpret_cast<uint64_t>(Handles(req).direct_writes.Add(std::make_unique<DirectWriteHandle>()));
}

// What the kernel's file_remove_privs does before a write through the page
// cache, done here for direct_io handles (for those it leaves it to the
// server): Filesystem::RemovePrivilegesForWrite, with the writer privileged
// when it is root (standing for CAP_FSETID, which the daemon cannot see).
// The kernel's cached mode is then stale: invalidated (attributes only; no
// page is touched). A handle that found nothing to strip skips the lookups
// until a mode, owner or security attribute changes (the privilege epoch),
// as the kernel's S_NOSEC does for its own path.
Status RemovePrivsForDirectWrite(fuse_req_t req, fuse_ino_t ino, DirectWriteHandle* handle) {
  Filesystem& fs = Fs(req);
  const uint64_t epoch = fs.privilege_epoch();
  if (handle->clean_epoch.load(std::memory_order_acquire) == epoch) return Status::OK();
  auto removed = fs.RemovePrivilegesForWrite(ino, /*privileged=*/fuse_req_ctx(req)->uid == 0);
  if (!removed.ok()) return removed.status();
  if (removed->mode_changed) fuse_lowlevel_notify_inval_inode(Daemon(req).session(), ino, -1, 0);
  if (removed->none_found) handle->clean_epoch.store(epoch, std::memory_order_release);
  return Status::OK();
}

void OnOpen(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (ControlPlane::Owns(ino)) {
    auto handle = Control(req).Open(ino, fi->flags, fuse_req_ctx(req)->uid);
    if (!handle.ok()) return ReplyError(req, handle.status());
    fi->fh = reinterpret_cast<uint64_t>(*handle);
    fi->direct_io = 1;  // sizes are unknown until read; bypass the page cache
    if (fuse_reply_open(req, fi) == -ENOENT) Control(req).Release(*handle);
    return;
  }
  auto entry = Fs(req).GetAttr(ino);
  if (!entry.ok()) return ReplyError(req, entry.status());
  if (S_ISDIR(entry->attr.st_mode)) return ReplyError(req, Status::Error(EISDIR, ""));
  if ((fi->flags & O_TRUNC) && S_ISREG(entry->attr.st_mode)) {
    // libfuse asks for atomic O_TRUNC: the truncation arrives with the open.
    SetAttrRequest truncate;
    truncate.size = 0;
    truncate.mtime_ns = SetAttrRequest::kTimeNow;
    auto truncated = Fs(req).SetAttr(ino, truncate);
    if (!truncated.ok()) return ReplyError(req, truncated.status());
  }
  Status s = Fs(req).Open(ino);
  if (!s.ok()) return ReplyError(req, s);
  fi->keep_cache = 1;  // every change goes through this mount, so the page cache stays valid
  ChoosePageCacheUse(req, fi);
  if (fuse_reply_open(req, fi) == -ENOENT) {  // the open was interrupted
    Handles(req).direct_writes.Free(DirectHandleOf(fi));
    (void)Fs(req).Release(ino);
  }
}

void OnCreate(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi) {
  if (Reserved(parent, name)) return ReplyError(req, Status::Error(EEXIST, ""));
  auto entry = Fs(req).MakeNode(parent, name, mode, 0, CallerOf(req));
  if (!entry.ok()) return ReplyError(req, entry.status());
  Status s = Fs(req).Open(entry->ino);
  if (!s.ok()) return ReplyError(req, s);
  fi->keep_cache = 1;
  ChoosePageCacheUse(req, fi);
  fuse_entry_param param = EntryParam(*entry);
  if (fuse_reply_create(req, &param, fi) == -ENOENT) {
    Handles(req).direct_writes.Free(DirectHandleOf(fi));
    (void)Fs(req).Release(entry->ino);
    Fs(req).Forget(entry->ino, 1);
  }
}

ControlPlane::Handle* ControlHandle(fuse_file_info* fi) { return reinterpret_cast<ControlPlane::Handle*>(fi->fh); }

void OnRead(fuse_req_t req, fuse_ino_t ino, size_t size, off_t offset, fuse_file_info* fi) {
  if (ControlPlane::Owns(ino)) {
    ControlPlane::ReplyBytes reply = Control(req).Read(ControlHandle(fi), static_cast<uint64_t>(offset), size);
    fuse_reply_buf(req, reply.bytes.data(), reply.bytes.size());
    return;
  }
  thread_local AlignedBuffer scratch;
  // The kernel has copied the bytes into the reader's pages when the reply returns.
  auto n = Fs(req).Read(ino, static_cast<uint64_t>(offset), size, &scratch, [req](const iovec* pieces, int count) {
    if (count == 0) return static_cast<void>(fuse_reply_buf(req, nullptr, 0));
    fuse_reply_iov(req, pieces, count);
  });
  if (!n.ok()) ReplyError(req, n.status());
}

void OnWrite(fuse_req_t req, fuse_ino_t ino, const char* buf, size_t size, off_t offset, fuse_file_info* fi) {
  if (ControlPlane::Owns(ino)) {
    // Who sent the request: the reply (worked out at the next read) is for them.
    const fuse_ctx* ctx = fuse_req_ctx(req);
    auto n = Control(req).Write(ControlHandle(fi), static_cast<uint64_t>(offset), std::string_view(buf, size),
                                ControlPlane::RequestCaller{ctx->uid, ctx->pid});
    if (!n.ok()) return ReplyError(req, n.status());
    fuse_reply_write(req, *n);
    return;
  }
  if (DirectWriteHandle* handle = DirectHandleOf(fi)) {
    Status removed = RemovePrivsForDirectWrite(req, ino, handle);
    if (!removed.ok()) return ReplyError(req, removed);
  }
  // Answered as soon as the write cannot fail (before the RAM tier's copy),
  // so the kernel sends the next request while this thread copies.
  bool answered = false;
  Filesystem::WriteAccepted accepted = [&](size_t n) {
    fuse_reply_write(req, n);
    answered = true;
  };
  auto n = Fs(req).Write(ino, static_cast<uint64_t>(offset), buf, size, &accepted);
  if (answered) return;
  if (!n.ok()) return ReplyError(req, n.status());
  fuse_reply_write(req, *n);
}

void OnFlush(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  if (ControlPlane::Owns(ino)) return ReplyError(req, Status::OK());
  ReplyError(req, Fs(req).Flush(ino));
}

void OnRelease(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (ControlPlane::Owns(ino)) {
    Control(req).Release(ControlHandle(fi));
    return ReplyError(req, Status::OK());
  }
  Handles(req).direct_writes.Free(DirectHandleOf(fi));
  ReplyError(req, Fs(req).Release(ino));
}

void OnFsync(fuse_req_t req, fuse_ino_t ino, int datasync, fuse_file_info*) {
  ReplyError(req, Fs(req).Fsync(ino, datasync != 0));
}

void OnOpendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  auto entry = ControlPlane::Owns(ino) ? Control(req).GetAttr(ino) : Fs(req).GetAttr(ino);
  if (!entry.ok()) return ReplyError(req, entry.status());
  if (!S_ISDIR(entry->attr.st_mode)) return ReplyError(req, Status::Error(ENOTDIR, ""));
  Status s = ControlPlane::Owns(ino) ? Status::OK() : Fs(req).Open(ino);
  if (!s.ok()) return ReplyError(req, s);
  fi->fh = reinterpret_cast<uint64_t>(Handles(req).dirs.Add(std::make_unique<DirHandle>()));
  if (!ControlPlane::Owns(ino)) {
    // The kernel keeps the listing and serves later ones itself, until a
    // request of this mount changes the directory (fuse_dir_changed drops
    // it): names change through no other way (kEntryTimeout). The control
    // plane's listings are computed, so they are asked for each time.
    fi->cache_readdir = 1;
    fi->keep_cache = 1;
  }
  if (fuse_reply_open(req, fi) == -ENOENT) {
    Handles(req).dirs.Free(Dir(fi));
    (void)Fs(req).Release(ino);
  }
}

void ReadDirectory(fuse_req_t req, fuse_ino_t ino, size_t size, off_t offset, fuse_file_info* fi, bool plus) {
  DirHandle* handle = Dir(fi);
  if (offset == 0) {
    auto entries = ControlPlane::Owns(ino) ? Control(req).ReadDir(ino) : Fs(req).ReadDir(ino);
    if (!entries.ok()) return ReplyError(req, entries.status());
    handle->entries = std::move(*entries);
  }
  std::vector<char> buffer(size);
  size_t used = 0;
  for (size_t i = static_cast<size_t>(offset); i < handle->entries.size(); ++i) {
    const DirEntry& e = handle->entries[i];
    off_t next = static_cast<off_t>(i + 1);
    size_t room = size - used;
    size_t needed;
    if (!plus) {
      struct stat st {};
      st.st_ino = e.ino;
      st.st_mode = e.type;
      needed = fuse_add_direntry(req, buffer.data() + used, room, e.name.c_str(), &st, next);
    } else if (e.name == "." || e.name == "..") {
      fuse_entry_param param{};
      param.attr.st_ino = e.ino;
      param.attr.st_mode = e.type;
      needed = fuse_add_direntry_plus(req, buffer.data() + used, room, e.name.c_str(), &param, next);
    } else {
      // Count a lookup only for an entry that fits in the reply.
      fuse_entry_param probe{};
      if (fuse_add_direntry_plus(req, nullptr, 0, e.name.c_str(), &probe, next) > room) break;
      auto control_entry = Control(req).Lookup(ino, e.name);
      auto entry = control_entry ? Result<Entry>(*control_entry) : Fs(req).Lookup(ino, e.name);
      if (!entry.ok()) continue;  // removed since the listing was taken
      fuse_entry_param param = EntryParam(*entry);
      needed = fuse_add_direntry_plus(req, buffer.data() + used, room, e.name.c_str(), &param, next);
    }
    if (needed > room) break;
    used += needed;
  }
  fuse_reply_buf(req, buffer.data(), used);
}

void OnReaddir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t offset, fuse_file_info* fi) {
  ReadDirectory(req, ino, size, offset, fi, false);
}

void OnReaddirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t offset, fuse_file_info* fi) {
  ReadDirectory(req, ino, size, offset, fi, true);
}

void OnReleasedir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Handles(req).dirs.Free(Dir(fi));
  if (ControlPlane::Owns(ino)) return ReplyError(req, Status::OK());
  ReplyError(req, Fs(req).Release(ino));
}

void OnFsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, fuse_file_info*) {
  ReplyError(req, Fs(req).Fsync(ino, datasync != 0));
}

void OnStatfs(fuse_req_t req, fuse_ino_t) {
  struct statvfs st = Fs(req).StatFs();
  fuse_reply_statfs(req, &st);
}

void OnSetxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size, int flags) {
  if (ControlPlane::Owns(ino)) return ReplyError(req, Status::Error(EPERM, ""));
  ReplyError(req, Fs(req).SetXattr(ino, name, std::string_view(value, size), flags));
}

// getxattr and listxattr share the size protocol: 0 asks for the length.
void ReplyXattrBytes(fuse_req_t req, const std::string& bytes, size_t size) {
  if (size == 0) {
    fuse_reply_xattr(req, bytes.size());
  } else if (bytes.size() > size) {
    fuse_reply_err(req, ERANGE);
  } else {
    fuse_reply_buf(req, bytes.data(), bytes.size());
  }
}

void OnGetxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  if (ControlPlane::Owns(ino)) return ReplyError(req, Status::Error(ENODATA, ""));
  auto value = Fs(req).GetXattr(ino, name);
  if (!value.ok()) return ReplyError(req, value.status());
  ReplyXattrBytes(req, *value, size);
}

void OnListxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  if (ControlPlane::Owns(ino)) return ReplyXattrBytes(req, "", size);
  auto names = Fs(req).ListXattr(ino);
  if (!names.ok()) return ReplyError(req, names.status());
  std::string bytes;
  for (const std::string& name : *names) {
    bytes += name;
    bytes.push_back('\0');
  }
  ReplyXattrBytes(req, bytes, size);
}

void OnRemovexattr(fuse_req_t req, fuse_ino_t ino, const char* name) {
  if (ControlPlane::Owns(ino)) return ReplyError(req, Status::Error(EPERM, ""));
  ReplyError(req, Fs(req).RemoveXattr(ino, name));
}

void OnFallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset, off_t length, fuse_file_info*) {
  if (ControlPlane::Owns(ino)) return ReplyError(req, Status::Error(EOPNOTSUPP, ""));
  if (offset < 0 || length <= 0) return ReplyError(req, Status::Error(EINVAL, ""));
  ReplyError(req, Fs(req).Fallocate(ino, mode, static_cast<uint64_t>(offset), static_cast<uint64_t>(length)));
}

void OnLseek(fuse_req_t req, fuse_ino_t ino, off_t offset, int whence, fuse_file_info*) {
  if (whence != SEEK_DATA && whence != SEEK_HOLE) return ReplyError(req, Status::Error(EINVAL, ""));
  if (offset < 0) return ReplyError(req, Status::Error(ENXIO, ""));
  auto result = Fs(req).Lseek(ino, static_cast<uint64_t>(offset), whence);
  if (!result.ok()) return ReplyError(req, result.status());
  fuse_reply_lseek(req, static_cast<off_t>(*result));
}

}  // namespace

fuse_lowlevel_ops MakeFuseOps() {
  // Every request's handler runs guarded: no exception reaches libfuse
  // (fuse_guard.h).
  fuse_lowlevel_ops ops{};
  ops.init = OnInit;
  ops.destroy = OnDestroy;
  ops.lookup = kGuarded<OnLookup>;
  ops.forget = kGuarded<OnForget, ReplyNone>;
  ops.forget_multi = kGuarded<OnForgetMulti, ReplyNone>;
  ops.getattr = kGuarded<OnGetattr>;
  ops.setattr = kGuarded<OnSetattr>;
  ops.readlink = kGuarded<OnReadlink>;
  ops.mknod = kGuarded<OnMknod>;
  ops.mkdir = kGuarded<OnMkdir>;
  ops.unlink = kGuarded<OnUnlink>;
  ops.rmdir = kGuarded<OnRmdir>;
  ops.symlink = kGuarded<OnSymlink>;
  ops.rename = kGuarded<OnRename>;
  ops.link = kGuarded<OnLink>;
  ops.open = kGuarded<OnOpen>;
  ops.create = kGuarded<OnCreate>;
  ops.read = kGuarded<OnRead>;
  ops.write = kGuarded<OnWrite>;
  ops.flush = kGuarded<OnFlush>;
  ops.release = kGuarded<OnRelease>;
  ops.fsync = kGuarded<OnFsync>;
  ops.opendir = kGuarded<OnOpendir>;
  ops.readdir = kGuarded<OnReaddir>;
  ops.readdirplus = kGuarded<OnReaddirplus>;
  ops.releasedir = kGuarded<OnReleasedir>;
  ops.fsyncdir = kGuarded<OnFsyncdir>;
  ops.statfs = kGuarded<OnStatfs>;
  ops.setxattr = kGuarded<OnSetxattr>;
  ops.getxattr = kGuarded<OnGetxattr>;
  ops.listxattr = kGuarded<OnListxattr>;
  ops.removexattr = kGuarded<OnRemovexattr>;
  ops.fallocate = kGuarded<OnFallocate>;
  ops.lseek = kGuarded<OnLseek>;
  return ops;
}

}  // namespace spillfs
