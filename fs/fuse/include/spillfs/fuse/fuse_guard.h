// Internal to the daemon: the FUSE boundary, where no exception may cross.
//
// Errors below the adapter are Status values (out of memory included: the
// RAM tier's buffers and the aligned buffers answer ENOMEM), but a C++
// allocation anywhere (a std::string, a std::vector) can still throw
// std::bad_alloc. Thrown into libfuse (C), it would end the daemon and the
// mount with it. So every operation of MakeFuseOps runs inside GuardedOp,
// one wrapper for all of them: a request whose handler threw before it was
// answered is answered ENOMEM for std::bad_alloc, EIO for any other
// std::exception (logged), and the mount goes on serving.
//
// Whether the request was answered is known from the transports: every
// message they write to the kernel passes NoteFuseWrite (the custom I/O of
// fuse_daemon.cc, for the /dev/fuse loop and the ring alike), and a reply
// written on this thread since the handler started is this request's (a
// handler answers on its own thread; notifications, unique 0, do not count).
#pragma once

#ifndef FUSE_USE_VERSION
#define FUSE_USE_VERSION 314
#endif
#include <fuse3/fuse_lowlevel.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstdint>
#include <exception>
#include <new>

namespace spillfs {

// Called by the transports for every message written to the kernel.
void NoteFuseWrite(const iovec* iov, int count);
// Replies (not notifications) written by this thread so far.
uint64_t FuseRepliesOnThisThread();
// Logs an exception caught at the boundary, answered with `error`
// (rate-limited: out of memory may come again and again).
void LogEscapedException(const std::exception& e, int error);

// How a guarded operation answers a failure: fuse_reply_err, or for the
// forgets, which have no answer, fuse_reply_none.
using FailureReply = int (*)(fuse_req_t req, int error);
inline int ReplyNone(fuse_req_t req, int) {
  fuse_reply_none(req);
  return 0;
}

template <auto Op, FailureReply Reply = &fuse_reply_err>
struct GuardedOp;

template <typename... Args, void (*Op)(fuse_req_t, Args...), FailureReply Reply>
struct GuardedOp<Op, Reply> {
  static void Call(fuse_req_t req, Args... args) noexcept {
    const uint64_t replies = FuseRepliesOnThisThread();
    int error = 0;
    try {
      Op(req, args...);
      return;
    } catch (const std::bad_alloc& e) {
      error = ENOMEM;
      LogEscapedException(e, error);
    } catch (const std::exception& e) {
      error = EIO;
      LogEscapedException(e, error);
    }
    if (FuseRepliesOnThisThread() == replies) Reply(req, error);
  }
};

// The guarded form of `Op`, for a fuse_lowlevel_ops member.
template <auto Op, FailureReply Reply = &fuse_reply_err>
inline constexpr auto kGuarded = &GuardedOp<Op, Reply>::Call;

}  // namespace spillfs
