// Segment files: opening (which backend), the direct path's clients, closing.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "client_impl.h"
#include "error.h"
#include "file_impl.h"
#include "file_settings.h"
#include "fork_guard.h"
#include "spillfs/common/control_protocol.h"
#include "spillfs/common/mountinfo.h"

namespace spillfs::client {
namespace {

// Direct-path clients by mountpoint, shared by the files of a process (one
// opens the control file and the store; a stat round trip). A weak entry: the
// client goes with the last file using it.
std::mutex g_clients_mu;
std::map<std::string, std::weak_ptr<spill_client>> g_clients;
ForkGuard g_clients_guard{&g_clients_mu};

int DirectClient(const std::string& mountpoint, std::shared_ptr<spill_client>* out) {
  {
    std::lock_guard lock(g_clients_mu);
    if (auto c = g_clients[mountpoint].lock()) {
      *out = std::move(c);
      return 0;
    }
  }
  spill_client* raw = spill_client_open(mountpoint.c_str());
  if (raw == nullptr) return -(errno == 0 ? EIO : errno);
  std::shared_ptr<spill_client> made(raw, [](spill_client* c) { spill_client_close(c); });
  std::lock_guard lock(g_clients_mu);
  if (auto c = g_clients[mountpoint].lock()) {  // another thread made one meanwhile
    *out = std::move(c);
    return 0;
  }
  g_clients[mountpoint] = made;
  *out = std::move(made);
  return 0;
}

// Whether the daemon of `mountpoint` does memory I/O (mem_write, mem_read)
// for callers who may not open its data area; *dedup: whether the volume
// dedups. A control round trip a file (not kept: a mount point may get
// another daemon).
bool MemoryIoOffered(const std::string& mountpoint, bool* dedup) {
  *dedup = false;
  std::unique_ptr<ControlChannel> channel;
  nlohmann::json volume;
  // A daemon from before memory I/O refuses non-root callers the control file.
  if (ControlChannel::Open(spillfs::control::ControlPath(mountpoint), &channel) != 0 ||
      channel->Request({{"op", "volume"}}, &volume) != 0 || !volume.is_object()) {
    return false;
  }
  *dedup = volume.value("dedup", false);
  return volume.value("memory_io", false);
}

std::string AbsolutePath(const char* path) {
  if (path[0] == '/') return path;
  char cwd[PATH_MAX];
  if (getcwd(cwd, sizeof(cwd)) == nullptr) return path;
  return std::string(cwd) + "/" + path;
}

}  // namespace
}  // namespace spillfs::client

using namespace spillfs::client;

spill_file::~spill_file() {
  if (fd >= 0) close(fd);
}

void spill_file::Changed() {
  std::shared_ptr<Layout> dropped;  // its lease closed after the lock (a FUSE round trip)
  std::lock_guard lock(layout_mu);
  ++changes;
  dropped = std::move(layout);
}

uint64_t spill_file::BeginWrite() {
  std::lock_guard lock(size_mu);
  ++writes_in_flight;
  return size;
}

int spill_file::EndWrite(bool ok, uint64_t end, uint64_t padded) {
  std::lock_guard lock(size_mu);
  --writes_in_flight;
  if (ok) size = std::max(size, end);
  padded_end = std::max(padded_end, padded);
  if (writes_in_flight > 0 || padded_end <= size) return 0;
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    int e = errno;  // the padding stays: the next write's end tries again
    return ok ? Fail(e, WithErrno("cannot set the size of " + path, e)) : 0;
  }
  padded_end = 0;
  return 0;
}

namespace spillfs::client {

// spill_file_open (the C ABI's): see client.h.
spill_file* OpenFile(const char* path, int flags, uint64_t size_hint) {
  auto fail = [](int rc) -> spill_file* {
    errno = -rc;
    return nullptr;
  };
  if (path == nullptr || *path == '\0') return fail(Fail(EINVAL, "empty path"));
  const int known = SPILL_FILE_READ | SPILL_FILE_WRITE | SPILL_FILE_CREATE | SPILL_FILE_TRUNCATE;
  if ((flags & ~known) != 0 || (flags & (SPILL_FILE_READ | SPILL_FILE_WRITE)) == 0) {
    return fail(Fail(EINVAL, "flags must hold SPILL_FILE_READ and/or SPILL_FILE_WRITE (and CREATE, TRUNCATE)"));
  }
  const bool writing = (flags & SPILL_FILE_WRITE) != 0;
  if (!writing && (flags & (SPILL_FILE_CREATE | SPILL_FILE_TRUNCATE)) != 0) {
    return fail(Fail(EINVAL, "SPILL_FILE_CREATE and SPILL_FILE_TRUNCATE need SPILL_FILE_WRITE"));
  }
  // Writers read too: a block a request covers only in part is completed
  // with the file's bytes.
  int oflags = (writing ? O_RDWR : O_RDONLY) | O_CLOEXEC;
  if (flags & SPILL_FILE_CREATE) oflags |= O_CREAT;
  if (flags & SPILL_FILE_TRUNCATE) oflags |= O_TRUNC;
  const std::string given = AbsolutePath(path);
  // Opened plainly first (this creates and truncates), then named by its
  // canonical path, which says which file system holds it.
  int plain = open(given.c_str(), oflags, 0644);
  if (plain < 0) {
    int e = errno;
    return fail(Fail(e, WithErrno("cannot open " + given, e)));
  }
  auto file = std::make_unique<spill_file>();
  file->fd = plain;
  file->flags = flags;
  struct stat st;
  if (fstat(plain, &st) != 0) {
    int e = errno;
    return fail(Fail(e, WithErrno("cannot stat " + given, e)));
  }
  if (!S_ISREG(st.st_mode)) return fail(Fail(S_ISDIR(st.st_mode) ? EISDIR : EINVAL, given + " is not a regular file"));
  file->size = static_cast<uint64_t>(st.st_size);
  char* real = realpath(given.c_str(), nullptr);
  if (real == nullptr) {
    int e = errno;
    return fail(Fail(e, WithErrno("cannot resolve " + given, e)));
  }
  file->path = real;
  free(real);

  FileSettings& settings = Settings();
  auto mount = spillfs::FindMountHolding(file->path);
  if (mount && mount->fstype == spillfs::control::kFsType) {
    file->mountpoint = mount->mountpoint;
    file->rel = file->path.substr(mount->mountpoint.size());
    if (file->rel.empty()) file->rel = "/";
    if (settings.direct_path.load()) {
      std::shared_ptr<spill_client> client;
      if (DirectClient(mount->mountpoint, &client) == 0) {
        file->client = std::move(client);
        file->backend = Backend::kDirectPath;
        ClearError();
        return file.release();
      }
      // Not root (the data area is root's), or no direct path: the daemon
      // moves the bytes where it offers to, else through the mount.
      ClearError();
      if (MemoryIoOffered(mount->mountpoint, &file->memory_dedup)) {
        file->backend = Backend::kMemoryIo;  // the plain descriptor names the file to the daemon
        ClearError();
        return file.release();
      }
      ClearError();
    }
    file->backend = Backend::kMount;
  } else {
    file->backend = Backend::kDirectIo;
  }
  // size_hint is not used yet: preallocating (FALLOC_FL_KEEP_SIZE) made
  // O_DIRECT writes on ext4 slower (unwritten extents converted as written).
  (void)size_hint;
  if (settings.o_direct.load()) {
    int direct = open(file->path.c_str(), (oflags & ~(O_CREAT | O_TRUNC)) | O_DIRECT);
    if (direct >= 0) {
      close(plain);
      file->fd = direct;
      file->o_direct = true;
    } else if (errno != EINVAL) {
      int e = errno;
      return fail(Fail(e, WithErrno("cannot open " + file->path + " with O_DIRECT", e)));
    }
  }
  if (!file->o_direct && file->backend == Backend::kDirectIo) file->backend = Backend::kBuffered;
  ClearError();
  return file.release();
}

}  // namespace spillfs::client
