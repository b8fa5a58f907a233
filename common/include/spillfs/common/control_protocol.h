// The control protocol of a mount, written once for the daemon
// (fs/control/include/spillfs/control/control_plane.h), the spillfs tools and the client library.
//
// The mount root holds a virtual directory MOUNT/.spillfs with two files:
//   stats    (0444) Prometheus text of the `stat` object.
//   control  (0666) open O_RDWR, pwrite one JSON request at offset 0, then
//            pread the reply from offset 0 until a short read. A caller
//            that is not root may send only volume, stat, mem_write and
//            mem_read (kUnprivilegedOps); any other op is refused (EACCES).
//            The reply is worked out at the first read after a request:
//              {"ok":true,"result":...}
//              {"ok":false,"errno":N,"error":"message"}
//
// Requests ({"op":OP, fields...}; docs/design.md has the table of results):
//   stat     none                                    the volume object (stat_keys.h)
//   volume   none                                    the superblock's settings alone: uuid,
//                                                    format_version, block_size, checksums,
//                                                    dedup (no scan: what a client opens with)
//   ls       paths (list), long, extents, directory  list of entries
//   du       path                                    usage of the tree at path
//   layout   path                                    extents with block checksums;
//                                                    pins the handle (lease)
//   reserve  length                                  fresh extents, held by the handle
//   commit   path, file_offset, length, size,        maps what the handle reserved;
//            block_checksums, [units: file offset,   whole 256 KiB units named in
//            low, high of XXH3-128 per unit]         units become dedup blobs
//   dedup    path, file_offset (256 KiB multiple),   needed (per unit: 1 = the client
//            hashes (low, high per 256 KiB unit);    writes it, 0 = mapped by
//            or units (as commit's)                  reference), unit_bytes, mapped_bytes
//   mem_write fd, memfd, pieces (memory offset,     ino, written_bytes,
//            file offset, length, ...), size, dedup  mapped_bytes: the daemon writes
//                                                    the caller's memfd into the file
//                                                    of the caller's fd
//   mem_read fd, memfd, pieces                       ino, size: the file's bytes
//                                                    into the memfd
// Both take their units compact too: unit_runs (offset, count of consecutive
// units, ...) with unit_hashes (32 hex digits a unit: the hash's 16 bytes,
// low then high as they lie in memory); dedup's needed is then a string of
// '1' and '0' (docs/design.md, "The control protocol"). mem_write and
// mem_read name descriptors of the caller's process: the daemon checks them
// in /proc (docs/design.md, "Memory I/O").
//
// A handle keeps the bytes of its requests: a write at offset 0 overwrites
// the start and leaves the rest, so a request shorter than an earlier one on
// the same handle is padded with blanks over it (JSON allows trailing white
// space). Channel does this; a handle that is a lease (layout, reserve) must
// stay open across its requests, which is why a channel is reused.
//
// Header-only, with no dependency beyond POSIX, nlohmann_json and Status, so
// the self-contained client library can use it.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "spillfs/common/status.h"

namespace spillfs::control {

// Names under a mount, and the mount's file system type in mountinfo.
inline constexpr char kDirName[] = ".spillfs";
inline constexpr char kControlName[] = "control";
inline constexpr char kStatsName[] = "stats";
inline constexpr char kFsType[] = "fuse.spillfs";

// The longest request the daemon accepts (EFBIG past it).
inline constexpr uint64_t kMaxRequestBytes = 16 << 20;

// The protocol's version, in every `volume` and `stat` reply as
// "protocol_version". A client refuses a daemon of another version (or of
// none: those before it), naming both (CheckProtocol): requests and replies
// change shape between versions, and a misread reply could map the wrong
// blocks. Raise it with any change a client of the previous one would misread.
inline constexpr uint64_t kProtocolVersion = 1;
inline constexpr char kProtocolVersionKey[] = "protocol_version";

// Every op the daemon answers.
namespace op {
inline constexpr char kStat[] = "stat";
inline constexpr char kVolume[] = "volume";
inline constexpr char kLs[] = "ls";
inline constexpr char kDu[] = "du";
inline constexpr char kLayout[] = "layout";
inline constexpr char kReserve[] = "reserve";
inline constexpr char kCommit[] = "commit";
inline constexpr char kDedup[] = "dedup";
inline constexpr char kMemWrite[] = "mem_write";
inline constexpr char kMemRead[] = "mem_read";
}  // namespace op

// The ops a caller that is not root may send: the others hand out the data
// area (layout, reserve) or trust what the caller says of it (commit's
// checksums, dedup's hashes), or read names the caller may not see (ls, du).
inline constexpr const char* kUnprivilegedOps[] = {op::kVolume, op::kStat, op::kMemWrite, op::kMemRead};

// The most pieces one mem_write or mem_read request may name (E2BIG past
// it): each costs the daemon work and memory before anything is checked
// against the file.
inline constexpr uint64_t kMaxMemoryPieces = 1 << 20;
// The largest memfd memory I/O maps (EINVAL past it); a request's pieces add
// up to at most its size (E2BIG), which bounds one request's work.
inline constexpr uint64_t kMaxSharedMemoryBytes = 64ull << 30;

// The keys of the envelope: the request's op, and the reply's.
namespace key {
inline constexpr char kOp[] = "op";
inline constexpr char kOk[] = "ok";
inline constexpr char kResult[] = "result";
inline constexpr char kErrno[] = "errno";
inline constexpr char kError[] = "error";
}  // namespace key

// MOUNTPOINT/.spillfs/control and MOUNTPOINT/.spillfs/stats.
inline std::string FilePath(std::string_view mountpoint, std::string_view name) {
  std::string path(mountpoint);
  if (!path.empty() && path.back() == '/') path.pop_back();
  return path + "/" + kDirName + "/" + std::string(name);
}
inline std::string ControlPath(std::string_view mountpoint) { return FilePath(mountpoint, kControlName); }
inline std::string StatsPath(std::string_view mountpoint) { return FilePath(mountpoint, kStatsName); }

// ---- the daemon's side: reply objects ----

inline nlohmann::json OkReply(nlohmann::json result) {
  return nlohmann::json{{key::kOk, true}, {key::kResult, std::move(result)}};
}
inline nlohmann::json ErrorReply(const Status& status) {
  return nlohmann::json{{key::kOk, false}, {key::kErrno, status.code()}, {key::kError, status.message()}};
}
// A reply's text; bytes that are not UTF-8 (names are bytes) become U+FFFD.
inline std::string ReplyText(const nlohmann::json& reply) {
  return reply.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// ---- the client's side ----

// OK when the `volume` (or `stat`) reply `info` from the control file `from`
// names this client's protocol version; EPROTO naming both versions otherwise.
inline Status CheckProtocol(const nlohmann::json& info, const std::string& from) {
  auto it = info.is_object() ? info.find(kProtocolVersionKey) : info.end();
  std::string theirs = "none (a spillfs daemon older than the versioned protocol)";
  if (it != info.end() && it->is_number_unsigned()) {
    if (it->get<uint64_t>() == kProtocolVersion) return Status::OK();
    theirs = std::to_string(it->get<uint64_t>());
  }
  return Status::Error(EPROTO, "the daemon behind " + from + " speaks control protocol version " + theirs +
                                   ", this client version " + std::to_string(kProtocolVersion) +
                                   ": use a client library and a daemon of the same spillfs release");
}

// The op of a request, for messages ("?" when it has none).
inline std::string OpOf(const nlohmann::json& request) {
  auto it = request.find(key::kOp);
  return it != request.end() && it->is_string() ? it->get<std::string>() : std::string("?");
}

// The reply text's result, or its error as a Status (the daemon's errno and
// message); EPROTO when the text is not a reply. `from` names the control
// file in messages.
inline Result<nlohmann::json> ParseReply(std::string_view text, const std::string& from) {
  nlohmann::json reply = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (reply.is_discarded() || !reply.is_object() || !reply.contains(key::kOk)) {
    return Status::Error(EPROTO, "malformed reply from " + from + " (" + std::to_string(text.size()) + " bytes)");
  }
  if (reply[key::kOk].is_boolean() && reply[key::kOk].get<bool>()) {
    if (!reply.contains(key::kResult)) return Status::Error(EPROTO, "reply from " + from + " has no result");
    return std::move(reply[key::kResult]);
  }
  int code = EIO;
  if (reply.contains(key::kErrno) && reply[key::kErrno].is_number_integer()) code = reply[key::kErrno].get<int>();
  if (code <= 0) code = EIO;
  std::string message = reply.contains(key::kError) && reply[key::kError].is_string()
                            ? reply[key::kError].get<std::string>()
                            : std::string(std::strerror(code));
  return Status::Error(code, std::move(message));
}

// One open handle of a control file, and the request loop. Not thread-safe:
// callers that share a channel serialize its requests.
class Channel {
 public:
  // Opens `control_path` O_RDWR. A missing file is ENOTSUP (not a spillfs
  // mount, or a daemon without the control interface).
  static Result<Channel> Open(const std::string& control_path) {
    int fd = open(control_path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd >= 0) return Channel(fd, control_path);
    int e = errno;
    if (e == ENOENT) {
      return Status::Error(ENOTSUP, "no control file " + control_path +
                                        " (not a spillfs mount, or a daemon without the control interface)");
    }
    std::string why = e == EACCES || e == EPERM ? " (daemons before memory I/O keep the control file for root)" : "";
    return Status::Error(e, "cannot open " + control_path + why + ": " + std::strerror(e));
  }

  Channel(Channel&& other) noexcept
      : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)), longest_(other.longest_) {}
  Channel& operator=(Channel&& other) noexcept {
    if (this != &other) {
      Close();
      fd_ = std::exchange(other.fd_, -1);
      path_ = std::move(other.path_);
      longest_ = other.longest_;
    }
    return *this;
  }
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;
  ~Channel() { Close(); }

  const std::string& path() const { return path_; }

  // Sends `request` and returns the reply's result (or its error).
  Result<nlohmann::json> Request(const nlohmann::json& request) {
    std::string op = OpOf(request);
    auto text = RequestText(request.dump(), op);
    if (!text.ok()) return text.status();
    return ParseReply(*text, path_);
  }

  // Sends the serialized request `text` (`op` names it in messages) and
  // returns the reply text unparsed, for replies worth a faster parser than
  // a DOM (ParseReply reads it otherwise).
  Result<std::string> RequestText(std::string text, std::string_view op) {
    if (text.size() < longest_) text.append(longest_ - text.size(), ' ');
    longest_ = text.size();
    size_t done = 0;
    while (done < text.size()) {
      ssize_t n = pwrite(fd_, text.data() + done, text.size() - done, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        int e = n < 0 ? errno : EIO;
        return Status::Error(e, "cannot send a " + std::string(op) + " request to " + path_ + ": " + std::strerror(e));
      }
      done += static_cast<size_t>(n);
    }
    // The daemon sends at most what a read asks for; a short read ends the
    // reply. Big chunks: a layout reply is ~2.6 MB a GiB of file.
    constexpr size_t kChunk = 1 << 20;
    std::string reply;
    for (;;) {
      size_t at = reply.size();
      reply.resize(at + kChunk);
      ssize_t n = pread(fd_, reply.data() + at, kChunk, static_cast<off_t>(at));
      if (n < 0 && errno == EINTR) {
        reply.resize(at);
        continue;
      }
      if (n < 0) {
        int e = errno;
        return Status::Error(e, "cannot read the reply from " + path_ + ": " + std::strerror(e));
      }
      reply.resize(at + static_cast<size_t>(n));
      if (static_cast<size_t>(n) < kChunk) break;
    }
    return reply;
  }

 private:
  Channel(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

  int fd_ = -1;
  std::string path_;
  size_t longest_ = 0;  // the longest request written (later ones are padded to it)
};

// One request on a handle of its own (the tools' way: no lease outlives it).
inline Result<nlohmann::json> Request(const std::string& mountpoint, const nlohmann::json& request) {
  auto channel = Channel::Open(ControlPath(mountpoint));
  if (!channel.ok()) return channel.status();
  return channel->Request(request);
}

}  // namespace spillfs::control
