// IoRing: the client library's own io_uring loop (self-contained: liburing
// only). One ring per calling thread, created on first use, with a region of
// aligned bounce slots registered as a fixed buffer.
//
// RunIo() keeps up to `queue_depth` operations in flight. An operation with a
// buffer of its own (aligned by the caller) transfers straight into or out of
// it; one without borrows a slot: `fill` copies the data of a write into the
// slot before submission, and `done` sees the data of a read (or the bytes of
// a write) after completion: in completion order on the calling thread, or,
// given a TaskPool, on its threads, concurrently and in any order (so a hash
// of one completion never holds back the submission of the next I/O).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

namespace spillfs::client {

class TaskPool;

inline constexpr uint64_t kDirectAlignment = 4096;

struct IoOp {
  int fd = -1;
  bool write = false;
  uint64_t offset = 0;     // in the backing store
  uint32_t length = 0;     // multiple of kDirectAlignment
  char* buffer = nullptr;  // aligned buffer of the caller, or nullptr: bounce
  uint64_t tag = 0;        // the caller's
};

// Returns 0 or -errno; a callback's non-zero return stops the run (in-flight
// operations and callbacks are drained) and is returned as is. The error message is set
// (spill_last_error) for I/O errors; callbacks set their own.
using IoFill = std::function<int(const IoOp&, char* slot)>;
using IoDone = std::function<int(const IoOp&, const char* data)>;
int RunIo(std::span<IoOp> ops, unsigned queue_depth, uint32_t slot_bytes, const IoFill& fill, const IoDone& done,
          uint64_t* completed, TaskPool* pool = nullptr);

// Largest queue depth RunIo honours.
inline constexpr unsigned kMaxQueueDepth = 256;

// Aligned memory (mmap, huge-page advised), freed with FreeAligned.
void* AllocAligned(size_t bytes);
void FreeAligned(void* p, size_t bytes);

}  // namespace spillfs::client
