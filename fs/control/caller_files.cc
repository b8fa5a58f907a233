#include "spillfs/control/caller_files.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <sstream>
#include <utility>
#include <vector>

namespace spillfs {
namespace {

// A descriptor of the daemon's, closed at scope exit.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

// errno, read before the message is built (which may change it), with
// what failed.
template <typename... Args>
Status LastError(fmt::format_string<Args...> what, Args&&... args) {
  const int code = errno;
  return Status::Error(code,
                       fmt::format("{}: {}", fmt::format(what, std::forward<Args>(args)...), std::strerror(code)));
}

// `text` split into lines.
std::vector<std::string_view> Lines(std::string_view text) {
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    const size_t end = text.find('\n');
    lines.push_back(text.substr(0, end));
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
  return lines;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The whole of `s` as a number in `base`.
template <typename T>
std::optional<T> Number(std::string_view s, int base = 10) {
  T value{};
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value, base);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return value;
}

// The statx fields of what `fd` (O_PATH) names, without asking the file
// system (AT_STATX_DONT_SYNC: on this mount a GETATTR would be a request to
// the daemon itself); the type, inode number, device and mount id come from
// the kernel's inode and mount, not from the file system.
Result<struct statx> StatPinned(int fd, const std::string& what) {
  struct statx stx {};
  if (statx(fd, "", AT_EMPTY_PATH | AT_STATX_DONT_SYNC, STATX_TYPE | STATX_INO | STATX_MNT_ID | STATX_SIZE, &stx) !=
      0) {
    return LastError("cannot stat {}", what);
  }
  if (!(stx.stx_mask & STATX_MNT_ID)) {
    return Status::Error(ENOTSUP,
                         "the kernel gives no mount id in statx (Linux 5.8+): memory I/O cannot check "
                         "descriptors");
  }
  return stx;
}

std::string DeviceName(const struct statx& stx) { return fmt::format("{}:{}", stx.stx_dev_major, stx.stx_dev_minor); }

// The device of the kernel's internal shmem mount, where memfds live,
// learnt once from a memfd of the daemon's own. A caller's "memfd" is taken
// as one only if it lies there: telling by its file system's type (statfs)
// or anything else the file system answers would ask the file system, which
// for a FUSE file (any user may mount one) is a server that need not answer.
// Not hugetlbfs's (MFD_HUGETLB): a hole the caller punches in one gives its
// pages' reservation back, and the daemon's next touch of the mapping there
// dies of SIGBUS when the pool is empty; a shmem mapping refaults a fresh
// page instead.
std::optional<dev_t> ShmemDevice() {
  static const std::optional<dev_t> device = []() -> std::optional<dev_t> {
    Fd probe(memfd_create("spillfs-probe", MFD_CLOEXEC));
    struct stat st {};
    if (probe.get() < 0 || fstat(probe.get(), &st) != 0) return std::nullopt;
    return st.st_dev;
  }();
  return device;
}

}  // namespace

Result<FdInfo> ParseFdInfo(std::string_view text) {
  std::optional<int> flags, mnt_id;
  std::optional<uint64_t> ino;
  for (std::string_view line : Lines(text)) {
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    const std::string_view key = line.substr(0, colon), value = Trim(line.substr(colon + 1));
    if (key == "flags") flags = Number<int>(value, 8);
    if (key == "mnt_id") mnt_id = Number<int>(value);
    if (key == "ino") ino = Number<uint64_t>(value);
  }
  for (auto [name, present] : {std::pair{"flags", flags.has_value()}, std::pair{"mnt_id", mnt_id.has_value()},
                               std::pair{"ino", ino.has_value()}}) {
    if (!present) {
      return Status::Error(EIO, fmt::format("fdinfo has no readable \"{}:\" field{}", name,
                                            std::string_view(name) == "ino" ? " (Linux 5.14+)" : ""));
    }
  }
  return FdInfo{*flags, *mnt_id, *ino};
}

std::optional<MountEntry> FindMountById(std::string_view mountinfo, int mnt_id) {
  const std::string id = std::to_string(mnt_id);
  for (std::string_view line : Lines(mountinfo)) {
    if (line.size() > id.size() && line.compare(0, id.size(), id) == 0 && line[id.size()] == ' ') {
      std::istringstream in{std::string(line)};
      std::vector<MountEntry> entries = ParseMountInfo(in);
      if (entries.empty()) return std::nullopt;
      return entries.front();
    }
  }
  return std::nullopt;
}

Result<uint64_t> ParseStartTime(std::string_view stat) {
  const size_t close = stat.rfind(')');
  if (close != std::string_view::npos) {
    // After the command: field 3 (the state) onwards, space separated.
    std::istringstream fields{std::string(stat.substr(close + 1))};
    std::string field;
    for (int n = 3; fields >> field; ++n) {
      if (n == 22) {
        if (auto ticks = Number<uint64_t>(field)) return *ticks;
        break;
      }
    }
  }
  return Status::Error(EIO, "cannot read the caller's start time (field 22 of /proc/PID/stat)");
}

Result<std::optional<uint64_t>> ParseFileSizeLimit(std::string_view limits) {
  static constexpr std::string_view kName = "Max file size";
  for (std::string_view line : Lines(limits)) {
    if (line.substr(0, kName.size()) != kName) continue;
    std::istringstream fields{std::string(line.substr(kName.size()))};
    std::string soft;
    fields >> soft;
    if (soft == "unlimited") return std::optional<uint64_t>();
    if (auto bytes = Number<uint64_t>(soft)) return std::optional<uint64_t>(*bytes);
    break;
  }
  return Status::Error(EIO, "cannot read the caller's file size limit (\"Max file size\" in /proc/PID/limits)");
}

// ---- CallerMemory ----

CallerMemory::~CallerMemory() {
  if (data_ != nullptr) munmap(data_, size_);
  if (fd_ >= 0) close(fd_);
}

CallerMemory::CallerMemory(CallerMemory&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      dev_(other.dev_),
      ino_(other.ino_),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      writable_(other.writable_) {}

CallerMemory& CallerMemory::operator=(CallerMemory&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) munmap(data_, size_);
    if (fd_ >= 0) close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    dev_ = other.dev_;
    ino_ = other.ino_;
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    writable_ = other.writable_;
  }
  return *this;
}

Status CallerMemory::Map() {
  if (data_ == nullptr && size_ > 0) {
    void* data = mmap(nullptr, size_, PROT_READ | (writable_ ? PROT_WRITE : 0), MAP_SHARED, fd_, 0);
    if (data == MAP_FAILED) return LastError("cannot map the memfd ({} bytes)", size_);
    data_ = static_cast<char*>(data);
  }
  // A handle keeps no descriptor: a caller may hold any number of handles.
  if (fd_ >= 0) close(std::exchange(fd_, -1));
  return Status::OK();
}

// ---- CallerProcess ----

namespace {

// /proc/TID, O_PATH; ESRCH where the thread cannot be seen.
Result<int> OpenThreadDirectory(pid_t tid) {
  if (tid <= 0) {
    return Status::Error(ESRCH, "the daemon cannot see the caller's process (FUSE gave no pid: another pid namespace)");
  }
  const std::string path = fmt::format("/proc/{}", tid);
  const int dir = open(path.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) return dir;
  if (errno == ENOENT) return Status::Error(ESRCH, fmt::format("thread {} that wrote the request has exited", tid));
  return LastError("cannot open {}", path);
}

}  // namespace

Result<CallerThread> CallerThread::Identify(pid_t tid) {
  SPILLFS_ASSIGN_OR_RETURN(int dir, OpenThreadDirectory(tid));
  CallerThread thread;
  thread.tid = tid;
  const CallerProcess process(dir, thread);  // closes `dir`
  SPILLFS_ASSIGN_OR_RETURN(thread.start_time, process.StartTime());
  SPILLFS_ASSIGN_OR_RETURN(thread.credentials, process.Credentials());
  return thread;
}

Result<CallerProcess> CallerProcess::Open(const CallerThread& thread) {
  SPILLFS_ASSIGN_OR_RETURN(int dir, OpenThreadDirectory(thread.tid));
  CallerProcess process(dir, thread);
  // Read through the directory just opened: the task it names is the one checked.
  SPILLFS_ASSIGN_OR_RETURN(uint64_t start_time, process.StartTime());
  if (start_time != thread.start_time) {
    return Status::Error(ESRCH, fmt::format("thread {} that wrote the request has exited", thread.tid));
  }
  return process;
}

Result<uint64_t> CallerProcess::StartTime() const {
  auto stat = ReadText("stat");
  if (!stat.ok()) return stat.status().code() == ENOENT ? NotThere(stat.status()) : stat.status();
  return ParseStartTime(*stat);
}

Result<std::string> CallerProcess::Credentials() const {
  auto status = ReadText("status");
  if (!status.ok()) return status.status().code() == ENOENT ? NotThere(status.status()) : status.status();
  std::string credentials;
  for (std::string_view line : Lines(*status)) {
    for (std::string_view key :
         {"Uid:", "Gid:", "Groups:", "CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:", "NoNewPrivs:"}) {
      if (line.substr(0, key.size()) == key) credentials.append(line).push_back('\n');
    }
  }
  struct stat st {};
  if (fstatat(dir_, "", &st, AT_EMPTY_PATH) != 0) return LastError("cannot stat /proc/{}", thread_.tid);
  credentials += fmt::format("Owner: {} {}\n", st.st_uid, st.st_gid);
  return credentials;
}

Status CallerProcess::CheckCredentials() const {
  SPILLFS_ASSIGN_OR_RETURN(std::string now, Credentials());
  if (now == thread_.credentials) return Status::OK();
  return Status::Error(EPERM, fmt::format("thread {} has other credentials than when it wrote the request (it ran a "
                                          "set-user-ID or set-group-ID program, or one with file capabilities, or "
                                          "changed its ids): the descriptors it has now are not the caller's",
                                          thread_.tid));
}

CallerProcess::~CallerProcess() {
  if (dir_ >= 0) close(dir_);
}

CallerProcess::CallerProcess(CallerProcess&& other) noexcept
    : dir_(std::exchange(other.dir_, -1)), thread_(std::move(other.thread_)) {}

CallerProcess& CallerProcess::operator=(CallerProcess&& other) noexcept {
  if (this != &other) {
    if (dir_ >= 0) close(dir_);
    dir_ = std::exchange(other.dir_, -1);
    thread_ = std::move(other.thread_);
  }
  return *this;
}

Status CallerProcess::NotThere(Status missing) const {
  // Every look-up under the directory of a thread that has exited fails.
  if (faccessat(dir_, "stat", F_OK, 0) != 0 && errno == ENOENT) {
    return Status::Error(ESRCH, fmt::format("thread {} that wrote the request has exited", thread_.tid));
  }
  return missing;
}

Result<std::string> CallerProcess::ReadText(const std::string& name) const {
  Fd fd(openat(dir_, name.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return LastError("cannot open /proc/{}/{}", thread_.tid, name);
  std::string text;
  char buffer[4096];
  for (;;) {
    const ssize_t n = read(fd.get(), buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return LastError("cannot read /proc/{}/{}", thread_.tid, name);
    if (n == 0) return text;
    text.append(buffer, static_cast<size_t>(n));
  }
}

Result<uint64_t> CallerProcess::FileOnMount(int fd, Access access, std::string_view mount_device) const {
  const Status not_open =
      Status::Error(EBADF, fmt::format("fd {} is not open in the caller (thread {})", fd, thread_.tid));
  if (fd < 0) return not_open;
  // First the file itself, pinned: its inode and mount stay what they are
  // while the daemon holds `pinned`, whatever the caller does with `fd`.
  Fd pinned(openat(dir_, fmt::format("fd/{}", fd).c_str(), O_PATH | O_CLOEXEC));
  if (pinned.get() < 0) {
    if (errno == ENOENT) return NotThere(not_open);
    return LastError("cannot look at fd {} of thread {}", fd, thread_.tid);
  }
  SPILLFS_ASSIGN_OR_RETURN(struct statx stx, StatPinned(pinned.get(), fmt::format("fd {}", fd)));
  // Then its flags. Taken from a descriptor on the same mount (still alive:
  // pinned) with the same inode number, they are the flags of a descriptor
  // of this very inode, whichever one `fd` names by now.
  auto text = ReadText(fmt::format("fdinfo/{}", fd));
  if (!text.ok()) return text.status().code() == ENOENT ? NotThere(not_open) : text.status();
  SPILLFS_ASSIGN_OR_RETURN(FdInfo info, ParseFdInfo(*text));
  if (info.ino != stx.stx_ino || static_cast<uint64_t>(info.mnt_id) != stx.stx_mnt_id) {
    return Status::Error(EBADF, fmt::format("fd {} was replaced while the daemon checked it", fd));
  }
  if (info.flags & O_PATH) {
    return Status::Error(EBADF, fmt::format("fd {} is an O_PATH descriptor, open for neither reading nor writing", fd));
  }
  const int mode = info.flags & O_ACCMODE;
  if (access == Access::kWrite) {
    if (mode != O_WRONLY && mode != O_RDWR) {
      return Status::Error(EBADF, fmt::format("fd {} is not open for writing", fd));
    }
    if (info.flags & O_APPEND) {
      return Status::Error(EBADF, fmt::format("fd {} is open with O_APPEND: its writes go to the end of the file", fd));
    }
  } else if (mode != O_RDONLY && mode != O_RDWR) {
    return Status::Error(EBADF, fmt::format("fd {} is not open for reading", fd));
  }
  // Its mount as the caller sees it (any mount of this volume's FUSE
  // connection, bind mounts included, has its device), and the device of
  // the pinned inode itself.
  SPILLFS_ASSIGN_OR_RETURN(std::string mountinfo, ReadText("mountinfo"));
  const std::optional<MountEntry> mount = FindMountById(mountinfo, info.mnt_id);
  if (!mount || mount->device != mount_device || DeviceName(stx) != mount_device) {
    const std::string what = mount ? fmt::format("{} ({} on {})", mount->fstype, mount->source, mount->mountpoint)
                                   : fmt::format("device {}", DeviceName(stx));
    return Status::Error(EXDEV, fmt::format("fd {} is a file of {}, not of this spillfs mount", fd, what));
  }
  if (!S_ISREG(stx.stx_mode)) return Status::Error(EINVAL, fmt::format("fd {} is not a regular file", fd));
  return info.ino;
}

Result<CallerMemory> CallerProcess::OpenMemory(int fd) const {
  const Status not_open =
      Status::Error(EBADF, fmt::format("memfd {} is not open in the caller (thread {})", fd, thread_.tid));
  if (fd < 0) return not_open;
  // Pinned first (O_PATH opens nothing: no device, FIFO or FUSE file is
  // opened before it is known to be a memfd), then checked from the pin.
  Fd pinned(openat(dir_, fmt::format("fd/{}", fd).c_str(), O_PATH | O_CLOEXEC));
  if (pinned.get() < 0) {
    if (errno == ENOENT) return NotThere(not_open);
    return LastError("cannot look at memfd {} of thread {}", fd, thread_.tid);
  }
  SPILLFS_ASSIGN_OR_RETURN(struct statx stx, StatPinned(pinned.get(), fmt::format("memfd {}", fd)));
  if (!S_ISREG(stx.stx_mode) || ShmemDevice() != makedev(stx.stx_dev_major, stx.stx_dev_minor)) {
    return Status::Error(EINVAL,
                         fmt::format("fd {} is not a memfd of shared memory (hugetlb memfds are not taken)", fd));
  }
  char name[64] = {};
  const std::string self = fmt::format("/proc/self/fd/{}", pinned.get());
  const ssize_t length = readlink(self.c_str(), name, sizeof name - 1);
  static constexpr std::string_view kMemfdPrefix = "/memfd:";
  if (length < 0 ||
      std::string_view(name, static_cast<size_t>(length)).substr(0, kMemfdPrefix.size()) != kMemfdPrefix) {
    return Status::Error(EINVAL, fmt::format("fd {} is not a memfd (its name does not start with \"/memfd:\")", fd));
  }
  auto text = ReadText(fmt::format("fdinfo/{}", fd));
  if (!text.ok()) return text.status().code() == ENOENT ? NotThere(not_open) : text.status();
  SPILLFS_ASSIGN_OR_RETURN(FdInfo info, ParseFdInfo(*text));
  if (info.ino != stx.stx_ino || static_cast<uint64_t>(info.mnt_id) != stx.stx_mnt_id) {
    return Status::Error(EBADF, fmt::format("memfd {} was replaced while the daemon checked it", fd));
  }
  if ((info.flags & O_PATH) || (info.flags & O_ACCMODE) != O_RDWR) {
    return Status::Error(EINVAL, fmt::format("memfd {} is not open O_RDWR in the caller", fd));
  }
  // Opened for real only now, and from the pin: the same inode.
  Fd opened(open(self.c_str(), O_RDWR | O_CLOEXEC));
  if (opened.get() < 0) return LastError("cannot open memfd {}", fd);
  const int seals = fcntl(opened.get(), F_GET_SEALS);
  if (seals < 0) return Status::Error(EINVAL, fmt::format("memfd {} does not allow sealing (MFD_ALLOW_SEALING)", fd));
  if (!(seals & F_SEAL_SHRINK)) {
    return Status::Error(EINVAL, fmt::format("memfd {} is not sealed against shrinking (F_SEAL_SHRINK), which the "
                                             "daemon needs before it maps it",
                                             fd));
  }
  struct stat st {};
  if (fstat(opened.get(), &st) != 0) return LastError("cannot stat memfd {}", fd);
  CallerMemory memory;
  memory.fd_ = opened.release();
  memory.dev_ = st.st_dev;
  memory.ino_ = st.st_ino;
  memory.size_ = static_cast<uint64_t>(st.st_size);
  memory.writable_ = !(seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE));
  return memory;
}

Result<std::optional<uint64_t>> CallerProcess::FileSizeLimit() const {
  auto text = ReadText("limits");
  if (!text.ok()) return text.status().code() == ENOENT ? NotThere(text.status()) : text.status();
  return ParseFileSizeLimit(*text);
}

}  // namespace spillfs
