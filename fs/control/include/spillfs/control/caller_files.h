// What the control plane takes from the process behind a control request,
// looked up in /proc: its descriptor of a file of this mount, its memfd
// (mapped into the daemon), its file size limit. The memory I/O ops
// (mem_write, mem_read; docs/design.md, "Memory I/O") act only on what these
// return, so a caller reaches exactly the files it has open, with the access
// it opened them with, as the mount would give it.
//
// The caller is not trusted: it may close, replace or change any descriptor
// while it is checked. Every check reads from an object the daemon holds
// (the /proc directory of the writing thread, opened when the request came;
// an O_PATH descriptor of the file itself, which pins its inode and mount),
// so a descriptor swapped meanwhile can only give the caller what another
// descriptor of its own would (the caller's own race), never the flags of
// one file with the inode of another.
//
// Threading: a CallerThread, CallerProcess or CallerMemory is used by one
// thread at a time (the control plane keeps them in a Handle, under its mu,
// or on the stack of one request). The parsers are pure functions.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "spillfs/common/mountinfo.h"
#include "spillfs/common/status.h"

namespace spillfs {

// The fields of /proc/PID/fdinfo/FD the checks use.
struct FdInfo {
  int flags = 0;  // the open flags (octal in the text), O_ACCMODE and O_APPEND, O_PATH among them
  int mnt_id = -1;
  uint64_t ino = 0;
};
// Parses an fdinfo text; EIO naming the field where one lacks (ino: Linux 5.14+).
Result<FdInfo> ParseFdInfo(std::string_view text);
// The entry of mount `mnt_id` in a mountinfo text (mountinfo.h), if listed.
std::optional<MountEntry> FindMountById(std::string_view mountinfo, int mnt_id);
// The start time (field 22: clock ticks since boot) of a /proc/PID/stat
// text, read after the command's closing parenthesis (a command may hold
// any character); EIO where it lacks.
Result<uint64_t> ParseStartTime(std::string_view stat);
// The soft "Max file size" (RLIMIT_FSIZE) of a /proc/PID/limits text: bytes,
// or nullopt when unlimited; EIO where the line lacks.
Result<std::optional<uint64_t>> ParseFileSizeLimit(std::string_view limits);

// A memfd of the caller, opened by the daemon and mapped whole (Map, which
// closes the descriptor: the mapping keeps the memfd); unmapped with the
// object.
class CallerMemory {
 public:
  CallerMemory() = default;
  ~CallerMemory();
  CallerMemory(CallerMemory&& other) noexcept;
  CallerMemory& operator=(CallerMemory&& other) noexcept;
  CallerMemory(const CallerMemory&) = delete;
  CallerMemory& operator=(const CallerMemory&) = delete;

  // Null for a memfd of size 0.
  char* data() const { return data_; }
  uint64_t size() const { return size_; }
  // False for a memfd sealed against writing (mapped read-only).
  bool writable() const { return writable_; }
  // The same memfd at the same size and sealing (a mapping can be kept).
  bool SameAs(const CallerMemory& other) const {
    return dev_ == other.dev_ && ino_ == other.ino_ && size_ == other.size_ && writable_ == other.writable_;
  }
  // Maps the memfd whole (MAP_SHARED; read-only where sealed against
  // writing); ENOMEM (or what mmap says) where it cannot.
  Status Map();

 private:
  friend class CallerProcess;
  int fd_ = -1;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  char* data_ = nullptr;
  uint64_t size_ = 0;
  bool writable_ = false;
};

// The thread that wrote a control request (FUSE's context pid is the
// writing thread's id), as the daemon saw it when the request came: its
// id, when it started (a task given the id after the thread exited started
// later: ids are handed out cyclically, and a start time is 10 ms
// precise), and its credentials then. Holds no descriptor: a caller may
// leave any number of requests unread.
struct CallerThread {
  pid_t tid = 0;
  uint64_t start_time = 0;  // clock ticks since boot (/proc/TID/stat)
  // The Uid, Gid, Groups, Cap* and NoNewPrivs lines of its status, and the
  // owner of its /proc directory (its effective ids where it is dumpable,
  // root's otherwise).
  std::string credentials;

  // ESRCH where the thread cannot be seen (pid 0: FUSE gives none for a
  // caller outside the daemon's pid namespace) or has exited.
  static Result<CallerThread> Identify(pid_t tid);
};

// The /proc directory of a CallerThread, open while the checks of one
// request run: every look-up goes through it, so all are of that thread.
class CallerProcess {
 public:
  // ESRCH where the thread has exited (its id may be another task's by now).
  static Result<CallerProcess> Open(const CallerThread& thread);
  ~CallerProcess();
  CallerProcess(CallerProcess&& other) noexcept;
  CallerProcess& operator=(CallerProcess&& other) noexcept;
  CallerProcess(const CallerProcess&) = delete;
  CallerProcess& operator=(const CallerProcess&) = delete;

  enum class Access { kRead, kWrite };
  // The inode of the caller's descriptor `fd` of a file of the mount whose
  // device is `mount_device` ("major:minor", as mountinfo names it), open
  // for `access` as read(2) or write(2) on it would need (write: O_WRONLY or
  // O_RDWR, not O_APPEND; read: O_RDONLY or O_RDWR; never O_PATH).
  // EBADF: not open, or not for `access` (or replaced while checked);
  // EXDEV: a file of another file system (or another spillfs mount),
  // named; EINVAL: not a regular file; ESRCH: the thread has exited.
  Result<uint64_t> FileOnMount(int fd, Access access, std::string_view mount_device) const;
  // The caller's memfd `fd`, checked and opened (not mapped: Map): a
  // regular file of the kernel's shmem mount (not hugetlbfs: SIGBUS, see
  // caller_files.cc) whose name starts "/memfd:", open O_RDWR in the
  // caller, and sealed against shrinking (F_SEAL_SHRINK: else the caller
  // could shrink it under the mapping and the daemon's next access would
  // die of SIGBUS). EBADF: not open; EINVAL naming what is wrong.
  Result<CallerMemory> OpenMemory(int fd) const;
  // The caller's RLIMIT_FSIZE (soft), nullopt when unlimited: the kernel
  // refuses a write through the mount past it (EFBIG).
  Result<std::optional<uint64_t>> FileSizeLimit() const;
  // EPERM where the thread's credentials are not what they were when it
  // wrote the request. Called after the descriptors are looked up: a
  // caller that ran a set-user-ID (set-group-ID, file capability) program
  // since, whose descriptors may be files the caller could not open, is
  // refused, even where the program dropped its privileges again (it stays
  // undumpable: /proc shows it as root's).
  Status CheckCredentials() const;

 private:
  friend struct CallerThread;
  CallerProcess(int dir, const CallerThread& thread) : dir_(dir), thread_(thread) {}
  // The text of /proc/TID/`name`.
  Result<std::string> ReadText(const std::string& name) const;
  Result<uint64_t> StartTime() const;
  Result<std::string> Credentials() const;
  // `missing` where the thread is still there (a descriptor it does not
  // have), ESRCH where the thread has exited.
  Status NotThere(Status missing) const;

  int dir_ = -1;  // /proc/TID, O_PATH
  CallerThread thread_;
};

}  // namespace spillfs
