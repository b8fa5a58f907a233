// Internal to the daemon (not installed). FuseRing: FUSE requests carried
// over io_uring instead of read()/writev() on /dev/fuse ("FUSE over
// io_uring", Linux 6.14+, when the fuse module's enable_uring is set), for
// libfuse 3.14, which knows only /dev/fuse.
//
// How: FuseDaemon routes the session's device I/O through Read and Writev
// (libfuse's custom I/O). Read notes whether the kernel offers the ring in its
// INIT request; Writev adds the ring to libfuse's INIT reply, and then every
// possible CPU gets a queue of ring entries (the kernel sends a request to the
// queue of the CPU its caller runs on, and waits for all queues to be
// registered before it uses any). Each entry is served by a thread pinned to
// that CPU, which waits for a request and sends the answer to the last one in
// one io_uring_enter. A request arrives split into its header, its opcode's
// argument and its payload; the thread lays the first two out in front of
// the payload, so libfuse parses the same bytes read() would have returned
// (the payload, e.g. a write's data, is not copied), and the answer, caught
// in Writev, is committed once the handler has returned: a handler may
// answer early (OnWrite does) and still be reading the request's payload.
// FORGET, INTERRUPT and requests sent before the queues are registered still
// come through /dev/fuse, served by libfuse's own loop as before;
// notifications still go to /dev/fuse.
//
// Every answer is sent from the thread that runs the handler, before the
// handler returns (true of every operation in fuse_ops.cc); a request left
// unanswered (a FORGET that came over the ring) is committed empty. An answer
// is taken as sent: a handler's check for an interrupted request (reply ==
// -ENOENT) never fires over the ring.
//
// The kernel never moves a request to another CPU's queue: an entry lost to
// an error is registered again, and a queue left with none (which would hang
// every caller on that CPU) aborts the connection instead.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "spillfs/common/mutex.h"
#include "spillfs/common/status.h"

struct fuse_session;
struct iovec;

namespace spillfs {

class FuseRing {
 public:
  struct Options {
    // Ring threads (an entry each) per online CPU; 0: at least 2, and enough
    // for `fuse_threads` in all.
    unsigned threads_per_cpu = 0;
    unsigned fuse_threads = 16;
    // The connection's number under /sys/fs/fuse/connections (to abort it);
    // "" if unknown.
    std::string connection;
  };

  // `device_fd` is the session's /dev/fuse descriptor (duplicated: the ring
  // keeps using it after libfuse closes its own at unmount).
  FuseRing(::fuse_session* session, int device_fd, Options options);
  ~FuseRing();  // Stop()
  FuseRing(const FuseRing&) = delete;
  FuseRing& operator=(const FuseRing&) = delete;

  // libfuse's custom I/O on the device (see above).
  ssize_t Read(int fd, void* buf, size_t len);
  ssize_t Writev(int fd, iovec* iov, int count);

  // Ends the ring threads: those whose entries the unmount released have
  // ended already; the others answer what they hold and end. The session
  // must outlive this call; call it after unmounting.
  void Stop();
  // Closes the ring's own descriptor of the device (after Stop).
  void CloseDevice();

  // Requests answered over the ring since mount.
  const std::atomic<uint64_t>& requests() const { return requests_; }

 private:
  struct Slot;
  struct Worker;
  enum class Start { kWaiting, kGo, kCancel };

  ssize_t ReplyToInit(int fd, iovec* iov, int count);
  Status PrepareWorkers(size_t payload_bytes);
  void StartWorkers(Start how);
  void Serve(Worker* worker);
  void Handle(Slot* slot);
  // Answers with `error` (a negative errno) and seals the answer.
  void Fail(Slot* slot, int error);
  // Makes the slot's answer `error` with no data, not yet sealed.
  void SetErrorAnswer(Slot* slot, int error);
  void SealAnswer(Slot* slot);
  ssize_t HoldAnswer(Slot* slot, const iovec* iov, int count);
  void QueueCommand(Worker* worker, Slot* slot, uint32_t command);
  // An entry is gone for good: when it was its queue's last, the callers on
  // that CPU would wait forever, so the connection is aborted.
  void LoseEntry(Slot* slot, const std::string& why);
  void AbortConnection(const std::string& why);

  ::fuse_session* const session_;
  int device_fd_;
  const Options options_;
  const size_t page_bytes_;
  int stop_fd_ = -1;  // eventfd: readable once Stop() is called
  std::atomic<uint64_t> init_unique_{0};
  std::atomic<bool> offered_{false};  // the kernel's INIT offered the ring
  std::atomic<uint64_t> requests_{0};
  size_t payload_bytes_ = 0;
  unsigned queues_ = 0;  // the kernel's: one per possible CPU
  std::vector<std::unique_ptr<Worker>> workers_;
  std::unique_ptr<std::atomic<int>[]> live_entries_;  // by queue
  // Workers are made before the INIT reply and wait here until it is sent.
  // A leaf: nothing else is taken under start_mu_.
  Mutex start_mu_;
  CondVar start_cv_{&start_mu_};
  Start start_ GUARDED_BY(start_mu_) = Start::kWaiting;
  bool stopped_ = false;
  // The slot whose request this thread is handling (Writev catches its answer).
  static thread_local Slot* serving_;
};

}  // namespace spillfs
