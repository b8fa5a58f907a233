// The data-area side of the power-cut simulation: the BlockStore wrapper that
// journals pre-images, and ApplyDataCut (spillfs/testing/powercut.h says what
// it models).
//
// The journal is a sequence of records, each this header (native byte order)
// followed by `length` bytes of pre-image: the bytes at `offset` just before
// a write replaced them. A write of more than BlockStore::kChunkBytes is
// journaled in records of at most that many bytes.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "journal_file.h"
#include "spillfs/common/aligned_buffer.h"
#include "spillfs/testing/powercut.h"

namespace spillfs::powercut {
namespace {

using internal::Errno;

constexpr uint32_t kRecordMagic = 0x50434a31;  // "PCJ1"
constexpr uint64_t kUnit = BlockStore::kDirectAlignment;

struct RecordHeader {
  uint32_t magic = kRecordMagic;
  uint32_t reserved = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// Forwards everything to the wrapped store; journals the pre-image of every
// write before it is issued, and empties the journal after every Flush.
class JournalingBlockStore final : public BlockStore {
 public:
  JournalingBlockStore(std::unique_ptr<BlockStore> base, int read_fd, FILE* journal)
      : base_(std::move(base)), read_fd_(read_fd), journal_(journal) {}
  ~JournalingBlockStore() override {
    fclose(journal_);
    close(read_fd_);
  }

  Status WriteSlices(const std::vector<IoSlice>& slices) override {
    for (const IoSlice& slice : slices) {  // the base refuses these: nothing to journal
      if (slice.offset + slice.length > size() || slice.offset + slice.length < slice.offset) {
        return base_->WriteSlices(slices);
      }
    }
    std::shared_lock not_flushing(durability_mu_);
    SPILLFS_RETURN_IF_ERROR(JournalPreImages(slices));
    return base_->WriteSlices(slices);
  }
  Status ReadSlices(const std::vector<IoSlice>& slices) override { return base_->ReadSlices(slices); }
  // No write runs between the fdatasync and the truncation of the journal.
  Status Flush() override {
    std::unique_lock durable(durability_mu_);
    SPILLFS_RETURN_IF_ERROR(base_->Flush());
    std::lock_guard lock(journal_mu_);
    if (fflush(journal_) != 0 || ftruncate(fileno(journal_), 0) != 0 || fseek(journal_, 0, SEEK_SET) != 0) {
      return Errno("power-cut journal: truncate");
    }
    return Status::OK();
  }
  uint64_t syncs() const override { return base_->syncs(); }
  uint64_t sync_ns() const override { return base_->sync_ns(); }
  Status sync_error() const override { return base_->sync_error(); }
  uint64_t size() const override { return base_->size(); }
  const std::string& path() const override { return base_->path(); }
  uint64_t bytes_written() const override { return base_->bytes_written(); }
  uint64_t bytes_read() const override { return base_->bytes_read(); }

 private:
  // Appends the current bytes under `slices` to the journal.
  Status JournalPreImages(const std::vector<IoSlice>& slices) {
    AlignedBuffer old;
    for (const IoSlice& slice : slices) {
      for (uint64_t done = 0; done < slice.length; done += kChunkBytes) {
        uint64_t length = std::min<uint64_t>(kChunkBytes, slice.length - done);
        uint64_t offset = slice.offset + done;
        SPILLFS_RETURN_IF_ERROR(old.Resize(length));
        for (uint64_t got = 0; got < length;) {
          ssize_t n = pread(read_fd_, old.data() + got, length - got, static_cast<off_t>(offset + got));
          if (n < 0 && errno == EINTR) continue;
          if (n < 0) return Errno(fmt::format("power-cut journal: pre-image read at {}", offset + got));
          if (n == 0) {  // past the end of the file: reads as zeros
            std::memset(old.data() + got, 0, length - got);
            break;
          }
          got += static_cast<uint64_t>(n);
        }
        RecordHeader header;
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

  const std::unique_ptr<BlockStore> base_;
  const int read_fd_;  // the data area, for the pre-images
  FILE* const journal_;
  std::mutex journal_mu_;            // appends and truncation of journal_
  std::shared_mutex durability_mu_;  // shared: a journaled write; exclusive: Flush
};

}  // namespace

Result<std::unique_ptr<BlockStore>> NewJournalingBlockStore(std::unique_ptr<BlockStore> base,
                                                            const std::string& journal) {
  // The pre-images are read as the base reads: O_DIRECT where it can be had.
  int read_fd = open(base->path().c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (read_fd < 0 && errno == EINVAL) read_fd = open(base->path().c_str(), O_RDONLY | O_CLOEXEC);
  if (read_fd < 0) return Errno("power-cut journal: cannot open " + base->path());
  FILE* file = fopen(journal.c_str(), "we");
  if (file == nullptr) {
    Status s = Errno(fmt::format("cannot create the power-cut journal {}", journal));
    close(read_fd);
    return s;
  }
  return std::unique_ptr<BlockStore>(std::make_unique<JournalingBlockStore>(std::move(base), read_fd, file));
}

bool DataJournalHoldsAWrite(const std::string& journal) {
  int fd = open(journal.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  RecordHeader header;
  struct stat st {};
  bool whole = pread(fd, &header, sizeof(header), 0) == static_cast<ssize_t>(sizeof(header)) &&
               header.magic == kRecordMagic && fstat(fd, &st) == 0 &&
               static_cast<uint64_t>(st.st_size) >= sizeof(header) + header.length;
  close(fd);
  return whole;
}

Result<DataCut> ApplyDataCut(const std::string& journal, const std::string& image,
                             const std::function<bool()>& survives) {
  DataCut cut;
  std::string bytes;
  SPILLFS_RETURN_IF_ERROR(internal::ReadWholeFile(journal, &bytes).WithContext("the power-cut journal"));
  struct Record {
    uint64_t offset;
    uint64_t length;
    size_t at;  // pre-image in `bytes`
    bool survives;
  };
  std::vector<Record> records;
  for (size_t at = 0; at < bytes.size();) {
    RecordHeader header;
    if (bytes.size() - at < sizeof(header)) {
      cut.torn_tail = true;
      break;
    }
    std::memcpy(&header, bytes.data() + at, sizeof(header));
    if (header.magic != kRecordMagic) {
      return Status::Corruption(fmt::format("journal record at {} has a bad magic", at));
    }
    if (bytes.size() - at - sizeof(header) < header.length) {
      cut.torn_tail = true;
      break;
    }
    if (header.offset % kUnit != 0 || header.length % kUnit != 0) {
      return Status::Corruption(fmt::format("journal record at {} is not 4 KiB aligned", at));
    }
    bool kept = survives && survives();
    records.push_back({header.offset, header.length, at + sizeof(header), kept});
    (kept ? cut.survived : cut.undone) += 1;
    (kept ? cut.survived_bytes : cut.undone_bytes) += header.length;
    at += sizeof(header) + header.length;
  }
  // Unit -> the records that wrote it, oldest first.
  std::unordered_map<uint64_t, std::vector<uint32_t>> writers;
  for (uint32_t i = 0; i < records.size(); ++i) {
    for (uint64_t u = records[i].offset / kUnit; u < (records[i].offset + records[i].length) / kUnit; ++u) {
      writers[u].push_back(i);
    }
  }
  int fd = open(image.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open " + image);
  // A killed daemon's io_uring writes can still be in flight after it was
  // reaped (a kernel worker ends its ring). Undone before they land, a late
  // write would overwrite a pre-image, and a late O_DIRECT write over the
  // undo's dirty pages marks the image EIO. The cut is the area's next
  // writer: it takes the writer lock, as a mount does, which is free once
  // the daemon's open file, and so every write through it, is gone.
  if (Status locked = BlockStore::LockForWriting(fd, image); !locked.ok()) {
    close(fd);
    return locked;
  }
  Status written;
  for (const auto& [unit, list] : writers) {
    // The newest surviving writer, and the record after it.
    size_t keep = list.size();  // index in list of the first record whose write is lost for good
    for (size_t i = list.size(); i-- > 0;) {
      if (records[list[i]].survives) {
        keep = i + 1;
        break;
      }
      keep = 0;
    }
    if (keep == list.size()) continue;           // the newest write survived: the image holds it
    const Record& source = records[list[keep]];  // its pre-image is what the unit holds
    const char* data = bytes.data() + source.at + (unit * kUnit - source.offset);
    for (uint64_t done = 0; done < kUnit;) {
      ssize_t n = pwrite(fd, data + done, kUnit - done, static_cast<off_t>(unit * kUnit + done));
      if (n <= 0) {
        written = Errno("cannot write " + image);
        break;
      }
      done += static_cast<uint64_t>(n);
    }
    if (!written.ok()) break;
  }
  if (fsync(fd) != 0 && written.ok()) written = Errno("fsync of " + image);
  close(fd);
  SPILLFS_RETURN_IF_ERROR(written);
  return cut;
}

Volume::Wrappers Wrappers(const std::string& data_journal, const std::string& index_journal) {
  Volume::Wrappers wrappers;
  if (!data_journal.empty()) {
    wrappers.data_area = [data_journal](std::unique_ptr<BlockStore> store) {
      return NewJournalingBlockStore(std::move(store), data_journal);
    };
  }
  if (!index_journal.empty()) {
    wrappers.index_file_system = [index_journal](const std::string& index_dir) {
      return NewJournalingFileSystem(index_dir, index_journal);
    };
  }
  return wrappers;
}

}  // namespace spillfs::powercut
