#include "spillfs/store/block_store.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <linux/fs.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "spillfs/common/mutex.h"
#include "spillfs/store/uring_engine.h"

namespace spillfs {
namespace {

Status Errno(const std::string& what) {
  return Status::Error(errno, fmt::format("{}: {}", what, std::strerror(errno)));
}

// The data area over one file descriptor: O_DIRECT where the file system
// takes it, io_uring for the transfers, fdatasync shared by concurrent
// callers (group commit).
class FileBlockStore final : public BlockStore {
 public:
  FileBlockStore(int fd, std::string path, uint64_t size) : fd_(fd), path_(std::move(path)), size_(size) {}
  ~FileBlockStore() override { close(fd_); }

  Status WriteSlices(const std::vector<IoSlice>& slices) override { return Transfer(slices, true); }
  Status ReadSlices(const std::vector<IoSlice>& slices) override { return Transfer(slices, false); }
  Status Flush() override { return SyncData(); }
  uint64_t syncs() const override { return syncs_.load(std::memory_order_relaxed); }
  uint64_t sync_ns() const override { return sync_ns_.load(std::memory_order_relaxed); }
  Status sync_error() const override {
    MutexLock lock(&sync_mu_);
    return sync_error_;
  }
  uint64_t size() const override { return size_; }
  const std::string& path() const override { return path_; }
  uint64_t bytes_written() const override { return bytes_written_.load(std::memory_order_relaxed); }
  uint64_t bytes_read() const override { return bytes_read_.load(std::memory_order_relaxed); }

 private:
  Status Transfer(const std::vector<IoSlice>& slices, bool write);
  // fdatasync, with the sticky error of Flush.
  Status SyncData() EXCLUDES(sync_mu_);

  const int fd_;
  const std::string path_;
  const uint64_t size_;
  std::atomic<uint64_t> bytes_written_{0};
  std::atomic<uint64_t> bytes_read_{0};
  // Group commit of fdatasync (SyncData). A leaf in the lock order
  // (spillfs/core/filesystem.h): nothing is taken under it, and fdatasync runs
  // without it.
  mutable Mutex sync_mu_;
  CondVar sync_done_{&sync_mu_};
  bool sync_running_ GUARDED_BY(sync_mu_) = false;
  uint64_t sync_tickets_ GUARDED_BY(sync_mu_) = 0;  // callers so far, numbered from 1
  uint64_t sync_covered_ GUARDED_BY(sync_mu_) = 0;  // callers up to this one are durable
  Status sync_error_ GUARDED_BY(sync_mu_);          // the first failed fdatasync, returned ever after
  std::atomic<uint64_t> syncs_{0};
  std::atomic<uint64_t> sync_ns_{0};
};

}  // namespace

// One writer of a data area at a time, held for as long as its open file
// lives: flock's lock goes with the open file description, which the kernel
// frees only when every I/O holding it has ended. A daemon that was killed
// with io_uring writes in flight leaves them to a kernel worker that may end
// them after the process was reaped (and after the volume's lock file was
// released); a daemon mounting at once would otherwise hand out extents that
// such a late write then overwrites. The wait covers that drain; a live
// writer (another daemon, or mkfs of a mounted device) is refused with EBUSY.
constexpr auto kWriterLockWait = std::chrono::seconds(3);

Status BlockStore::LockForWriting(int fd, const std::string& path) {
  const auto deadline = std::chrono::steady_clock::now() + kWriterLockWait;
  while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) return Errno("cannot lock " + path);
    if (std::chrono::steady_clock::now() > deadline) {
      return Status::Error(EBUSY, fmt::format("data area {} is in use by another process (a mounted daemon, or one "
                                              "that stopped with writes that have not ended in {} s)",
                                              path, kWriterLockWait.count()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return Status::OK();
}

Status BlockStore::CreateImage(const std::string& path, uint64_t size) {
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("cannot create " + path);
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    Status s = Errno("cannot size " + path);
    close(fd);
    unlink(path.c_str());
    return s;
  }
  close(fd);
  return Status::OK();
}

Result<uint64_t> BlockStore::SizeOf(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open " + path);
  struct stat st {};
  uint64_t size = 0;
  Status s;
  if (fstat(fd, &st) != 0) {
    s = Errno("cannot stat " + path);
  } else if (S_ISBLK(st.st_mode)) {
    if (ioctl(fd, BLKGETSIZE64, &size) != 0) s = Errno("cannot get the size of " + path);
  } else if (S_ISREG(st.st_mode)) {
    size = static_cast<uint64_t>(st.st_size);
  } else {
    s = Status::Invalid(path + " is neither a regular file nor a block device");
  }
  close(fd);
  if (!s.ok()) return s;
  return size;
}

Result<std::unique_ptr<BlockStore>> BlockStore::Open(const std::string& path, bool read_only) {
  SPILLFS_ASSIGN_OR_RETURN(uint64_t size, SizeOf(path));
  int fd = open(path.c_str(), (read_only ? O_RDONLY : O_RDWR) | O_DIRECT | O_CLOEXEC);
  if (fd < 0 && errno == EINVAL) {
    // The filesystem holding the image refuses O_DIRECT (tmpfs): fall back to
    // buffered I/O, which is correct but goes through the page cache.
    fd = open(path.c_str(), (read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC);
  }
  if (fd < 0) return Errno("cannot open " + path);
  if (!read_only) {
    if (Status locked = LockForWriting(fd, path); !locked.ok()) {
      close(fd);
      return locked;
    }
  }
  return std::unique_ptr<BlockStore>(std::make_unique<FileBlockStore>(fd, path, size));
}

Status FileBlockStore::Transfer(const std::vector<IoSlice>& slices, bool write) {
  std::vector<IoRequest> requests;
  uint64_t total = 0;
  for (const IoSlice& slice : slices) {
    if (slice.offset + slice.length > size_ || slice.offset + slice.length < slice.offset) {
      return Status::IOError(
          fmt::format("extent [{}, +{}) lies outside the store ({} bytes)", slice.offset, slice.length, size_));
    }
    for (uint64_t done = 0; done < slice.length; done += kChunkBytes) {
      uint32_t length = static_cast<uint32_t>(std::min<uint64_t>(kChunkBytes, slice.length - done));
      requests.push_back(IoRequest{fd_, write, slice.offset + done, slice.buffer + done, length});
    }
    total += slice.length;
  }
  SPILLFS_RETURN_IF_ERROR(UringEngine::Submit(requests));
  (write ? bytes_written_ : bytes_read_).fetch_add(total, std::memory_order_relaxed);
  return Status::OK();
}

namespace {

std::vector<IoSlice> Slices(const std::vector<PhysicalExtent>& extents, char* buffer) {
  std::vector<IoSlice> slices;
  uint64_t at = 0;
  for (const PhysicalExtent& e : extents) {
    slices.push_back(IoSlice{e.offset, buffer + at, e.length});
    at += e.length;
  }
  return slices;
}

}  // namespace

Status BlockStore::Write(const std::vector<PhysicalExtent>& extents, const char* buffer) {
  return WriteSlices(Slices(extents, const_cast<char*>(buffer)));
}

Status BlockStore::Read(const std::vector<PhysicalExtent>& extents, char* buffer) {
  return ReadSlices(Slices(extents, buffer));
}

Status BlockStore::WriteAt(uint64_t offset, const char* buffer, uint64_t length) {
  return Write({PhysicalExtent{offset, length}}, buffer);
}

Status BlockStore::ReadAt(uint64_t offset, char* buffer, uint64_t length) {
  return Read({PhysicalExtent{offset, length}}, buffer);
}

Status FileBlockStore::SyncData() {
  // Group commit: one fdatasync runs at a time, and callers that arrive while
  // it runs share the next one (it covers every write completed before it
  // started, theirs included). One at a time also means no caller can see
  // success between another's failure and the moment it is recorded.
  MutexLock lock(&sync_mu_);
  const uint64_t ticket = ++sync_tickets_;
  while (sync_error_.ok() && sync_covered_ < ticket && sync_running_) sync_done_.Wait();
  if (!sync_error_.ok()) return sync_error_;
  if (sync_covered_ >= ticket) return Status::OK();
  sync_running_ = true;
  const uint64_t covers = sync_tickets_;  // every caller so far asked before this sync starts
  lock.Unlock();
  int rc;
  const auto started = std::chrono::steady_clock::now();
  do {
    rc = fdatasync(fd_);
  } while (rc != 0 && errno == EINTR);
  sync_ns_.fetch_add(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - started).count(),
      std::memory_order_relaxed);
  Status failed = rc == 0 ? Status::OK() : Errno("fdatasync of " + path_);
  lock.Lock();
  sync_running_ = false;
  if (failed.ok()) {
    sync_covered_ = covers;
    syncs_.fetch_add(1, std::memory_order_relaxed);
  } else {
    sync_error_ = Status::Error(failed.code(), failed.message() + " (writes since then may be lost: remount)");
  }
  sync_done_.SignalAll();
  return sync_error_;
}

}  // namespace spillfs
