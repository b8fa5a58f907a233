#define FUSE_USE_VERSION 314
#include "spillfs/fuse/fuse_device_loop.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fuse3/fuse_lowlevel.h>
#include <linux/fuse.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <system_error>

namespace spillfs {
namespace {

// The clone of the device the current worker read its request from; -1 on
// threads that are not workers.
thread_local int t_reply_fd = -1;

// How often Run looks at the session's exit flag, which a signal sets
// without waking anyone.
constexpr int kExitPollMs = 100;

// Sent to a worker blocked in read() to end the loop: its handler does
// nothing, and without SA_RESTART the read fails with EINTR. (Blocking reads,
// not poll() on non-blocking clones: the kernel wakes one blocked reader per
// request, but every poller.)
int WakeSignal() { return SIGRTMIN + 4; }

Status InstallWakeHandler() {
  struct sigaction action {};
  action.sa_handler = [](int) {};
  sigemptyset(&action.sa_mask);
  action.sa_flags = 0;
  if (sigaction(WakeSignal(), &action, nullptr) != 0) return Status::Error(errno, "sigaction for the FUSE workers");
  return Status::OK();
}

// The worker's own mask: it may inherit one that blocks the wake signal.
void UnblockWakeSignal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, WakeSignal());
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

// A descriptor of its own on the session's connection, so the workers do not
// share one processing queue; -errno if the kernel refuses.
int CloneDevice(int device_fd) {
  int fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
  if (fd < 0) return -errno;
  uint32_t source = static_cast<uint32_t>(device_fd);
  if (ioctl(fd, FUSE_DEV_IOC_CLONE, &source) != 0) {
    int err = errno;
    close(fd);
    return -err;
  }
  return fd;
}

}  // namespace

struct FuseDeviceLoop::Worker {
  int fd = -1;
  bool owns_fd = false;  // false: the session's own descriptor
  char* buffer = nullptr;
  size_t capacity = 0;
  std::atomic<bool> in_read{false};  // the only time it may be sent the wake signal
  std::atomic<bool> done{false};
  std::thread thread;

  ~Worker() {
    if (thread.joinable()) thread.join();
    if (buffer != nullptr) munmap(buffer, capacity);
    if (owns_fd) close(fd);
  }
};

FuseDeviceLoop::FuseDeviceLoop(::fuse_session* session, int device_fd, unsigned threads, size_t max_request_bytes)
    : session_(session),
      device_fd_(device_fd),
      threads_(std::max(threads, 1u)),
      max_request_bytes_(max_request_bytes),
      page_bytes_(static_cast<size_t>(sysconf(_SC_PAGESIZE))) {
  stop_fd_ = eventfd(0, EFD_CLOEXEC);
}

FuseDeviceLoop::~FuseDeviceLoop() {
  JoinWorkers();
  if (stop_fd_ >= 0) close(stop_fd_);
}

ssize_t FuseDeviceLoop::Read(int fd, void* buf, size_t len) { return ::read(fd, buf, len); }

ssize_t FuseDeviceLoop::Writev(int fd, iovec* iov, int count) {
  const int target = t_reply_fd >= 0 ? t_reply_fd : fd;
  const auto* out = static_cast<const fuse_out_header*>(iov[0].iov_base);
  if (out->unique != 0 && out->unique == init_unique_.load(std::memory_order_acquire)) {
    return ReplyToInit(target, iov, count);
  }
  return ::writev(target, iov, count);
}

ssize_t FuseDeviceLoop::ReplyToInit(int fd, iovec* iov, int count) {
  init_unique_.store(0, std::memory_order_relaxed);
  const auto* out = static_cast<const fuse_out_header*>(iov[0].iov_base);
  if (out->error != 0) {  // libfuse refused the kernel's protocol and ends the session
    Fail(Status::Error(-out->error, "the kernel's FUSE INIT was refused"));
    return ::writev(fd, iov, count);
  }
  // Unpatched, the reply keeps OnInit's max_write, which the buffers also hold.
  if (count != 2 || iov[1].iov_len < offsetof(fuse_init_out, max_pages) + sizeof(uint16_t) ||
      iov[1].iov_len > sizeof(fuse_init_out)) {
    return ::writev(fd, iov, count);
  }
  fuse_init_out init{};
  std::memcpy(&init, iov[1].iov_base, iov[1].iov_len);
  init.max_write = static_cast<uint32_t>(max_request_bytes_);
  if (init.flags & FUSE_MAX_PAGES) init.max_pages = static_cast<uint16_t>(max_request_bytes_ / page_bytes_);
  iovec patched[2] = {iov[0], {&init, iov[1].iov_len}};
  return ::writev(fd, patched, 2);
}

void FuseDeviceLoop::Fail(Status status) {
  if (!failed_.exchange(true)) failure_ = std::move(status);
}

Status FuseDeviceLoop::Run() {
  if (stop_fd_ < 0) return Status::IOError("eventfd for the FUSE workers failed");
  // Room for the request's header and a write's argument in front of the
  // payload: the kernel refuses a read() into less than max_write + 80 bytes.
  const size_t capacity = max_request_bytes_ + page_bytes_;
  SPILLFS_RETURN_IF_ERROR(InstallWakeHandler());
  int clone_error = 0;
  for (unsigned i = 0; i < threads_; ++i) {
    auto worker = std::make_unique<Worker>();
    worker->fd = CloneDevice(device_fd_);
    worker->owns_fd = worker->fd >= 0;
    if (!worker->owns_fd) {
      clone_error = -worker->fd;
      worker->fd = device_fd_;
    }
    void* buffer = mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (buffer == MAP_FAILED) return Status::Error(errno, "mmap of a FUSE request buffer");
    worker->buffer = static_cast<char*>(buffer);
    worker->capacity = capacity;
    workers_.push_back(std::move(worker));
  }
  if (clone_error != 0) {
    fmt::print(stderr, "spillfs: cannot clone /dev/fuse ({}); the FUSE workers share one descriptor\n",
               std::strerror(clone_error));
  }
  StartWorker();
  while (!Stopping()) {
    pollfd stop = {stop_fd_, POLLIN, 0};
    (void)poll(&stop, 1, kExitPollMs);
  }
  JoinWorkers();
  if (failed_.load(std::memory_order_acquire)) return failure_;
  return Status::OK();
}

void FuseDeviceLoop::StartWorker() {
  MutexLock lock(&start_mu_);
  if (stopping_.load() || started_ == workers_.size()) return;
  Worker* worker = workers_[started_].get();
  try {
    worker->thread = std::thread([this, worker] { Serve(worker); });
  } catch (const std::system_error& e) {  // no thread to be had: serve with those there are
    if (!thread_error_logged_) fmt::print(stderr, "spillfs: cannot start a FUSE worker: {}\n", e.what());
    thread_error_logged_ = true;
    return;
  }
  ++started_;
}

void FuseDeviceLoop::JoinWorkers() {
  Stop();
  WakeWorkers();
  // Every started worker is done: none starts another.
  MutexLock lock(&start_mu_);
  workers_.clear();  // joins
  started_ = 0;
}

void FuseDeviceLoop::WakeWorkers() {
  // Only a worker in read() is sent the signal (a handler's own system calls
  // must not see EINTR), and again until each has ended: one that lands
  // after in_read is set but before the read() starts is lost. A worker sets
  // in_read before it looks at Stopping(), and Stop came first here: so each
  // either sees Stopping() or is seen in read.
  for (;;) {
    bool all_done = true;
    {
      MutexLock lock(&start_mu_);  // no worker starts meanwhile (nor after: Stop came first)
      for (size_t i = 0; i < started_; ++i) {
        Worker& worker = *workers_[i];
        if (worker.done.load()) continue;
        all_done = false;
        if (worker.in_read.load()) pthread_kill(worker.thread.native_handle(), WakeSignal());
      }
    }
    if (all_done) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void FuseDeviceLoop::Stop() {
  if (stopping_.exchange(true)) return;
  if (stop_fd_ >= 0) {
    uint64_t one = 1;
    (void)!::write(stop_fd_, &one, sizeof(one));  // wakes Run
  }
}

bool FuseDeviceLoop::Stopping() const {
  // Sequentially consistent, as WakeWorkers' reasoning needs.
  return stopping_.load() || fuse_session_exited(session_) != 0;
}

void FuseDeviceLoop::Serve(Worker* worker) {
  pthread_setname_np(pthread_self(), "spillfs-fuse");
  UnblockWakeSignal();
  t_reply_fd = worker->owns_fd ? worker->fd : -1;
  for (;;) {
    worker->in_read.store(true);
    if (Stopping()) break;
    waiting_.fetch_add(1);
    ssize_t n = ::read(worker->fd, worker->buffer, worker->capacity);
    worker->in_read.store(false);
    const bool was_last_waiting = waiting_.fetch_sub(1) == 1;
    if (n >= static_cast<ssize_t>(sizeof(fuse_in_header))) {
      if (was_last_waiting) StartWorker();  // one reader stays in read() while this one works
      const auto* in = reinterpret_cast<const fuse_in_header*>(worker->buffer);
      if (in->opcode == FUSE_INIT) init_unique_.store(in->unique, std::memory_order_release);
      fuse_buf buf{};
      buf.mem = worker->buffer;
      buf.size = static_cast<size_t>(n);
      fuse_session_process_buf(session_, &buf);
      continue;
    }
    const int err = n < 0 ? errno : EIO;
    if (err == EINTR || err == EAGAIN || err == ENOENT) continue;  // ENOENT: interrupted before it was read
    if (err == ENODEV) {  // unmounted: the connection is gone (libfuse then stops reporting failed replies)
      fuse_session_exit(session_);
    } else {
      Fail(Status::Error(err, n < 0 ? "reading a FUSE request" : "a FUSE request shorter than its header"));
    }
    break;
  }
  worker->in_read.store(false);
  t_reply_fd = -1;
  worker->done.store(true, std::memory_order_release);
  Stop();
}

}  // namespace spillfs
