// fsx-style randomized data-path test against a real spillfs mount.
//
// A few files on the mount receive thousands of random operations (pwrite at
// random, unaligned and block-crossing offsets and lengths including 1-3 MiB
// writes, pread checks, ftruncate up and down, fallocate in its plain,
// KEEP_SIZE, PUNCH_HOLE|KEEP_SIZE, ZERO_RANGE and ZERO_RANGE|KEEP_SIZE forms,
// close/reopen, O_TRUNC reopen, fsync/fdatasync and an occasional unmount +
// mount of the whole volume). Every operation is mirrored on an in-memory
// model (one std::vector<char> per file, holes are zeros); st_size is compared
// after every operation, reads are compared byte for byte, and every file is
// compared in full at the end, before and after a final remount.
//
// On the first mismatch the test reports the seed, the operation index, the
// first differing byte (with the operation that last wrote it) and the tail of
// the operation log, then stops that seed.
//
// Environment:
//   SPILLFS_FSX_OPS=N       operations per seed (default kDefaultOps)
//   SPILLFS_FSX_SEED=S      run only this seed (in place of the fixed list)
//   SPILLFS_FSX_SKIP=a,b    leave out operation kinds, for diagnosis only:
//                           any of write,read,truncate,fallocate,punch,zero,
//                           reopen,otrunc,fsync,remount
//   SPILLFS_FSX_PROFILE=1   print the time spent per operation kind
//   SPILLFS_FSX_LOG_TAIL=N  operations of the log printed on failure (default 40)

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "support/env.h"
#include "support/mounted_volume.h"

namespace spillfs::testing {
namespace {

constexpr uint64_t kDefaultOps = 1500;
constexpr int kNumFiles = 3;
constexpr uint64_t kMaxFileSize = 12ull << 20;  // room for 3 MiB writes anywhere
constexpr uint64_t kPage = 4096;
constexpr uint64_t kMiB = 1ull << 20;
constexpr size_t kLogTail = 40;

enum class OpKind {
  kWrite,
  kRead,
  kTruncate,
  kFallocate,   // mode 0: allocates, extends the size
  kFallocKeep,  // FALLOC_FL_KEEP_SIZE
  kPunch,       // FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
  kZeroRange,   // FALLOC_FL_ZERO_RANGE (extends the size)
  kZeroKeep,    // FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE
  kReopen,
  kOpenTrunc,
  kFsync,
  kRemount,
  kFullCompare,
};

const char* OpName(OpKind kind) {
  switch (kind) {
    case OpKind::kWrite:
      return "write";
    case OpKind::kRead:
      return "read";
    case OpKind::kTruncate:
      return "truncate";
    case OpKind::kFallocate:
      return "fallocate";
    case OpKind::kFallocKeep:
      return "fallocate_keep_size";
    case OpKind::kPunch:
      return "punch_hole";
    case OpKind::kZeroRange:
      return "zero_range";
    case OpKind::kZeroKeep:
      return "zero_range_keep";
    case OpKind::kReopen:
      return "close_reopen";
    case OpKind::kOpenTrunc:
      return "open_o_trunc";
    case OpKind::kFsync:
      return "fsync";
    case OpKind::kRemount:
      return "remount";
    case OpKind::kFullCompare:
      return "full_compare";
  }
  return "?";
}

struct OpRecord {
  uint64_t index = 0;
  OpKind kind = OpKind::kRead;
  int file = -1;        // -1: all files
  uint64_t offset = 0;  // write/read/fallocate offset, or new size for truncate
  uint64_t length = 0;
  uint64_t size_before = 0;
  uint64_t size_after = 0;

  // True when this operation changed the contents at byte `pos` of `f`.
  bool Touches(int f, uint64_t pos) const {
    if (f != file) return false;
    switch (kind) {
      case OpKind::kWrite:
      case OpKind::kPunch:
      case OpKind::kZeroRange:
      case OpKind::kZeroKeep:
        return pos >= offset && pos < offset + length;
      case OpKind::kTruncate:
      case OpKind::kOpenTrunc:
      case OpKind::kFallocate:
        return pos >= std::min(size_before, size_after);
      default:
        return false;
    }
  }

  std::string Describe() const {
    char buf[256];
    const char* name = OpName(kind);
    std::string target = file < 0 ? "all" : "f" + std::to_string(file);
    switch (kind) {
      case OpKind::kWrite:
      case OpKind::kRead:
      case OpKind::kFallocate:
      case OpKind::kFallocKeep:
      case OpKind::kPunch:
      case OpKind::kZeroRange:
      case OpKind::kZeroKeep:
        snprintf(buf, sizeof buf,
                 "#%" PRIu64 " %s %-19s off=0x%" PRIx64 " len=0x%" PRIx64 " end=0x%" PRIx64 " size 0x%" PRIx64
                 "->0x%" PRIx64,
                 index, target.c_str(), name, offset, length, offset + length, size_before, size_after);
        break;
      case OpKind::kTruncate:
        snprintf(buf, sizeof buf, "#%" PRIu64 " %s %-19s size 0x%" PRIx64 "->0x%" PRIx64 " (%s)", index, target.c_str(),
                 name, size_before, size_after, size_after >= size_before ? "up" : "down");
        break;
      default:
        snprintf(buf, sizeof buf, "#%" PRIu64 " %s %-19s size 0x%" PRIx64, index, target.c_str(), name, size_after);
        break;
    }
    return buf;
  }
};

std::string Errno(const char* what) {
  int e = errno;
  return std::string(what) + " failed: errno " + std::to_string(e) + " (" + strerror(e) + ")";
}

// splitmix64: the data written by operation `op` at file offset `pos`; never 0,
// so data read back as a hole is always told apart from data.
inline uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void FillData(uint64_t seed, uint64_t op, uint64_t offset, char* out, size_t len) {
  uint64_t key = Mix(seed * 0x100000001b3ull + op);
  size_t i = 0;
  while (i < len) {
    uint64_t word = Mix(key ^ ((offset + i) >> 3));
    for (size_t b = (offset + i) & 7; b < 8 && i < len; ++b, ++i) {
      char c = static_cast<char>(word >> (8 * b));
      out[i] = c == 0 ? 1 : c;
    }
  }
}

class Fsx {
 public:
  Fsx(MountedVolume* volume, uint64_t seed, uint64_t num_ops)
      : volume_(volume), seed_(seed), num_ops_(num_ops), rng_(seed) {
    model_.resize(kNumFiles);
    fds_.assign(kNumFiles, -1);
    std::string skip = getenv("SPILLFS_FSX_SKIP") ? getenv("SPILLFS_FSX_SKIP") : "";
    std::stringstream ss(skip);
    std::string item;
    while (std::getline(ss, item, ',')) skip_.insert(item);
  }

  ~Fsx() {
    for (int& fd : fds_) {
      if (fd >= 0) close(fd);
      fd = -1;
    }
  }

  // Runs the sequence; returns false after reporting the first failure.
  bool Run() {
    for (int f = 0; f < kNumFiles; ++f) {
      fds_[f] = open(PathOf(f).c_str(), O_RDWR | O_CREAT | O_EXCL, 0644);
      if (fds_[f] < 0) return Fail(Errno(("create " + PathOf(f)).c_str()));
    }
    for (op_ = 1; op_ <= num_ops_; ++op_) {
      auto start = std::chrono::steady_clock::now();
      bool ok = Step() && CheckSizes();
      auto& [count, seconds] = profile_[OpName(current_.kind)];
      ++count;
      seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (!ok) return false;
    }
    if (getenv("SPILLFS_FSX_PROFILE") != nullptr) {
      for (const auto& [name, entry] : profile_) {
        printf("fsx profile: %-20s %6d ops %8.3f s\n", name.c_str(), entry.first, entry.second);
      }
    }
    // Final: full compare through fresh descriptors, then after a remount.
    current_ = OpRecord{op_, OpKind::kFullCompare};
    log_.push_back(current_);
    for (int f = 0; f < kNumFiles; ++f) {
      if (!Reopen(f, 0)) return false;
    }
    if (!CompareAll("final full compare")) return false;
    ++op_;
    return DoRemount("final remount");
  }

 private:
  std::string PathOf(int f) const { return volume_->Path("fsx" + std::to_string(f)); }

  uint64_t Rand() { return rng_(); }
  // Uniform in [lo, hi] (inclusive); plain modulo keeps it reproducible everywhere.
  uint64_t Uniform(uint64_t lo, uint64_t hi) { return lo + Rand() % (hi - lo + 1); }
  int64_t Delta(int64_t span) { return static_cast<int64_t>(Uniform(0, 2 * span)) - span; }
  bool Chance(uint64_t percent) { return Uniform(0, 99) < percent; }
  bool Skipped(const char* name) const { return skip_.count(name) != 0; }

  static uint64_t Clamp(int64_t value, uint64_t lo, uint64_t hi) {
    if (value < static_cast<int64_t>(lo)) return lo;
    if (static_cast<uint64_t>(value) > hi) return hi;
    return static_cast<uint64_t>(value);
  }

  uint64_t PickLength(bool allow_large) {
    uint64_t r = Uniform(0, 99);
    if (allow_large && r < 3) return Uniform(kMiB, 3 * kMiB);                     // 1-3 MiB
    if (r < 35) return Uniform(1, 64);                                            // tiny
    if (r < 60) return Clamp(Uniform(1, 3) * kPage + Delta(7), 1, kMaxFileSize);  // ~pages
    if (r < 85) return Uniform(1, 128 * 1024);
    return Uniform(128 * 1024, kMiB);
  }

  // An offset where [offset, offset + length) fits below kMaxFileSize.
  uint64_t PickOffset(uint64_t size, uint64_t length) {
    uint64_t limit = kMaxFileSize - length;
    int64_t value;
    switch (Uniform(0, 6)) {
      case 0:
        value = Uniform(0, limit);
        break;
      case 1:
        value = Uniform(0, kMaxFileSize / kPage) * kPage + Delta(17);
        break;  // 4 KiB edge
      case 2:
        value = static_cast<int64_t>(size) + Delta(8192);
        break;  // near EOF
      case 3:
        value = Uniform(0, kMaxFileSize / kPage) * kPage;
        break;  // aligned
      case 4:
        value = Uniform(0, kMaxFileSize / kMiB) * kMiB + Delta(300);
        break;  // 1 MiB edge
      case 5:
        value = static_cast<int64_t>(size) - static_cast<int64_t>(length) + Delta(4);
        break;
      default:
        value = size == 0 ? 0 : Uniform(0, size);
        break;  // inside the file
    }
    return Clamp(value, 0, limit);
  }

  OpKind PickKind() {
    // Cumulative weights out of 1000, with the SPILLFS_FSX_SKIP name of each kind.
    struct Weight {
      int upto;
      OpKind kind;
      const char* name;
    };
    static constexpr Weight kWeights[] = {
        {340, OpKind::kWrite, "write"},          {630, OpKind::kRead, "read"},
        {715, OpKind::kTruncate, "truncate"},    {760, OpKind::kFallocate, "fallocate"},
        {805, OpKind::kFallocKeep, "fallocate"}, {850, OpKind::kPunch, "punch"},
        {860, OpKind::kZeroRange, "zero"},       {870, OpKind::kZeroKeep, "zero"},
        {930, OpKind::kReopen, "reopen"},        {938, OpKind::kOpenTrunc, "otrunc"},
        {992, OpKind::kFsync, "fsync"},          {994, OpKind::kRemount, "remount"},
        {1000, OpKind::kFullCompare, "read"},
    };
    for (;;) {
      int r = static_cast<int>(Uniform(0, 999));
      for (const Weight& w : kWeights) {
        if (r < w.upto) {
          if (!Skipped(w.name)) return w.kind;
          break;
        }
      }
    }
  }

  bool Step() {
    OpKind kind = PickKind();
    int f = static_cast<int>(Uniform(0, kNumFiles - 1));
    std::vector<char>& m = model_[f];
    uint64_t size = m.size();
    current_ = OpRecord{op_, kind, f, 0, 0, size, size};
    switch (kind) {
      case OpKind::kWrite: {
        uint64_t len = PickLength(true);
        uint64_t off = PickOffset(size, len);
        current_.offset = off;
        current_.length = len;
        current_.size_after = std::max(size, off + len);
        Log();
        buf_.resize(len);
        FillData(seed_, op_, off, buf_.data(), len);
        std::string err;
        if (!PwriteAll(fds_[f], buf_.data(), len, off, &err)) return Fail(err);
        if (m.size() < off + len) m.resize(off + len, 0);
        memcpy(m.data() + off, buf_.data(), len);
        return true;
      }
      case OpKind::kRead: {
        uint64_t len = PickLength(true);
        uint64_t off = Chance(85) ? PickOffset(size, len) : size + Uniform(0, 5000);  // past EOF
        current_.offset = off;
        current_.length = len;
        Log();
        return CheckRead(f, off, len);
      }
      case OpKind::kTruncate: {
        uint64_t new_size;
        switch (Uniform(0, 4)) {
          case 0:
            new_size = size == 0 ? 0 : Uniform(0, size);
            break;  // down
          case 1:
            new_size = Clamp(size + Uniform(1, 2 * kMiB), 0, kMaxFileSize);
            break;  // up
          case 2:
            new_size = Clamp(Uniform(0, kMaxFileSize / kPage) * kPage + Delta(3), 0, kMaxFileSize);
            break;
          case 3:
            new_size = Clamp(static_cast<int64_t>(size) + Delta(5000), 0, kMaxFileSize);
            break;
          default:
            new_size = Chance(30) ? 0 : Uniform(0, kMaxFileSize);
            break;
        }
        current_.offset = new_size;
        current_.size_after = new_size;
        Log();
        if (ftruncate(fds_[f], static_cast<off_t>(new_size)) != 0) {
          return Fail(Errno("ftruncate"));
        }
        m.resize(new_size, 0);
        return true;
      }
      case OpKind::kFallocate:
      case OpKind::kFallocKeep:
      case OpKind::kPunch:
      case OpKind::kZeroRange:
      case OpKind::kZeroKeep: {
        uint64_t len = std::min<uint64_t>(PickLength(true), 4 * kMiB);
        uint64_t off = PickOffset(size, len);
        int mode = 0;
        if (kind == OpKind::kFallocKeep) mode = FALLOC_FL_KEEP_SIZE;
        if (kind == OpKind::kPunch) mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
        if (kind == OpKind::kZeroRange) mode = FALLOC_FL_ZERO_RANGE;
        if (kind == OpKind::kZeroKeep) mode = FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE;
        const bool grows = kind == OpKind::kFallocate || kind == OpKind::kZeroRange;
        current_.offset = off;
        current_.length = len;
        if (grows) current_.size_after = std::max(size, off + len);
        Log();
        if (fallocate(fds_[f], mode, static_cast<off_t>(off), static_cast<off_t>(len)) != 0) {
          return Fail(Errno(OpName(kind)));
        }
        if (grows && m.size() < off + len) m.resize(off + len, 0);
        const bool zeroes = kind == OpKind::kPunch || kind == OpKind::kZeroRange || kind == OpKind::kZeroKeep;
        if (zeroes && off < m.size()) {
          uint64_t end = std::min<uint64_t>(m.size(), off + len);
          std::fill(m.begin() + off, m.begin() + end, 0);
        }
        return true;
      }
      case OpKind::kReopen:
        Log();
        return Reopen(f, 0);
      case OpKind::kOpenTrunc:
        current_.size_after = 0;
        Log();
        if (!Reopen(f, O_TRUNC)) return false;
        m.clear();
        return true;
      case OpKind::kFsync:
        Log();
        if ((Chance(50) ? fsync(fds_[f]) : fdatasync(fds_[f])) != 0) return Fail(Errno("fsync"));
        return true;
      case OpKind::kRemount:
        current_.file = -1;
        Log();
        return DoRemount("remount");
      case OpKind::kFullCompare:
        Log();
        return CompareFile(f, "full compare");
    }
    return true;
  }

  void Log() { log_.push_back(current_); }

  bool Reopen(int f, int extra_flags) {
    if (fds_[f] >= 0 && close(fds_[f]) != 0) {
      fds_[f] = -1;
      return Fail(Errno("close"));
    }
    fds_[f] = open(PathOf(f).c_str(), O_RDWR | extra_flags);
    if (fds_[f] < 0) return Fail(Errno(("open " + PathOf(f)).c_str()));
    return true;
  }

  bool DoRemount(const char* what) {
    for (int& fd : fds_) {
      if (fd >= 0 && close(fd) != 0) return Fail(Errno("close before remount"));
      fd = -1;
    }
    std::string error;
    if (!volume_->Remount(&error)) return Fail(std::string(what) + " failed: " + error);
    for (int f = 0; f < kNumFiles; ++f) {
      fds_[f] = open(PathOf(f).c_str(), O_RDWR);
      if (fds_[f] < 0) return Fail(Errno(("open after remount " + PathOf(f)).c_str()));
    }
    return CheckSizes() && CompareAll((std::string(what) + ": full compare").c_str());
  }

  bool CheckSizes() {
    for (int f = 0; f < kNumFiles; ++f) {
      struct stat st {};
      if (fstat(fds_[f], &st) != 0) return Fail(Errno("fstat"));
      if (static_cast<uint64_t>(st.st_size) != model_[f].size()) {
        std::ostringstream msg;
        msg << "st_size of f" << f << " is " << st.st_size << " (0x" << std::hex << st.st_size << "), model says "
            << std::dec << model_[f].size() << " (0x" << std::hex << model_[f].size() << ")";
        return Fail(msg.str());
      }
    }
    return true;
  }

  bool CompareAll(const char* what) {
    for (int f = 0; f < kNumFiles; ++f) {
      if (!CompareFile(f, what)) return false;
    }
    return true;
  }

  // Reads the whole file (1 MiB at a time, then 1 byte past EOF) and compares.
  bool CompareFile(int f, const char* what) {
    uint64_t size = model_[f].size();
    for (uint64_t off = 0; off < size; off += kMiB) {
      if (!CheckRead(f, off, std::min(kMiB, size - off), what)) return false;
    }
    return CheckRead(f, size, 1, what);
  }

  // preads [off, off + len) and compares with the model (short only at EOF).
  bool CheckRead(int f, uint64_t off, uint64_t len, const char* what = "read") {
    const std::vector<char>& m = model_[f];
    uint64_t expect_len = off >= m.size() ? 0 : std::min<uint64_t>(len, m.size() - off);
    rbuf_.resize(len);
    uint64_t got = 0;
    while (got < len) {
      ssize_t r = pread(fds_[f], rbuf_.data() + got, len - got, static_cast<off_t>(off + got));
      if (r < 0) {
        if (errno == EINTR) continue;
        return Fail(Errno("pread"));
      }
      if (r == 0) break;
      got += static_cast<uint64_t>(r);
    }
    if (got != expect_len) {
      std::ostringstream msg;
      msg << what << ": f" << f << " pread(off=0x" << std::hex << off << ", len=0x" << len << ") returned 0x" << got
          << " bytes in all, expected 0x" << expect_len << " (file size 0x" << m.size() << ")";
      if (got < expect_len && memcmp(rbuf_.data(), m.data() + off, got) == 0) {
        msg << "; the bytes that did come back match";
      }
      return Fail(msg.str());
    }
    if (got == 0 || memcmp(rbuf_.data(), m.data() + off, got) == 0) return true;
    uint64_t first = 0;
    while (rbuf_[first] == m[off + first]) ++first;
    uint64_t bad = 0, last = first, actual_zero = 0;
    for (uint64_t i = first; i < got; ++i) {
      if (rbuf_[i] != m[off + i]) {
        ++bad;
        last = i;
        if (rbuf_[i] == 0) ++actual_zero;
      }
    }
    uint64_t pos = off + first;
    std::ostringstream msg;
    msg << what << ": f" << f << " data mismatch reading off=0x" << std::hex << off << " len=0x" << got
        << ": first bad byte at file offset 0x" << pos << ", last at 0x" << off + last << std::dec << "; " << bad
        << " bytes differ (" << actual_zero << " of them read as 0)\n  expected:";
    for (uint64_t i = first; i < std::min(got, first + 16); ++i) {
      char hex[4];
      snprintf(hex, sizeof hex, " %02x", static_cast<unsigned char>(m[off + i]));
      msg << hex;
    }
    msg << "\n  actual:  ";
    for (uint64_t i = first; i < std::min(got, first + 16); ++i) {
      char hex[4];
      snprintf(hex, sizeof hex, " %02x", static_cast<unsigned char>(rbuf_[i]));
      msg << hex;
    }
    msg << "\n  last op that changed f" << f << " at 0x" << std::hex << pos << ": " << std::dec;
    bool found = false;
    for (auto it = log_.rbegin(); it != log_.rend(); ++it) {
      if (it->Touches(f, pos)) {
        msg << it->Describe();
        found = true;
        break;
      }
    }
    if (!found) msg << "(none: the byte should be 0, a hole never written)";
    // If the bytes actually read equal what an earlier write put there, say which.
    for (auto it = log_.rbegin(); it != log_.rend(); ++it) {
      if (it->kind != OpKind::kWrite || it->file != f || !it->Touches(f, pos)) continue;
      char c;
      FillData(seed_, it->index, pos, &c, 1);
      if (c == rbuf_[first]) {
        msg << "\n  the actual byte equals what " << it->Describe() << " wrote (stale data?)";
        break;
      }
    }
    return Fail(msg.str());
  }

  bool PwriteAll(int fd, const char* data, size_t len, uint64_t off, std::string* err) {
    while (len > 0) {
      ssize_t w = pwrite(fd, data, len, static_cast<off_t>(off));
      if (w < 0) {
        if (errno == EINTR) continue;
        *err = Errno("pwrite");
        return false;
      }
      if (w == 0) {
        *err = "pwrite returned 0";
        return false;
      }
      data += w;
      len -= static_cast<size_t>(w);
      off += static_cast<uint64_t>(w);
    }
    return true;
  }

  bool Fail(const std::string& what) {
    const size_t tail = EnvU64("SPILLFS_FSX_LOG_TAIL", kLogTail);
    std::ostringstream msg;
    msg << "fsx seed=" << seed_ << " op=" << op_ << " (" << OpName(current_.kind) << "): " << what
        << "\nreproduce: SPILLFS_FSX_SEED=" << seed_ << " SPILLFS_FSX_OPS=" << num_ops_ << "\nlast "
        << std::min(tail, log_.size()) << " ops of " << log_.size() << ":\n";
    size_t start = log_.size() > tail ? log_.size() - tail : 0;
    for (size_t i = start; i < log_.size(); ++i) msg << "  " << log_[i].Describe() << "\n";
    ADD_FAILURE() << msg.str();
    return false;
  }

  MountedVolume* volume_;
  uint64_t seed_;
  uint64_t num_ops_;
  std::mt19937_64 rng_;
  uint64_t op_ = 0;
  OpRecord current_;
  std::vector<std::vector<char>> model_;
  std::vector<int> fds_;
  std::vector<OpRecord> log_;
  std::vector<char> buf_, rbuf_;
  std::set<std::string> skip_;
  std::map<std::string, std::pair<int, double>> profile_;  // SPILLFS_FSX_PROFILE
};

const std::vector<uint64_t>& FsxSeedList() {
  static const std::vector<uint64_t> seeds = {1, 2, 3, 0x5eed5eedull};
  return seeds;
}

class FsxTest : public ::testing::TestWithParam<uint64_t> {};

TEST_P(FsxTest, RandomOpsMatchModel) {
  uint64_t seed = EnvU64("SPILLFS_FSX_SEED", GetParam());
  if (getenv("SPILLFS_FSX_SEED") != nullptr && GetParam() != FsxSeedList().front()) {
    GTEST_SKIP() << "SPILLFS_FSX_SEED given: only the first instance runs it";
  }
  uint64_t ops = EnvU64("SPILLFS_FSX_OPS", kDefaultOps);
  std::unique_ptr<MountedVolume> volume;
  try {
    volume = std::make_unique<MountedVolume>();
  } catch (const std::exception& e) {
    FAIL() << "could not create and mount a volume: " << e.what();
  }
  printf("fsx: seed=%" PRIu64 " ops=%" PRIu64 " mount=%s\n", seed, ops, volume->mountpoint().c_str());
  fflush(stdout);
  Fsx fsx(volume.get(), seed, ops);
  EXPECT_TRUE(fsx.Run()) << "seed=" << seed;
}

INSTANTIATE_TEST_SUITE_P(Seeds, FsxTest, ::testing::ValuesIn(FsxSeedList()),
                         [](const ::testing::TestParamInfo<uint64_t>& info) {
                           return "seed_" + std::to_string(info.param);
                         });

}  // namespace
}  // namespace spillfs::testing
