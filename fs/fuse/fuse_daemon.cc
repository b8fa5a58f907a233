#define FUSE_USE_VERSION 314
#include "spillfs/fuse/fuse_daemon.h"

#include <fmt/format.h>
#include <fuse3/fuse_lowlevel.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <vector>

#include "fuse_ops.h"
#include "fuse_ring.h"
#include "spillfs/common/mountinfo.h"
#include "spillfs/fuse/fuse_device_loop.h"
#include "spillfs/fuse/fuse_guard.h"

namespace spillfs {
namespace {

// The bdi starts with the kernel's default read-ahead, and INIT can only
// lower it (to max_readahead): so it is set before INIT. Best effort: needs
// root and sysfs.
void SetKernelReadAhead(const std::string& device, unsigned kib) {
  std::ofstream knob("/sys/class/bdi/" + device + "/read_ahead_kb");
  knob << kib;
  knob.flush();
  if (!knob) fmt::print(stderr, "spillfs: cannot set the kernel's read-ahead of bdi {} (needs root)\n", device);
}

// The kernel sends requests of at most fs.fuse.max_pages_limit pages (Linux
// 6.12+; 256 before, where the knob is missing). Where that is less than
// `wanted`, *note says so.
size_t KernelRequestBytes(size_t wanted, std::string* note) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size_t limit_pages = 0;
  if (!(std::ifstream("/proc/sys/fs/fuse/max_pages_limit") >> limit_pages) || limit_pages == 0) limit_pages = 256;
  const size_t limit = limit_pages * page;
  if (wanted <= limit) return wanted;
  if (note == nullptr) return limit;
  *note = fmt::format(
      "spillfs: the kernel sends FUSE requests of at most {} KiB (fs.fuse.max_pages_limit = {}); --max-request {} "
      "KiB needs {} pages\n",
      limit >> 10, limit_pages, wanted >> 10, wanted / page);
  return limit;
}

}  // namespace

size_t FuseDaemon::RequestBytesFor(const FuseOptions& options, std::string* note) {
  return options.fuse_uring ? kLibfuseMaxRequestBytes : KernelRequestBytes(options.max_request_bytes, note);
}

FuseDaemon::FuseDaemon(std::unique_ptr<Filesystem> fs, FuseOptions options)
    : fs_(std::move(fs)),
      control_(std::make_unique<ControlPlane>(fs_.get())),
      handles_(std::make_unique<FuseHandles>()),
      options_(std::move(options)) {}

FuseDaemon::~FuseDaemon() {
  if (session_ != nullptr) {
    if (mounted_) fuse_session_unmount(session_);  // ends the ring's entries
    if (ring_) {
      ring_->Stop();         // its threads run requests in session_
      ring_->CloseDevice();  // the last descriptor of a connection still alive (lazy unmount) ends it
    }
    fuse_remove_signal_handlers(session_);
    fuse_session_destroy(session_);
  }
  device_loop_.reset();  // after the session, whose custom I/O it is
  // No request runs any more: what open files and directories still hold
  // goes (control-plane handles go with control_, before fs_).
  handles_.reset();
}

Status FuseDaemon::Mount() {
  std::string opts = "default_permissions,subtype=spillfs,fsname=" + options_.fsname;
  if (!options_.extra_options.empty()) opts += "," + options_.extra_options;
  std::vector<std::string> argv_strings = {"spillfs", "-o", opts};
  if (options_.debug) argv_strings.push_back("-d");
  std::vector<char*> argv;
  for (auto& s : argv_strings) argv.push_back(s.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
  static const fuse_lowlevel_ops ops = MakeFuseOps();
  session_ = fuse_session_new(&args, &ops, sizeof(ops), this);
  fuse_opt_free_args(&args);
  if (session_ == nullptr) return Status::Invalid(fmt::format("FUSE rejected the mount options '{}'", opts));
  if (fuse_set_signal_handlers(session_) != 0) return Status::IOError("cannot install signal handlers");
  control_->SetInvalidator([session = session_](InodeNumber ino) {
    fuse_lowlevel_notify_inval_inode(session, ino, 0, 0);  // drop stale pages and attributes
  });
  if (fuse_session_mount(session_, options_.mountpoint.c_str()) != 0) {
    return Status::IOError(fmt::format("cannot mount on {} (is /dev/fuse available?)", options_.mountpoint));
  }
  mounted_ = true;
  // Resolved now, while the path surely names this mount.
  // (The major:minor names its bdi; the minor is the FUSE connection.)
  auto mount = FindMountAt(options_.mountpoint);
  device_ = mount ? mount->device : "";
  control_->SetMountDevice(device_);  // memory I/O takes only files of this mount
  request_bytes_ = RequestBytesFor(options_, &request_note_);
  if (!device_.empty()) SetKernelReadAhead(device_, static_cast<unsigned>(request_bytes_ >> 10));
  if (options_.fuse_uring) return RouteThroughRing();
  return RouteThroughDeviceLoop();
}

namespace {

// FUSE over io_uring (fuse_ring.h): the device I/O goes through the ring.
ssize_t RingRead(int fd, void* buf, size_t len, void* userdata) {
  return static_cast<FuseDaemon*>(userdata)->ring()->Read(fd, buf, len);
}

ssize_t RingWritev(int fd, iovec* iov, int count, void* userdata) {
  NoteFuseWrite(iov, count);
  return static_cast<FuseDaemon*>(userdata)->ring()->Writev(fd, iov, count);
}

ssize_t LoopRead(int fd, void* buf, size_t len, void* userdata) {
  return static_cast<FuseDaemon*>(userdata)->device_loop()->Read(fd, buf, len);
}

ssize_t LoopWritev(int fd, iovec* iov, int count, void* userdata) {
  NoteFuseWrite(iov, count);
  return static_cast<FuseDaemon*>(userdata)->device_loop()->Writev(fd, iov, count);
}

}  // namespace

Status FuseDaemon::RouteThroughDeviceLoop() {
  const int fd = fuse_session_fd(session_);
  device_loop_ = std::make_unique<FuseDeviceLoop>(session_, fd, options_.max_threads, request_bytes_);
  const fuse_custom_io io = {LoopWritev, LoopRead, nullptr, nullptr};
  if (int rc = fuse_session_custom_io(session_, &io, fd); rc != 0) {
    return Status::Error(-rc, "cannot route FUSE replies through the device loop");
  }
  return Status::OK();
}

Status FuseDaemon::RouteThroughRing() {
  const int fd = fuse_session_fd(session_);
  FuseRing::Options ring_options;
  ring_options.threads_per_cpu = options_.ring_threads_per_cpu;
  ring_options.fuse_threads = options_.max_threads;
  ring_options.connection = device_.empty() ? "" : device_.substr(device_.find(':') + 1);
  ring_ = std::make_unique<FuseRing>(session_, fd, ring_options);
  const fuse_custom_io io = {RingWritev, RingRead, nullptr, nullptr};
  if (int rc = fuse_session_custom_io(session_, &io, fd); rc != 0) {
    return Status::Error(-rc, "cannot route FUSE requests through io_uring");
  }
  control_->SetFuseRingRequests(&ring_->requests());
  return Status::OK();
}

Status FuseDaemon::Run() {
  // Here, not in Mount: a background daemon's log is set up in between.
  if (!request_note_.empty()) fmt::print(stderr, "{}", request_note_);
  if (device_loop_) return device_loop_->Run();
  fuse_loop_config* config = fuse_loop_cfg_create();
  fuse_loop_cfg_set_max_threads(config, options_.max_threads);
  fuse_loop_cfg_set_idle_threads(config, options_.max_threads);
  fuse_loop_cfg_set_clone_fd(config, 1);  // a /dev/fuse fd per worker: no contention on one queue
  int rc = fuse_session_loop_mt(session_, config);
  fuse_loop_cfg_destroy(config);
  if (rc < 0) return Status::Error(-rc, "FUSE session loop failed");
  return Status::OK();
}

}  // namespace spillfs
