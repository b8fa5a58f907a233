// Internal to the daemon (not installed). FuseDeviceLoop: serves a session's
// /dev/fuse requests with a pool of up to `threads` worker threads (named
// "spillfs-fuse"), each reading from its own clone of the device
// (FUSE_DEV_IOC_CLONE) into its own buffer, which holds requests of up to
// `max_request_bytes` of payload.
//
// The pool grows as libfuse's does: a worker that takes a request while no
// other is waiting in read() starts the next one (up to `threads`), and none
// ends before the loop does. So at depth 1 two workers take turns, and under
// load all of them read. Not all started at once (10ff4e4): 4 KiB reads at
// depth 1 then ran below libfuse's loop, because the kernel's wait queue is
// FIFO, so each request went to the worker that had waited longest, likely on
// a CPU asleep (docs/results.md, "FUSE transport").
//
// Why not libfuse's fuse_session_loop_mt: libfuse 3.14 receives into buffers
// of 256 pages and lowers max_write at INIT to fit, so no request carries
// more than 1 MiB, while Linux 6.12+ accepts up to fs.fuse.max_pages_limit
// pages a request. The kernel serves one large read() or write() (torch.save
// writes a tensor's storage with one write(), torch.load reads it with one
// read()) as a sequence of synchronous requests of at most that size, each a
// round trip to a worker: larger requests, fewer round trips.
//
// How: FuseDaemon routes the session's replies through Writev (libfuse's
// custom I/O), which raises max_write and max_pages in libfuse's INIT reply to
// max_request_bytes (the kernel lowers max_pages to its own limit and never
// sends more), and sends each reply to the clone its request was read from.
// That relies on every reply being sent from the thread that runs the
// request's handler, before the handler returns (true of every operation in
// fuse_ops.cc; FuseRing relies on it too). Notifications from other threads
// go to the session's own descriptor. Not used with FuseRing, which keeps
// libfuse's loop and 1 MiB requests.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "spillfs/common/mutex.h"
#include "spillfs/common/status.h"

struct fuse_session;
struct iovec;

namespace spillfs {

class FuseDeviceLoop {
 public:
  // `device_fd` is the session's /dev/fuse descriptor; `max_request_bytes` a
  // multiple of the page size.
  FuseDeviceLoop(::fuse_session* session, int device_fd, unsigned threads, size_t max_request_bytes);
  ~FuseDeviceLoop();  // stops and joins the workers
  FuseDeviceLoop(const FuseDeviceLoop&) = delete;
  FuseDeviceLoop& operator=(const FuseDeviceLoop&) = delete;

  // libfuse's custom I/O on the device: Read is never called by this loop
  // (libfuse requires one); Writev as described above.
  ssize_t Read(int fd, void* buf, size_t len);
  ssize_t Writev(int fd, iovec* iov, int count);

  // Serves requests until the filesystem is unmounted, the session is told
  // to exit (a signal: fuse_set_signal_handlers) or Stop is called.
  Status Run();
  // Makes Run return; callable from any thread.
  void Stop();

 private:
  struct Worker;

  void Serve(Worker* worker);
  // Starts the next prepared worker, if any is left and the loop goes on.
  void StartWorker();
  // Interrupts the workers' reads until every started worker has ended.
  void WakeWorkers();
  // Stops the loop, ends and joins every worker, and frees them.
  void JoinWorkers();
  bool Stopping() const;
  ssize_t ReplyToInit(int fd, iovec* iov, int count);
  // Records the loop's first fatal error (Run returns it).
  void Fail(Status status);

  ::fuse_session* const session_;
  const int device_fd_;
  const unsigned threads_;
  const size_t max_request_bytes_;
  const size_t page_bytes_;
  int stop_fd_ = -1;  // eventfd, readable once the loop stops (wakes Run)
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> init_unique_{0};  // the INIT request's, until its reply is patched
  Status failure_;                        // the first fatal error (read by Run once the workers are joined)
  std::atomic<bool> failed_{false};
  // Held while a worker's thread starts, and while the started ones are
  // woken or joined. A leaf: nothing else is taken under it.
  Mutex start_mu_;
  size_t started_ GUARDED_BY(start_mu_) = 0;  // workers_[0, started_) have a thread
  bool thread_error_logged_ GUARDED_BY(start_mu_) = false;
  std::atomic<unsigned> waiting_{0};              // workers in (or on their way into) read()
  std::vector<std::unique_ptr<Worker>> workers_;  // prepared by Run, all of them
};

}  // namespace spillfs
