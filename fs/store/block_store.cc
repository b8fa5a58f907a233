#include "store/block_store.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "spillfs/common/aligned_buffer.h"
#include "store/uring_engine.h"

namespace spillfs {
namespace {

Status Errno(const std::string& what) {
  return Status::Error(errno, fmt::format("{}: {}", what, std::strerror(errno)));
}

}  // namespace

BlockStore::~BlockStore() {
  if (journal_ != nullptr) fclose(journal_);
  close(fd_);
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
  std::unique_ptr<BlockStore> store(new BlockStore(fd, path, size));
  const char* journal = getenv(kPowercutJournalEnv);
  if (!read_only && journal != nullptr && *journal != '\0') {
    // Power-cut simulation: nothing written before this open is in doubt.
    store->journal_ = fopen(journal, "we");
    if (store->journal_ == nullptr) return Errno(fmt::format("cannot create the power-cut journal {}", journal));
  }
  return store;
}

Status BlockStore::JournalPreImages(const std::vector<IoSlice>& slices) {
  AlignedBuffer old;
  for (const IoSlice& slice : slices) {
    for (uint64_t done = 0; done < slice.length; done += kChunkBytes) {
      uint64_t length = std::min<uint64_t>(kChunkBytes, slice.length - done);
      uint64_t offset = slice.offset + done;
      SPILLFS_RETURN_IF_ERROR(old.Resize(length));
      for (uint64_t got = 0; got < length;) {
        ssize_t n = pread(fd_, old.data() + got, length - got, static_cast<off_t>(offset + got));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return Errno(fmt::format("power-cut journal: pre-image read at {}", offset + got));
        if (n == 0) {  // past the end of the file: reads as zeros
          std::memset(old.data() + got, 0, length - got);
          break;
        }
        got += static_cast<uint64_t>(n);
      }
      PowercutRecordHeader header;
      header.offset = offset;
      header.length = length;
      std::lock_guard lock(journal_mu_);
      if (fwrite(&header, sizeof(header), 1, journal_) != 1 || fwrite(old.data(), 1, length, journal_) != length ||
          fflush(journal_) != 0) {
        return Errno("power-cut journal: append");
      }
    }
  }
  return Status::OK();
}

Status BlockStore::Transfer(const std::vector<IoSlice>& slices, bool write) {
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
  std::optional<std::shared_lock<std::shared_mutex>> not_flushing;
  if (write && journal_ != nullptr) {
    not_flushing.emplace(durability_mu_);
    SPILLFS_RETURN_IF_ERROR(JournalPreImages(slices));
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
  return Transfer(Slices(extents, const_cast<char*>(buffer)), true);
}

Status BlockStore::Read(const std::vector<PhysicalExtent>& extents, char* buffer) {
  return Transfer(Slices(extents, buffer), false);
}

Status BlockStore::WriteAt(uint64_t offset, const char* buffer, uint64_t length) {
  return Write({PhysicalExtent{offset, length}}, buffer);
}

Status BlockStore::ReadAt(uint64_t offset, char* buffer, uint64_t length) {
  return Read({PhysicalExtent{offset, length}}, buffer);
}

Status BlockStore::sync_error() const {
  std::lock_guard lock(sync_mu_);
  return sync_error_;
}

Status BlockStore::Flush() {
  if (journal_ == nullptr) return SyncData();
  // No write runs between the fdatasync and the truncation of the journal.
  std::unique_lock durable(durability_mu_);
  SPILLFS_RETURN_IF_ERROR(SyncData());
  std::lock_guard lock(journal_mu_);
  if (fflush(journal_) != 0 || ftruncate(fileno(journal_), 0) != 0 || fseek(journal_, 0, SEEK_SET) != 0) {
    return Errno("power-cut journal: truncate");
  }
  return Status::OK();
}

Status BlockStore::SyncData() {
  // Group commit: one fdatasync runs at a time, and callers that arrive while
  // it runs share the next one (it covers every write completed before it
  // started, theirs included). One at a time also means no caller can see
  // success between another's failure and the moment it is recorded.
  std::unique_lock lock(sync_mu_);
  const uint64_t ticket = ++sync_tickets_;
  while (sync_error_.ok() && sync_covered_ < ticket && sync_running_) sync_done_.wait(lock);
  if (!sync_error_.ok()) return sync_error_;
  if (sync_covered_ >= ticket) return Status::OK();
  sync_running_ = true;
  const uint64_t covers = sync_tickets_;  // every caller so far asked before this sync starts
  lock.unlock();
  int rc;
  const auto started = std::chrono::steady_clock::now();
  do {
    rc = fdatasync(fd_);
  } while (rc != 0 && errno == EINTR);
  sync_ns_.fetch_add(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - started).count(),
      std::memory_order_relaxed);
  Status failed = rc == 0 ? Status::OK() : Errno("fdatasync of " + path_);
  lock.lock();
  sync_running_ = false;
  if (failed.ok()) {
    sync_covered_ = covers;
    syncs_.fetch_add(1, std::memory_order_relaxed);
  } else {
    sync_error_ = Status::Error(failed.code(), failed.message() + " (writes since then may be lost: remount)");
  }
  sync_done_.notify_all();
  return sync_error_;
}

}  // namespace spillfs
