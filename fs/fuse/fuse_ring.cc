#define FUSE_USE_VERSION 314
#include "fuse_ring.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fuse3/fuse_lowlevel.h>
#include <liburing.h>
#include <linux/fuse.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <system_error>

#include "spillfs/common/rounding.h"

namespace spillfs {
namespace {

// The ring's part of the FUSE protocol (include/uapi/linux/fuse.h, 7.42; not
// in Debian 12's headers, which stop at 7.38).
constexpr uint64_t kFuseOverIoUring = 1ull << 41;
constexpr uint32_t kCommandRegister = 1;
constexpr uint32_t kCommandCommitAndFetch = 2;

struct RingEntryInOut {
  uint64_t flags;
  uint64_t commit_id;  // the request's unique
  uint32_t payload_sz;
  uint32_t padding;
  uint64_t reserved;
};

struct RingRequestHeader {
  char in_out[128];  // fuse_in_header in, fuse_out_header back
  char op_in[128];   // the opcode's first argument
  RingEntryInOut ring_ent_in_out;
};

struct RingCommand {  // in the 80-byte command area of a 128-byte SQE
  uint64_t flags;
  uint64_t commit_id;
  uint16_t qid;
  uint8_t padding[6];
};

static_assert(sizeof(RingEntryInOut) == 32);
static_assert(sizeof(RingRequestHeader) == 288);
static_assert(sizeof(RingCommand) == 24);
static_assert(offsetof(fuse_init_out, flags2) == 32);

constexpr uint64_t kStopTag = 1;  // user_data of the poll on stop_fd_
// Room in front of a payload for the request's header and first argument.
constexpr size_t kHeadroom = 4096;
// A slot whose entry the kernel dropped after an error (a refused commit or
// register) is registered again this many times in a row (no request
// delivered in between) before it is given up.
constexpr int kMaxRegisterRetries = 3;

// CPUs in a sysfs list such as "0-3,8,10-11".
std::set<unsigned> ReadCpuList(const std::string& path) {
  std::set<unsigned> cpus;
  std::ifstream file(path);
  std::string list;
  if (!std::getline(file, list)) return cpus;
  size_t at = 0;
  while (at < list.size()) {
    size_t comma = list.find(',', at);
    std::string range = list.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    unsigned first = 0, last = 0;
    if (std::sscanf(range.c_str(), "%u-%u", &first, &last) == 2) {
      for (unsigned cpu = first; cpu <= last; ++cpu) cpus.insert(cpu);
    } else if (std::sscanf(range.c_str(), "%u", &first) == 1) {
      cpus.insert(first);
    }
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return cpus;
}

// A cleared 128-byte SQE. Each worker's ring has an SQE for every slot and
// one for the stop poll, so it is never full.
io_uring_sqe* ClearedSqe(io_uring* ring) {
  io_uring_sqe* sqe = io_uring_get_sqe(ring);
  if (sqe == nullptr) {
    io_uring_submit(ring);
    sqe = io_uring_get_sqe(ring);
    if (sqe == nullptr) std::abort();
  }
  std::memset(sqe, 0, 2 * sizeof(io_uring_sqe));
  return sqe;
}

}  // namespace

// One ring entry: its header page, then kHeadroom bytes that are ours, then
// the payload the kernel fills (mapped lazily: untouched pages cost nothing).
struct FuseRing::Slot {
  uint16_t qid = 0;
  char* mapping = nullptr;
  size_t mapping_bytes = 0;
  RingRequestHeader* header = nullptr;
  char* payload = nullptr;
  iovec iov[2]{};
  int register_retries = 0;
  // The request being served and its answer.
  uint64_t unique = 0;  // 0: not yet registered (or registered again)
  bool request_has_payload = false;
  bool answered = false;
  int32_t error = 0;
  uint32_t answer_bytes = 0;
  bool answer_aside = false;  // in `aside`, not yet in the payload
  std::vector<char> aside;

  ~Slot() {
    if (mapping != nullptr) munmap(mapping, mapping_bytes);
  }
};

struct FuseRing::Worker {
  int cpu = -1;  // pinned to it; -1: not pinned
  io_uring ring{};
  bool ring_ready = false;
  std::vector<std::unique_ptr<Slot>> slots;
  std::thread thread;

  ~Worker() {
    if (thread.joinable()) thread.join();
    if (ring_ready) io_uring_queue_exit(&ring);
  }
};

thread_local FuseRing::Slot* FuseRing::serving_ = nullptr;

FuseRing::FuseRing(::fuse_session* session, int device_fd, Options options)
    : session_(session),
      device_fd_(fcntl(device_fd, F_DUPFD_CLOEXEC, 0)),
      options_(std::move(options)),
      page_bytes_(static_cast<size_t>(sysconf(_SC_PAGESIZE))) {
  stop_fd_ = eventfd(0, EFD_CLOEXEC);
}

FuseRing::~FuseRing() {
  Stop();
  if (stop_fd_ >= 0) close(stop_fd_);
  CloseDevice();
}

ssize_t FuseRing::Read(int fd, void* buf, size_t len) {
  ssize_t n = ::read(fd, buf, len);
  if (n < static_cast<ssize_t>(sizeof(fuse_in_header) + offsetof(fuse_init_in, flags2) + sizeof(uint32_t))) return n;
  const auto* in = static_cast<const fuse_in_header*>(buf);
  if (in->opcode != FUSE_INIT) return n;
  fuse_init_in init;
  std::memcpy(&init, static_cast<const char*>(buf) + sizeof(fuse_in_header),
              std::min(sizeof(init), static_cast<size_t>(n) - sizeof(fuse_in_header)));
  uint64_t flags = init.flags;
  if (flags & FUSE_INIT_EXT) flags |= static_cast<uint64_t>(init.flags2) << 32;
  const bool offered = (flags & kFuseOverIoUring) != 0;
  offered_.store(offered, std::memory_order_relaxed);
  init_unique_.store(in->unique, std::memory_order_release);
  if (!offered) {
    fmt::print(stderr,
               "spillfs: --fuse-uring: the kernel does not offer FUSE over io_uring (Linux 6.14+ with "
               "/sys/module/fuse/parameters/enable_uring set to Y); serving /dev/fuse\n");
  }
  return n;
}

ssize_t FuseRing::Writev(int fd, iovec* iov, int count) {
  const auto* out = static_cast<const fuse_out_header*>(iov[0].iov_base);
  if (Slot* slot = serving_; slot != nullptr && out->unique == slot->unique && !slot->answered) {
    return HoldAnswer(slot, iov, count);
  }
  if (out->unique != 0 && out->unique == init_unique_.load(std::memory_order_acquire)) {
    return ReplyToInit(fd, iov, count);
  }
  // A notification from a ring thread may come while libfuse closes its own
  // descriptor at unmount (and the number is reused): ours stays open.
  return ::writev(serving_ != nullptr && device_fd_ >= 0 ? device_fd_ : fd, iov, count);
}

ssize_t FuseRing::ReplyToInit(int fd, iovec* iov, int count) {
  init_unique_.store(0, std::memory_order_relaxed);
  const auto* out = static_cast<const fuse_out_header*>(iov[0].iov_base);
  if (!offered_.load(std::memory_order_relaxed) || out->error != 0 || count != 2 ||
      iov[1].iov_len < offsetof(fuse_init_out, flags2) + 4) {
    return ::writev(fd, iov, count);
  }
  fuse_init_out init{};
  std::memcpy(&init, iov[1].iov_base, std::min(sizeof(init), iov[1].iov_len));
  // The payload the kernel will ask each entry to hold (fuse_uring_create).
  const uint64_t max_pages = (init.flags & FUSE_MAX_PAGES) ? std::max<uint16_t>(init.max_pages, 1) : 32;
  const size_t payload_bytes = RoundUp(
      std::max<uint64_t>({8192, std::max<uint32_t>(init.max_write, 4096), max_pages * page_bytes_}), page_bytes_);
  if (Status prepared = PrepareWorkers(payload_bytes); !prepared.ok()) {
    StartWorkers(Start::kCancel);
    fmt::print(stderr, "spillfs: --fuse-uring: cannot set up the io_uring rings ({}); serving /dev/fuse\n",
               prepared.ToString());
    return ::writev(fd, iov, count);
  }
  init.flags |= FUSE_INIT_EXT;
  init.flags2 |= static_cast<uint32_t>(kFuseOverIoUring >> 32);
  iovec patched[2] = {iov[0], {&init, iov[1].iov_len}};
  ssize_t n = ::writev(fd, patched, 2);
  if (n < 0) {
    int saved = errno;
    StartWorkers(Start::kCancel);
    errno = saved;
    return n;
  }
  // The kernel is initialized once the reply is written: entries may register.
  StartWorkers(Start::kGo);
  fmt::print(stderr, "spillfs: FUSE over io_uring: {} queues, {} ring threads, {} KiB per entry\n", queues_,
             workers_.size(), payload_bytes / 1024);
  return n;
}

void FuseRing::StartWorkers(Start how) {
  {
    MutexLock lock(&start_mu_);
    start_ = how;
  }
  start_cv_.SignalAll();
  if (how == Start::kCancel) workers_.clear();  // joins the threads
}

Status FuseRing::PrepareWorkers(size_t payload_bytes) {
  if (stop_fd_ < 0 || device_fd_ < 0) return Status::IOError("eventfd or dup failed");
  payload_bytes_ = payload_bytes;
  const std::set<unsigned> possible = ReadCpuList("/sys/devices/system/cpu/possible");
  const std::set<unsigned> online = ReadCpuList("/sys/devices/system/cpu/online");
  if (possible.empty() || online.empty()) return Status::IOError("cannot read the CPU lists in /sys");
  // The kernel has a queue for each possible CPU, numbered 0..n-1, and sends
  // a request to the queue of the CPU its caller runs on (queue 0 for a CPU
  // numbered n or more, where the possible CPUs are not 0..n-1).
  const unsigned queues = static_cast<unsigned>(possible.size());
  queues_ = queues;
  live_entries_ = std::make_unique<std::atomic<int>[]>(queues);
  unsigned per_cpu = options_.threads_per_cpu;
  if (per_cpu == 0) {
    per_cpu = std::max<unsigned>(2, static_cast<unsigned>(DivideRoundingUp(options_.fuse_threads, online.size())));
  }
  auto new_slot = [&](unsigned qid) -> Result<std::unique_ptr<Slot>> {
    auto slot = std::make_unique<Slot>();
    slot->qid = static_cast<uint16_t>(qid);
    slot->mapping_bytes = page_bytes_ + kHeadroom + payload_bytes;
    void* mapping =
        mmap(nullptr, slot->mapping_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mapping == MAP_FAILED) return Status::Error(errno, "mmap of a ring entry");
    slot->mapping = static_cast<char*>(mapping);
    slot->header = reinterpret_cast<RingRequestHeader*>(slot->mapping);
    slot->payload = slot->mapping + page_bytes_ + kHeadroom;
    slot->iov[0] = {slot->header, sizeof(RingRequestHeader)};
    slot->iov[1] = {slot->payload, payload_bytes};
    live_entries_[qid].fetch_add(1, std::memory_order_relaxed);
    return slot;
  };
  auto add_pinned = [&](unsigned qid, unsigned cpu) -> Status {
    for (unsigned i = 0; i < per_cpu; ++i) {
      auto worker = std::make_unique<Worker>();
      worker->cpu = static_cast<int>(cpu);
      SPILLFS_ASSIGN_OR_RETURN(auto slot, new_slot(qid));
      worker->slots.push_back(std::move(slot));
      workers_.push_back(std::move(worker));
    }
    return Status::OK();
  };
  std::unique_ptr<Worker> offline;  // one worker holds an entry for every offline CPU's queue
  for (unsigned qid = 0; qid < queues; ++qid) {
    if (online.count(qid)) {
      SPILLFS_RETURN_IF_ERROR(add_pinned(qid, qid));
      continue;
    }
    if (!offline) offline = std::make_unique<Worker>();
    SPILLFS_ASSIGN_OR_RETURN(auto slot, new_slot(qid));
    offline->slots.push_back(std::move(slot));
  }
  for (unsigned cpu : online) {
    if (cpu >= queues) SPILLFS_RETURN_IF_ERROR(add_pinned(0, cpu));
  }
  if (offline) workers_.push_back(std::move(offline));
  for (auto& worker : workers_) {
    io_uring_params params{};
    params.flags = IORING_SETUP_SQE128;
    const unsigned entries = static_cast<unsigned>(worker->slots.size()) + 1;  // + the poll on stop_fd_
    if (int rc = io_uring_queue_init_params(entries, &worker->ring, &params); rc < 0) {
      return Status::Error(-rc, "io_uring_queue_init");
    }
    worker->ring_ready = true;
  }
  // Threads now, so that none is missing once the kernel has taken the ring.
  try {
    for (auto& worker : workers_) worker->thread = std::thread([this, w = worker.get()] { Serve(w); });
  } catch (const std::system_error& e) {
    return Status::Error(e.code().value(), "cannot start the ring threads");
  }
  return Status::OK();
}

void FuseRing::QueueCommand(Worker* worker, Slot* slot, uint32_t command) {
  io_uring_sqe* sqe = ClearedSqe(&worker->ring);
  sqe->opcode = IORING_OP_URING_CMD;
  sqe->fd = device_fd_;
  sqe->cmd_op = command;
  if (command == kCommandRegister) {
    slot->unique = 0;
    sqe->addr = reinterpret_cast<uint64_t>(slot->iov);
    sqe->len = 2;
  }
  auto* request = reinterpret_cast<RingCommand*>(sqe->cmd);
  request->qid = slot->qid;
  request->commit_id = command == kCommandCommitAndFetch ? slot->unique : 0;
  io_uring_sqe_set_data(sqe, slot);
}

void FuseRing::Serve(Worker* worker) {
  {
    MutexLock lock(&start_mu_);
    while (start_ == Start::kWaiting) start_cv_.Wait();
    if (start_ == Start::kCancel) return;
  }
  pthread_setname_np(pthread_self(), "spillfs-ring");
  if (worker->cpu >= 0) {
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    CPU_SET(worker->cpu, &cpus);
    pthread_setaffinity_np(pthread_self(), sizeof(cpus), &cpus);  // best effort
  }
  for (auto& slot : worker->slots) QueueCommand(worker, slot.get(), kCommandRegister);
  io_uring_sqe* poll = ClearedSqe(&worker->ring);
  io_uring_prep_poll_add(poll, stop_fd_, POLLIN);
  poll->user_data = kStopTag;
  size_t live = worker->slots.size();
  bool stopping = false;
  while (live > 0 && !stopping) {
    int rc = io_uring_submit_and_wait(&worker->ring, 1);
    if (rc == -EINTR) continue;
    if (rc == -EAGAIN || rc == -EBUSY || rc == -ENOMEM) {  // short of resources: again shortly
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    if (rc < 0) {
      AbortConnection(fmt::format("io_uring_enter: {}", std::strerror(-rc)));
      return;
    }
    io_uring_cqe* cqe = nullptr;
    while (io_uring_peek_cqe(&worker->ring, &cqe) == 0) {
      const uint64_t tag = cqe->user_data;
      const int res = cqe->res;
      io_uring_cqe_seen(&worker->ring, cqe);
      if (tag == kStopTag) {
        stopping = true;  // after this batch: its requests are answered first
        continue;
      }
      Slot* slot = reinterpret_cast<Slot*>(tag);
      if (res == 0) {
        slot->register_retries = 0;
        Handle(slot);
        QueueCommand(worker, slot, kCommandCommitAndFetch);
      } else if (res == -EAGAIN || res == -EINTR) {
        // Not taken: the same command again (a commit's answer is still in place).
        QueueCommand(worker, slot, slot->unique == 0 ? kCommandRegister : kCommandCommitAndFetch);
      } else if (res == -ENOTCONN || res == -ECONNABORTED || res == -ECANCELED) {
        --live;  // the connection ended (unmount)
      } else if (++slot->register_retries <= kMaxRegisterRetries) {
        // A refused commit loses the kernel's entry: register the slot again.
        fmt::print(stderr, "spillfs: FUSE ring entry of queue {}: {}; registering it again\n", slot->qid,
                   std::strerror(-res));
        QueueCommand(worker, slot, kCommandRegister);
      } else {
        --live;
        LoseEntry(slot, std::strerror(-res));
      }
    }
  }
  if (stopping) io_uring_submit(&worker->ring);  // the answers of the last batch
}

void FuseRing::LoseEntry(Slot* slot, const std::string& why) {
  fmt::print(stderr, "spillfs: FUSE ring entry of queue {} given up: {}\n", slot->qid, why);
  if (live_entries_[slot->qid].fetch_sub(1) == 1 && requests_.load() > 0) {
    // A failed first REGISTER makes the kernel fall back to /dev/fuse; once
    // requests have come over the ring, a queue without entries hangs its CPU.
    AbortConnection(fmt::format("queue {} has no entries left", slot->qid));
  }
}

void FuseRing::AbortConnection(const std::string& why) {
  const std::string abort = "/sys/fs/fuse/connections/" + options_.connection + "/abort";
  std::ofstream knob(abort);
  knob << "1";
  knob.flush();
  if (options_.connection.empty() || !knob) {
    fmt::print(stderr, "spillfs: FUSE ring: {}: cannot abort the connection through {}\n", why, abort);
    return;
  }
  fmt::print(stderr, "spillfs: FUSE ring: {}: connection aborted through {}\n", why, abort);
}

void FuseRing::Handle(Slot* slot) {
  const RingRequestHeader* header = slot->header;
  fuse_in_header in;
  std::memcpy(&in, header->in_out, sizeof(in));
  const uint32_t payload = header->ring_ent_in_out.payload_sz;
  slot->unique = in.unique;
  slot->answered = false;
  slot->answer_aside = false;
  slot->error = 0;
  slot->answer_bytes = 0;
  // What read() would have returned: the header, the opcode's argument, the payload.
  const uint64_t argument = static_cast<uint64_t>(in.len) - sizeof(in) - payload;
  if (in.len < sizeof(in) + payload || argument > sizeof(header->op_in) || payload > payload_bytes_) {
    fmt::print(stderr, "spillfs: FUSE ring: malformed request (opcode {}, len {}, payload {})\n", in.opcode, in.len,
               payload);
    return Fail(slot, -EIO);
  }
  char* start = slot->payload - argument - sizeof(in);
  std::memcpy(start, &in, sizeof(in));
  std::memcpy(start + sizeof(in), header->op_in, argument);
  slot->request_has_payload = payload > 0;
  fuse_buf buf{};
  buf.size = in.len;
  buf.mem = start;
  serving_ = slot;
  fuse_session_process_buf(session_, &buf);
  serving_ = nullptr;
  requests_.fetch_add(1, std::memory_order_relaxed);
  SealAnswer(slot);
}

void FuseRing::Fail(Slot* slot, int error) {
  SetErrorAnswer(slot, error);
  SealAnswer(slot);
}

void FuseRing::SetErrorAnswer(Slot* slot, int error) {
  slot->error = error;
  slot->answer_bytes = 0;
  slot->answer_aside = false;
  slot->answered = true;
}

// The answer into the entry, for the commit. An unanswered request
// (fuse_reply_none) is committed empty, or its entry would be lost.
void FuseRing::SealAnswer(Slot* slot) {
  slot->answered = true;
  fuse_out_header out{};
  out.len = static_cast<uint32_t>(sizeof(out) + slot->answer_bytes);
  out.error = slot->error;
  out.unique = slot->unique;
  std::memcpy(slot->header->in_out, &out, sizeof(out));
  // (An empty answer may have no buffer aside: memcpy from null is undefined even for 0 bytes.)
  if (slot->answer_aside && slot->answer_bytes > 0) std::memcpy(slot->payload, slot->aside.data(), slot->answer_bytes);
  slot->header->ring_ent_in_out.payload_sz = slot->answer_bytes;
}

ssize_t FuseRing::HoldAnswer(Slot* slot, const iovec* iov, int count) {
  size_t bytes = 0;
  for (int i = 1; i < count; ++i) bytes += iov[i].iov_len;
  if (bytes > payload_bytes_) {
    SetErrorAnswer(slot, -EIO);  // sealed when the handler returns
    errno = EINVAL;
    return -1;
  }
  const auto* out = static_cast<const fuse_out_header*>(iov[0].iov_base);
  // A request's own payload may still be read by its handler (a write's data
  // after an early answer): the answer waits aside until the handler returns.
  slot->answer_aside = slot->request_has_payload;
  char* to = slot->payload;
  if (slot->answer_aside) {
    slot->aside.resize(bytes);
    to = slot->aside.data();
  }
  for (int i = 1; i < count; ++i) {
    std::memcpy(to, iov[i].iov_base, iov[i].iov_len);
    to += iov[i].iov_len;
  }
  slot->error = out->error;
  slot->answer_bytes = static_cast<uint32_t>(bytes);
  slot->answered = true;
  return static_cast<ssize_t>(sizeof(fuse_out_header) + bytes);
}

void FuseRing::CloseDevice() {
  if (device_fd_ >= 0) close(device_fd_);
  device_fd_ = -1;
}

void FuseRing::Stop() {
  if (stopped_) return;
  stopped_ = true;
  if (stop_fd_ >= 0) {
    uint64_t one = 1;
    ssize_t n = ::write(stop_fd_, &one, sizeof(one));
    (void)n;
  }
  StartWorkers(Start::kCancel);  // wakes workers still waiting to start; joins all
}

}  // namespace spillfs
