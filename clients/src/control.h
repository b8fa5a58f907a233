// The client's handle of MOUNTPOINT/.spillfs/control: the request loop of
// spillfs/common/control_protocol.h (control::Channel) behind the library's
// error convention (0 or -errno, the message for spill_last_error()).
//
// One ControlChannel is one open handle of the control file. The daemon ties
// leases to the handle: blocks returned by "layout" are not reused and space
// from "reserve" stays reserved while it is open, so a channel's lifetime is
// the lease's.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "spillfs/common/control_protocol.h"

namespace spillfs::client {

class ControlChannel {
 public:
  // Opens `control_path` O_RDWR. Returns 0 or -errno (message set).
  static int Open(const std::string& control_path, std::unique_ptr<ControlChannel>* out);
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  // Sends one request and stores the reply's "result" in *result. Returns 0,
  // or -errno with the daemon's message (or what went wrong on the way).
  // Requests on one channel are serialized.
  int Request(const nlohmann::json& request, nlohmann::json* result);
  // The same, leaving the reply text unparsed (for replies worth a faster
  // parser than a DOM). ParseReply() turns such a text into the result.
  int RequestText(const nlohmann::json& request, std::string* reply);
  // The same with the request already serialized (`op` names it in messages).
  int RequestText(std::string text, const std::string& op, std::string* reply);
  int ParseReply(const std::string& op, const std::string& reply, nlohmann::json* result) const;

 private:
  explicit ControlChannel(control::Channel channel) : channel_(std::move(channel)) {}
  control::Channel channel_;
  std::mutex mu_;
};

}  // namespace spillfs::client
