#include "memory_io.h"

#include <algorithm>
#include <cerrno>

#include "client_impl.h"
#include "error.h"
#include "file_settings.h"
#include "spillfs/common/control_protocol.h"
#include "spillfs/common/rounding.h"

namespace spillfs::client {

std::string MemoryRequest(const char* op, int fd, int memfd, const std::vector<uint64_t>& pieces,
                          const std::string& more_fields) {
  std::string text = std::string(R"({"op":")") + op + R"(","fd":)" + std::to_string(fd) + R"(,"memfd":)" +
                     std::to_string(memfd) + R"(,"pieces":[)";
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (i > 0) text.push_back(',');
    text += std::to_string(pieces[i]);
  }
  text += "]" + more_fields + "}";
  return text;
}

MemoryReply SendMemoryRequest(ControlChannel* channel, const std::string& text, const std::string& op) {
  MemoryReply out;
  std::string reply;
  json result;
  int rc = channel->RequestText(text, op, &reply);
  if (rc == 0) rc = channel->ParseReply(op, reply, &result);
  if (rc == 0 && !result.is_object()) rc = Fail(EPROTO, "malformed " + op + " reply: " + reply.substr(0, 200));
  if (rc != 0) {
    out.rc = rc;
    out.message = LastError();
    return out;
  }
  GetU64(result, "written_bytes", &out.written_bytes);
  GetU64(result, "mapped_bytes", &out.mapped_bytes);
  GetU64(result, "size", &out.size);
  return out;
}

MemorySteps::MemorySteps(std::string mountpoint, uint64_t pool_bytes, uint64_t chunk_bytes)
    : control_path_(spillfs::control::ControlPath(mountpoint)) {
  const size_t depth = std::max<size_t>(1, Settings().commit_depth.load());
  const uint64_t fit = RoundDown(pool_bytes / (depth + 1), chunk_bytes);
  step_bytes_ = std::max(chunk_bytes, std::min(Settings().commit_bytes.load(), fit));
  step_pieces_ = std::max<size_t>(1, pool_bytes / chunk_bytes / (depth + 1));
  channels_.resize(depth);
}

MemorySteps::~MemorySteps() {
  for (InFlight& step : in_flight_) step.reply.wait();
}

size_t MemorySteps::StepEnd(const Plan& plan, size_t first) const {
  size_t last = first;
  uint64_t bytes = 0;
  while (last < plan.pieces.size() && last - first < step_pieces_) {
    const uint64_t n = plan.pieces[last].end - plan.pieces[last].start;
    if (last > first && bytes + n > step_bytes_) break;
    bytes += n;
    ++last;
  }
  return last;
}

int MemorySteps::Send(std::string text, const char* op, size_t first, size_t last) {
  std::unique_ptr<ControlChannel>& channel = channels_[next_channel_];
  next_channel_ = (next_channel_ + 1) % channels_.size();
  if (!channel) {
    if (int rc = ControlChannel::Open(control_path_, &channel); rc != 0) return rc;
  }
  ControlChannel* c = channel.get();
  in_flight_.push_back(
      InFlight{std::async(std::launch::async,
                          [c, text = std::move(text), op = std::string(op)] { return SendMemoryRequest(c, text, op); }),
               first, last});
  return 0;
}

MemoryReply MemorySteps::WaitOldest(size_t* first, size_t* last) {
  InFlight step = std::move(in_flight_.front());
  in_flight_.pop_front();
  *first = step.first;
  *last = step.last;
  return step.reply.get();
}

}  // namespace spillfs::client
