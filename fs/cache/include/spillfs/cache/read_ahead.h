// ReadAhead: prefetch for sequential readers of a file.
//
// FUSE hands the daemon one request at a time per reader (an O_DIRECT reader
// of 1 MiB requests waits for each), so without help the SSD sees queue
// depth 1. ReadAhead notices a reader that continues where it left off and
// fetches the next windows of the file in the background (several at once,
// each split into parallel io_uring reads by the block store), so later
// requests are answered from memory.
//
// Staleness: every window is tagged with the file's content generation when
// it was started. The Filesystem calls Invalidate(ino) after every change of
// a file's bytes or size, before it lets readers in again (the I/O lock), so a
// window started before a change never serves a read after it.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "spillfs/common/aligned_buffer.h"
#include "spillfs/common/mutex.h"
#include "spillfs/common/status.h"
#include "spillfs/common/thread_annotations.h"
#include "spillfs/kvindex/records.h"

namespace spillfs {

class ReadAhead {
 public:
  struct Options {
    uint64_t window_bytes = 4u << 20;  // one background fetch
    unsigned windows_ahead = 4;        // kept in flight ahead of the reader
    unsigned max_streams = 16;         // files followed at once (least recent dropped)
    unsigned threads = 4;              // fetch threads

    // `bytes_ahead` kept in flight ahead of each sequential reader, in
    // windows of about 4 MiB, with a fetch thread per window (a fetch waits
    // for its I/O): 0 turns read-ahead off. Where `bytes_ahead` holds
    // one `request_bytes` (the largest read the reader sends, FUSE's request
    // size), a window is a whole number of them, so that requests in step
    // with the windows are each served from one.
    static Options ForBytesAhead(uint64_t bytes_ahead, uint64_t request_bytes = uint64_t{1} << 20);
  };
  struct Stats {
    uint64_t window_bytes = 0;  // size of one window (Options), 0 with read-ahead off
    uint64_t windows_started = 0;
    uint64_t bytes_fetched = 0;
    uint64_t bytes_served = 0;  // read requests answered from windows
    // Serve calls that found a window still being fetched, and the time they
    // waited for it: the reader caught up with the SSD.
    uint64_t waits = 0;
    uint64_t wait_ns = 0;
    uint64_t windows_dropped_stale = 0;
  };
  // Reads `length` bytes of file `ino` at block-aligned `offset` into `out`
  // (Filesystem::FetchAhead: from the SSD, without the I/O lock). A window
  // is kept correct by the stream's generation, which a content change
  // (Invalidate) advances and Serve checks, not by a lock held while it
  // fills; freed blocks are not reused while a fetch may read them (the
  // reclaim gate).
  using Fetch = std::function<Status(InodeNumber ino, uint64_t offset, uint64_t length, char* out)>;

  ReadAhead(Options options, Fetch fetch);
  ~ReadAhead();  // waits for fetches in flight
  ReadAhead(const ReadAhead&) = delete;
  ReadAhead& operator=(const ReadAhead&) = delete;

  // Bytes of a window, without a copy: [data, data + length) stays valid
  // (and unchanged) while `pin` is held. Hold it only as long as the reply
  // that sends them.
  struct View {
    std::shared_ptr<const void> pin;
    const char* data = nullptr;
    uint64_t length = 0;
  };
  // [offset, offset + length) in file order, when windows of the current
  // generation hold all of it: one, or neighbours where the read straddles
  // a boundary (the kernel's read-ahead grows its requests from 32 KiB, so
  // they need not line up with windows laid out from where the stream
  // began), waiting for those in flight. Empty otherwise, also when a
  // window's fetch failed: the caller's own read then reports the error.
  // Offsets are block aligned.
  std::vector<View> Serve(InodeNumber ino, uint64_t offset, uint64_t length);
  // Notes that a read of [offset, end) was answered; a reader continuing its
  // stream gets the windows after `end` started, up to `file_end`.
  void Advance(InodeNumber ino, uint64_t offset, uint64_t end, uint64_t file_end);
  // The file's bytes or size changed: every window of it is stale.
  void Invalidate(InodeNumber ino);
  // The file is gone: drops its windows, and returns once no fetch of it is
  // still reading (a fetch pins the blocks it reads, so space freed with the
  // file would otherwise come back only when the fetch ends).
  void Forget(InodeNumber ino);

  Stats stats() const;

 private:
  // Fixed once queued but for the fields marked mu_ (ReadAhead's); `data` is
  // written by its fetch alone, without the lock, and read once `done`.
  struct Window {
    uint64_t offset = 0;
    uint64_t length = 0;
    uint64_t generation = 0;
    bool done = false;     // mu_
    bool dropped = false;  // mu_. Let go before its fetch started: not fetched
    Status status;         // mu_
    AlignedBuffer data;
  };
  struct Stream {
    uint64_t generation = 0;
    uint64_t next = 0;              // where the reader is expected next
    uint64_t fetched_to = 0;        // end of the last window started
    unsigned sequential_reads = 0;  // reads in a row that continued the stream (capped)
    std::deque<std::shared_ptr<Window>> windows;
    std::list<InodeNumber>::iterator lru;
  };
  struct Task {
    InodeNumber ino;
    std::shared_ptr<Window> window;
  };

  // The stream of `ino`, made (`*fresh`) if there was none.
  Stream& StreamFor(InodeNumber ino, bool* fresh) REQUIRES(mu_);
  void StartWindowsLocked(InodeNumber ino, Stream* stream, uint64_t file_end) REQUIRES(mu_);
  void TrimLocked(Stream* stream) REQUIRES(mu_);
  // A spare window buffer, or an empty one (the caller sizes it).
  AlignedBuffer TakeBufferLocked() REQUIRES(mu_);
  void ReturnBufferLocked(std::shared_ptr<Window> window) REQUIRES(mu_);
  void WorkerLoop();

  const Options options_;
  const Fetch fetch_;
  // How far behind where a running stream is expected a read may land and
  // still continue it. The kernel's own read-ahead (read_ahead_kb) sends
  // requests up to its window ahead of the reader, served by several threads
  // in any order: one that finishes late is not a jump back (which would drop
  // every window and start the stream again).
  const uint64_t behind_slack_;
  // A leaf in the lock order (filesystem.h): fetches run without it.
  mutable Mutex mu_;
  CondVar work_{&mu_};      // tasks_ non-empty or stopping_
  CondVar finished_{&mu_};  // a window became done
  std::unordered_map<InodeNumber, Stream> streams_ GUARDED_BY(mu_);
  std::list<InodeNumber> lru_ GUARDED_BY(mu_);  // most recent first
  std::deque<Task> tasks_ GUARDED_BY(mu_);
  std::unordered_map<InodeNumber, unsigned> fetching_ GUARDED_BY(mu_);  // fetches running, by file
  std::vector<AlignedBuffer> spare_ GUARDED_BY(mu_);  // window buffers to reuse (no fresh page faults)
  Stats stats_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace spillfs
