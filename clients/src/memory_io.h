// Memory I/O (the kMemoryIo backend of segment files): for a caller who may
// not open the volume's data area (not root), the daemon moves the bytes
// between the data area and the caller's staging buffers, which lie in a
// memfd it maps (the shareable PinnedPool). One request a step of pieces:
//   mem_write  {"fd", "memfd", "pieces": [memfd offset, file offset, length, ...],
//               "size", "dedup"} -> {"ino", "written_bytes", "mapped_bytes"}
//   mem_read   {"fd", "memfd", "pieces": [...]} -> {"ino", "size"}
// `fd` is the caller's descriptor of the file through the mount: the daemon
// checks through /proc that this caller holds it open for the access asked,
// so it gives no access the mount would refuse (docs/design.md, "Memory I/O").
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "control.h"
#include "file_impl.h"

namespace spillfs::client {

struct MemoryReply {
  int rc = 0;  // 0 or -errno, with the daemon's message
  std::string message;
  uint64_t written_bytes = 0;  // mem_write: to the data area
  uint64_t mapped_bytes = 0;   // mem_write: shared with blobs the volume held
  uint64_t size = 0;           // mem_read: the file's size
};

// The request text of `op` over `pieces` (flat triples as above).
std::string MemoryRequest(const char* op, int fd, int memfd, const std::vector<uint64_t>& pieces,
                          const std::string& more_fields = "");
// Sends it on `channel` and parses the reply (any thread; one request at a
// time a channel).
MemoryReply SendMemoryRequest(ControlChannel* channel, const std::string& text, const std::string& op);
// The steps of one request, in flight: its pieces cut into steps of at most
// a share of the staging pool (a piece takes a whole buffer, however
// small), each sent on a control channel of its own
// (requests on one are serialized), up to `depth` (commit_depth) at once,
// their replies taken oldest first. Used by the request's thread only.
class MemorySteps {
 public:
  MemorySteps(std::string mountpoint, uint64_t pool_bytes, uint64_t chunk_bytes);
  ~MemorySteps();  // waits for the replies still to come
  MemorySteps(const MemorySteps&) = delete;
  MemorySteps& operator=(const MemorySteps&) = delete;

  // The end of the step of pieces from `first` (at least one piece).
  size_t StepEnd(const Plan& plan, size_t first) const;
  bool full() const { return in_flight_.size() >= channels_.size(); }
  bool empty() const { return in_flight_.empty(); }
  // Sends `text` (of `op`), the step of pieces [first, last); 0 or -errno.
  int Send(std::string text, const char* op, size_t first, size_t last);
  // REQUIRES: !empty(). Waits for the oldest step's reply; its pieces.
  MemoryReply WaitOldest(size_t* first, size_t* last);

 private:
  struct InFlight {
    std::future<MemoryReply> reply;
    size_t first, last;
  };
  const std::string control_path_;
  uint64_t step_bytes_ = 0;
  size_t step_pieces_ = 0;
  std::vector<std::unique_ptr<ControlChannel>> channels_;  // opened at first use
  size_t next_channel_ = 0;
  std::deque<InFlight> in_flight_;
};

}  // namespace spillfs::client
