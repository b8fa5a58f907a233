#include "spillfs/cache/read_ahead.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "spillfs/common/rounding.h"

namespace spillfs {
namespace {

// A read this close to where the stream is expected still continues it:
// the kernel's own read-ahead sends neighbouring requests out of order.
constexpr uint64_t kSequentialSlack = 4u << 20;
// Reads in a row, each where the last ended, before a stream is fetched for.
constexpr unsigned kReadsToStart = 2;

}  // namespace

ReadAhead::Options ReadAhead::Options::ForBytesAhead(uint64_t bytes_ahead, uint64_t request_bytes) {
  Options options;
  if (bytes_ahead == 0) {
    options.windows_ahead = 0;
    options.threads = 0;
    return options;
  }
  constexpr uint64_t kBlock = 4096;
  const uint64_t windows = DivideRoundingUp(bytes_ahead, options.window_bytes);
  options.window_bytes = RoundUp(DivideRoundingUp(bytes_ahead, windows), kBlock);
  // Whole requests, where the reader is to be kept ahead of by one at least
  // (less still serves smaller reads).
  const uint64_t request = RoundUp(std::max(request_bytes, kBlock), kBlock);
  if (bytes_ahead >= request) options.window_bytes = RoundUp(std::max(options.window_bytes, request), request);
  options.windows_ahead = static_cast<unsigned>(DivideRoundingUp(bytes_ahead, options.window_bytes));
  options.threads = std::max(options.threads, options.windows_ahead);
  return options;
}

ReadAhead::ReadAhead(Options options, Fetch fetch)
    : options_(options),
      fetch_(std::move(fetch)),
      behind_slack_(std::max<uint64_t>(kSequentialSlack, options.windows_ahead * options.window_bytes)) {
  for (unsigned i = 0; i < options_.threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ReadAhead::~ReadAhead() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  work_.SignalAll();
  for (std::thread& t : workers_) t.join();
}

ReadAhead::Stream& ReadAhead::StreamFor(InodeNumber ino, bool* fresh) {
  auto [it, created] = streams_.try_emplace(ino);
  *fresh = created;
  if (created) {
    lru_.push_front(ino);
    it->second.lru = lru_.begin();
    if (streams_.size() > options_.max_streams) {
      InodeNumber oldest = lru_.back();
      lru_.pop_back();
      Stream& victim = streams_.at(oldest);
      for (auto& w : victim.windows) ReturnBufferLocked(std::move(w));
      streams_.erase(oldest);
    }
  } else {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
  }
  return it->second;
}

std::vector<ReadAhead::View> ReadAhead::Serve(InodeNumber ino, uint64_t offset, uint64_t length) {
  MutexLock lock(&mu_);
  auto it = streams_.find(ino);
  if (it == streams_.end()) return {};
  const uint64_t generation = it->second.generation;
  const uint64_t end = offset + length;
  // The windows that tile [offset, end), kept alive while we wait.
  std::vector<std::shared_ptr<Window>> covering;
  for (uint64_t at = offset; at < end;) {
    std::shared_ptr<Window> holder;
    for (const std::shared_ptr<Window>& w : it->second.windows) {
      if (w->generation == generation && w->offset <= at && at < w->offset + w->length) holder = w;
    }
    if (holder == nullptr) return {};
    at = holder->offset + holder->length;
    covering.push_back(std::move(holder));
  }
  auto all_done = [&] { return std::all_of(covering.begin(), covering.end(), [](const auto& w) { return w->done; }); };
  if (!all_done()) {
    const auto started = std::chrono::steady_clock::now();
    while (!all_done()) finished_.Wait();
    ++stats_.waits;
    stats_.wait_ns += static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - started).count());
  }
  // Invalidated while we waited: the bytes may be older than a change the
  // caller's I/O lock already lets it see; read them again.
  auto now = streams_.find(ino);
  if (now == streams_.end() || now->second.generation != generation) return {};
  std::vector<View> views;
  for (std::shared_ptr<Window>& w : covering) {
    if (!w->status.ok()) return {};
    const uint64_t from = std::max(offset, w->offset);
    const uint64_t to = std::min(end, w->offset + w->length);
    // A pinned window is never recycled (ReturnBufferLocked) nor written again.
    const char* data = w->data.data() + (from - w->offset);
    views.push_back(View{std::move(w), data, to - from});
  }
  stats_.bytes_served += length;
  return views;
}

void ReadAhead::Advance(InodeNumber ino, uint64_t offset, uint64_t end, uint64_t file_end) {
  MutexLock lock(&mu_);
  bool fresh = false;
  Stream& stream = StreamFor(ino, &fresh);
  // A stream is believed only after kReadsToStart reads each starting exactly
  // where the last ended: random readers whose reads happen to land close
  // together fetch nothing. Once it runs, the kernel's out-of-order requests
  // still continue it: up to behind_slack_ behind the expected place, and
  // ahead of it up to what has been fetched (or kSequentialSlack).
  const bool running = stream.sequential_reads >= kReadsToStart;
  bool continues = running ? offset + behind_slack_ >= stream.next &&
                                 offset <= std::max(stream.next + kSequentialSlack, stream.fetched_to)
                           : offset == stream.next && (!fresh || offset == 0);
  if (!continues) {
    // A jump: follow from here; what was fetched for the old place is dropped.
    for (auto& w : stream.windows) ReturnBufferLocked(std::move(w));
    stream.windows.clear();
    stream.next = stream.fetched_to = end;
    stream.sequential_reads = 1;
    return;
  }
  stream.next = std::max(stream.next, end);
  if (stream.sequential_reads < kReadsToStart) ++stream.sequential_reads;
  if (stream.sequential_reads < kReadsToStart) return;
  TrimLocked(&stream);
  StartWindowsLocked(ino, &stream, file_end);
}

void ReadAhead::StartWindowsLocked(InodeNumber ino, Stream* stream, uint64_t file_end) {
  stream->fetched_to = std::max(stream->fetched_to, stream->next);
  const uint64_t horizon = std::min(file_end, stream->next + options_.windows_ahead * options_.window_bytes);
  while (stream->fetched_to < horizon && stream->windows.size() < options_.windows_ahead + 2) {
    // Read-ahead is an offer: with no memory for a window, readers read for
    // themselves.
    AlignedBuffer buffer = TakeBufferLocked();
    if (!buffer.Resize(options_.window_bytes).ok()) break;
    auto window = std::make_shared<Window>();
    window->offset = stream->fetched_to;
    window->length = std::min(options_.window_bytes, horizon - stream->fetched_to);
    window->generation = stream->generation;
    window->data = std::move(buffer);
    (void)window->data.Resize(window->length);  // no larger: cannot fail
    stream->fetched_to += window->length;
    stream->windows.push_back(window);
    tasks_.push_back(Task{ino, std::move(window)});
    ++stats_.windows_started;
    work_.Signal();
  }
}

void ReadAhead::TrimLocked(Stream* stream) {
  // Windows wholly behind the reader (with slack for out-of-order requests)
  // or of an older generation are done with.
  auto& windows = stream->windows;
  for (auto it = windows.begin(); it != windows.end();) {
    const Window& w = **it;
    bool behind = w.offset + w.length + kSequentialSlack <= stream->next;
    bool stale = w.generation != stream->generation;
    if (behind || stale) {
      if (stale) ++stats_.windows_dropped_stale;
      ReturnBufferLocked(std::move(*it));
      it = windows.erase(it);
    } else {
      ++it;
    }
  }
}

void ReadAhead::Invalidate(InodeNumber ino) {
  MutexLock lock(&mu_);
  auto it = streams_.find(ino);
  if (it == streams_.end()) return;
  Stream& stream = it->second;
  ++stream.generation;
  stream.fetched_to = stream.next;
  TrimLocked(&stream);
}

void ReadAhead::Forget(InodeNumber ino) {
  MutexLock lock(&mu_);
  auto it = streams_.find(ino);
  if (it == streams_.end()) return;
  for (auto& w : it->second.windows) ReturnBufferLocked(std::move(w));
  lru_.erase(it->second.lru);
  streams_.erase(it);
  // Queued fetches of it will find no stream and read nothing; wait for the
  // running ones.
  while (fetching_.find(ino) != fetching_.end()) finished_.Wait();
}

AlignedBuffer ReadAhead::TakeBufferLocked() {
  if (spare_.empty()) return AlignedBuffer();
  AlignedBuffer buffer = std::move(spare_.back());
  spare_.pop_back();
  return buffer;
}

void ReadAhead::ReturnBufferLocked(std::shared_ptr<Window> window) {
  window->dropped = true;  // a fetch not yet started skips it
  // A window still being fetched keeps its buffer; it is freed with the
  // window when the worker lets go of it.
  if (!window->done || window.use_count() > 1) return;
  if (spare_.size() < options_.max_streams) spare_.push_back(std::move(window->data));
}

void ReadAhead::WorkerLoop() {
  pthread_setname_np(pthread_self(), "spillfs-ahead");
  MutexLock lock(&mu_);
  while (true) {
    while (!stopping_ && tasks_.empty()) work_.Wait();
    if (stopping_) return;
    Task task = std::move(tasks_.front());
    tasks_.pop_front();
    Window& w = *task.window;
    bool wanted = false;
    if (auto it = streams_.find(task.ino); it != streams_.end()) {
      wanted = it->second.generation == w.generation && !w.dropped;
    }
    Status s = Status::Error(ESTALE, "stale before its fetch started");
    if (wanted) {
      ++fetching_[task.ino];
      lock.Unlock();
      s = fetch_(task.ino, w.offset, w.length, w.data.data());
      lock.Lock();
      if (--fetching_[task.ino] == 0) fetching_.erase(task.ino);
    }
    w.status = s;
    w.done = true;
    if (s.ok()) stats_.bytes_fetched += w.length;
    finished_.SignalAll();
  }
}

ReadAhead::Stats ReadAhead::stats() const {
  MutexLock lock(&mu_);
  Stats stats = stats_;
  stats.window_bytes = options_.windows_ahead == 0 ? 0 : options_.window_bytes;
  return stats;
}

}  // namespace spillfs
