// The index side of the power-cut simulation: the RocksDB FileSystem wrapper
// and ApplyIndexCut (spillfs/testing/powercut.h says what it models and what
// it does not).
//
// Every operation is passed to the wrapped FileSystem unchanged; for files
// under the index directory the wrapper also appends one line to the journal
// after the operation succeeded (one write(2) each, O_APPEND, so it survives
// a SIGKILL of the writer; it is the observer, not part of the simulated
// machine):
//
//   N <tab> name                 created or truncated by NewWritableFile
//   S <tab> size <tab> name      a Sync / Fsync of it returned: `size` bytes durable
//   T <tab> size <tab> name      truncated to `size`
//   R <tab> from <tab> to        renamed (ReuseWritableFile too, followed by N)
//   L <tab> from <tab> to        hard-linked
//   D <tab> name                 deleted
//   U <tab> name                 no longer followed (opened as a random-access
//                                writable file, or renamed in from elsewhere)
//
// Names are relative to the index directory. A line cut short by a kill has
// no newline and is ignored by ApplyIndexCut.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>

#include <rocksdb/file_system.h>

#include "journal_file.h"
#include "spillfs/testing/powercut.h"

namespace spillfs::powercut {
namespace {

using internal::Errno;

using rocksdb::FileOptions;
using rocksdb::FSRandomRWFile;
using rocksdb::FSWritableFile;
using rocksdb::IODebugContext;
using rocksdb::IOOptions;
using rocksdb::IOStatus;
using rocksdb::Slice;

// The append-only journal file, shared by the file system and its files.
class Journal {
 public:
  explicit Journal(int fd) : fd_(fd) {}
  ~Journal() { close(fd_); }
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  // Appends one line (without its newline) with a single write.
  IOStatus Append(std::string line) {
    line.push_back('\n');
    for (size_t done = 0; done < line.size();) {
      ssize_t n = write(fd_, line.data() + done, line.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return IOStatus::IOError("power-cut index journal", strerror(errno));
      done += static_cast<size_t>(n);
    }
    return IOStatus::OK();
  }

 private:
  const int fd_;
};

// A writable file under the index directory: counts the bytes appended and
// journals how many were there when a Sync or Fsync returned.
class JournaledWritableFile : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  JournaledWritableFile(std::unique_ptr<FSWritableFile> file, std::shared_ptr<Journal> journal, std::string name,
                        uint64_t size)
      : FSWritableFileOwnerWrapper(std::move(file)),
        journal_(std::move(journal)),
        name_(std::move(name)),
        size_(size) {}

  IOStatus Append(const Slice& data, const IOOptions& options, IODebugContext* dbg) override {
    IOStatus s = target()->Append(data, options, dbg);
    if (s.ok()) size_.fetch_add(data.size());
    return s;
  }
  IOStatus Append(const Slice& data, const IOOptions& options, const rocksdb::DataVerificationInfo& info,
                  IODebugContext* dbg) override {
    IOStatus s = target()->Append(data, options, info, dbg);
    if (s.ok()) size_.fetch_add(data.size());
    return s;
  }
  IOStatus PositionedAppend(const Slice& data, uint64_t offset, const IOOptions& options,
                            IODebugContext* dbg) override {
    IOStatus s = target()->PositionedAppend(data, offset, options, dbg);
    if (s.ok()) GrowTo(offset + data.size());
    return s;
  }
  IOStatus PositionedAppend(const Slice& data, uint64_t offset, const IOOptions& options,
                            const rocksdb::DataVerificationInfo& info, IODebugContext* dbg) override {
    IOStatus s = target()->PositionedAppend(data, offset, options, info, dbg);
    if (s.ok()) GrowTo(offset + data.size());
    return s;
  }
  IOStatus Truncate(uint64_t size, const IOOptions& options, IODebugContext* dbg) override {
    IOStatus s = target()->Truncate(size, options, dbg);
    if (!s.ok()) return s;
    size_.store(size);
    return journal_->Append(fmt::format("T\t{}\t{}", size, name_));
  }
  // The size is taken before the sync: bytes appended while it runs (the WAL
  // is appended to while SyncWAL syncs it) may or may not be covered.
  IOStatus Sync(const IOOptions& options, IODebugContext* dbg) override {
    uint64_t covered = size_.load();
    return Synced(covered, target()->Sync(options, dbg));
  }
  IOStatus Fsync(const IOOptions& options, IODebugContext* dbg) override {
    uint64_t covered = size_.load();
    return Synced(covered, target()->Fsync(options, dbg));
  }
  // RangeSync (sync_file_range) and Close make nothing durable: inherited.

 private:
  void GrowTo(uint64_t end) {
    uint64_t now = size_.load();
    while (now < end && !size_.compare_exchange_weak(now, end)) {
    }
  }
  IOStatus Synced(uint64_t covered, IOStatus s) {
    if (!s.ok()) return s;
    return journal_->Append(fmt::format("S\t{}\t{}", covered, name_));
  }

  std::shared_ptr<Journal> journal_;
  const std::string name_;
  std::atomic<uint64_t> size_;
};

class JournalingFileSystem : public rocksdb::FileSystemWrapper {
 public:
  JournalingFileSystem(std::shared_ptr<rocksdb::FileSystem> base, std::string dir, std::shared_ptr<Journal> journal)
      : FileSystemWrapper(std::move(base)), dir_(std::move(dir)), journal_(std::move(journal)) {
    while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  }

  static const char* kClassName() { return "SpillfsPowercutFileSystem"; }
  const char* Name() const override { return kClassName(); }

  IOStatus NewWritableFile(const std::string& path, const FileOptions& options, std::unique_ptr<FSWritableFile>* result,
                           IODebugContext* dbg) override {
    IOStatus s = target()->NewWritableFile(path, options, result, dbg);
    auto name = Relative(path);
    if (!s.ok() || !name) return s;
    s = journal_->Append("N\t" + *name);
    if (s.ok()) Wrap(*name, 0, result);
    return s;
  }

  IOStatus ReopenWritableFile(const std::string& path, const FileOptions& options,
                              std::unique_ptr<FSWritableFile>* result, IODebugContext* dbg) override {
    IOStatus s = target()->ReopenWritableFile(path, options, result, dbg);
    auto name = Relative(path);
    if (!s.ok() || !name) return s;
    uint64_t size = 0;
    s = target()->GetFileSize(path, IOOptions(), &size, dbg);
    if (s.ok()) Wrap(*name, size, result);  // appends after `size`; its durable state stays
    return s;
  }

  // Log recycling (off under point-in-time recovery, see index.cc): the old
  // file is renamed and rewritten from its start, so nothing in it is known
  // to be durable any more.
  IOStatus ReuseWritableFile(const std::string& path, const std::string& old_path, const FileOptions& options,
                             std::unique_ptr<FSWritableFile>* result, IODebugContext* dbg) override {
    IOStatus s = target()->ReuseWritableFile(path, old_path, options, result, dbg);
    if (!s.ok()) return s;
    s = Renamed(old_path, path);
    auto name = Relative(path);
    if (!s.ok() || !name) return s;
    s = journal_->Append("N\t" + *name);
    if (s.ok()) Wrap(*name, 0, result);
    return s;
  }

  IOStatus NewRandomRWFile(const std::string& path, const FileOptions& options, std::unique_ptr<FSRandomRWFile>* result,
                           IODebugContext* dbg) override {
    IOStatus s = target()->NewRandomRWFile(path, options, result, dbg);
    auto name = Relative(path);
    if (!s.ok() || !name) return s;
    return journal_->Append("U\t" + *name);
  }

  IOStatus RenameFile(const std::string& from, const std::string& to, const IOOptions& options,
                      IODebugContext* dbg) override {
    IOStatus s = target()->RenameFile(from, to, options, dbg);
    return s.ok() ? Renamed(from, to) : s;
  }

  IOStatus LinkFile(const std::string& from, const std::string& to, const IOOptions& options,
                    IODebugContext* dbg) override {
    IOStatus s = target()->LinkFile(from, to, options, dbg);
    if (!s.ok()) return s;
    auto a = Relative(from), b = Relative(to);
    if (a && b) return journal_->Append("L\t" + *a + "\t" + *b);
    if (b) return journal_->Append("U\t" + *b);
    return s;
  }

  IOStatus DeleteFile(const std::string& path, const IOOptions& options, IODebugContext* dbg) override {
    IOStatus s = target()->DeleteFile(path, options, dbg);
    auto name = Relative(path);
    if (!s.ok() || !name) return s;
    return journal_->Append("D\t" + *name);
  }

  IOStatus Truncate(const std::string& path, size_t size, const IOOptions& options, IODebugContext* dbg) override {
    IOStatus s = target()->Truncate(path, size, options, dbg);
    auto name = Relative(path);
    if (!s.ok() || !name) return s;
    return journal_->Append(fmt::format("T\t{}\t{}", size, *name));
  }

 private:
  // The name of `path` relative to the index directory; nullopt for paths
  // outside it and for names the journal cannot hold (tab, newline).
  std::optional<std::string> Relative(const std::string& path) const {
    if (path.size() <= dir_.size() + 1 || path.compare(0, dir_.size(), dir_) != 0 || path[dir_.size()] != '/') {
      return std::nullopt;
    }
    size_t start = dir_.size();
    while (start < path.size() && path[start] == '/') ++start;
    std::string name = path.substr(start);
    if (name.empty() || name.find_first_of("\t\n") != std::string::npos) return std::nullopt;
    return name;
  }

  IOStatus Renamed(const std::string& from, const std::string& to) {
    auto a = Relative(from), b = Relative(to);
    if (a && b) return journal_->Append("R\t" + *a + "\t" + *b);
    if (a) return journal_->Append("D\t" + *a);  // moved out of the directory
    if (b) return journal_->Append("U\t" + *b);  // moved in: its history is unknown
    return IOStatus::OK();
  }

  void Wrap(const std::string& name, uint64_t size, std::unique_ptr<FSWritableFile>* result) {
    *result = std::make_unique<JournaledWritableFile>(std::move(*result), journal_, name, size);
  }

  std::string dir_;
  std::shared_ptr<Journal> journal_;
};

}  // namespace

Result<std::shared_ptr<rocksdb::FileSystem>> NewJournalingFileSystem(std::shared_ptr<rocksdb::FileSystem> base,
                                                                     const std::string& dir,
                                                                     const std::string& journal) {
  int fd = open(journal.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot create the power-cut index journal " + journal);
  return std::shared_ptr<rocksdb::FileSystem>(
      std::make_shared<JournalingFileSystem>(std::move(base), dir, std::make_shared<Journal>(fd)));
}

Result<std::shared_ptr<rocksdb::FileSystem>> NewJournalingFileSystem(const std::string& dir,
                                                                     const std::string& journal) {
  return NewJournalingFileSystem(rocksdb::FileSystem::Default(), dir, journal);
}

Result<IndexCut> ApplyIndexCut(const std::string& journal, const std::string& index_dir) {
  std::string text;
  SPILLFS_RETURN_IF_ERROR(internal::ReadWholeFile(journal, &text).WithContext("the power-cut index journal"));

  // Replay: name -> durable length; -1 for a file never synced.
  std::map<std::string, int64_t> durable;
  auto bad = [&](size_t at) {
    return Status::Corruption(fmt::format("power-cut index journal {}: bad line at byte {}", journal, at));
  };
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) break;  // cut short by the kill: never acted on
    std::string line = text.substr(at, end - at);
    size_t tab = line.find('\t');
    if (tab != 1) return bad(at);
    const char kind = line[0];
    std::string rest = line.substr(2);
    std::string first, second;
    size_t split = rest.find('\t');
    if (split == std::string::npos) {
      first = rest;
    } else {
      first = rest.substr(0, split);
      second = rest.substr(split + 1);
    }
    auto length = [&](int64_t* out) {
      char* stop = nullptr;
      errno = 0;
      long long v = std::strtoll(first.c_str(), &stop, 10);
      if (errno != 0 || stop == first.c_str() || *stop != '\0' || v < 0) return false;
      *out = v;
      return true;
    };
    int64_t size = 0;
    switch (kind) {
      case 'N':
        durable[first] = -1;
        break;
      case 'S':
        if (second.empty() || !length(&size)) return bad(at);
        durable[second] = size;
        break;
      case 'T':
        if (second.empty() || !length(&size)) return bad(at);
        if (auto it = durable.find(second); it != durable.end() && it->second > size) {
          it->second = size;
        }
        break;
      case 'R':
      case 'L': {
        if (second.empty()) return bad(at);
        auto it = durable.find(first);
        if (it == durable.end()) {
          durable.erase(second);  // an unfollowed file's content now has this name
        } else {
          int64_t state = it->second;
          if (kind == 'R') durable.erase(it);
          durable[second] = state;
        }
        break;
      }
      case 'D':
      case 'U':
        durable.erase(first);
        break;
      default:
        return bad(at);
    }
    at = end + 1;
  }

  IndexCut cut;
  cut.files_tracked = durable.size();
  for (const auto& [name, length] : durable) {
    std::string path = index_dir + "/" + name;
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) {
      if (errno == ENOENT) continue;
      return Errno("stat " + path);
    }
    if (length < 0) {
      if (unlink(path.c_str()) != 0) return Errno("cannot remove " + path);
      ++cut.files_removed;
    } else if (static_cast<uint64_t>(st.st_size) > static_cast<uint64_t>(length)) {
      if (truncate(path.c_str(), length) != 0) return Errno("cannot truncate " + path);
      ++cut.files_truncated;
      cut.bytes_dropped += static_cast<uint64_t>(st.st_size) - static_cast<uint64_t>(length);
    }
  }
  return cut;
}

}  // namespace spillfs::powercut
