#include "control.h"

#include "error.h"

namespace spillfs::client {

int ControlChannel::Open(const std::string& control_path, std::unique_ptr<ControlChannel>* out) {
  auto channel = control::Channel::Open(control_path);
  if (!channel.ok()) return Fail(channel.status().code(), channel.status().message());
  out->reset(new ControlChannel(std::move(channel).value()));
  return 0;
}

int ControlChannel::Request(const nlohmann::json& request, nlohmann::json* result) {
  std::string reply;
  int rc = RequestText(request, &reply);
  if (rc != 0) return rc;
  return ParseReply(control::OpOf(request), reply, result);
}

int ControlChannel::RequestText(const nlohmann::json& request, std::string* reply) {
  return RequestText(request.dump(), control::OpOf(request), reply);
}

int ControlChannel::RequestText(std::string text, const std::string& op, std::string* reply) {
  std::lock_guard lock(mu_);
  auto sent = channel_.RequestText(std::move(text), op);
  if (!sent.ok()) return Fail(sent.status().code(), sent.status().message());
  *reply = std::move(sent).value();
  return 0;
}

int ControlChannel::ParseReply(const std::string& op, const std::string& reply, nlohmann::json* result) const {
  auto parsed = control::ParseReply(reply, channel_.path());
  if (!parsed.ok()) return Fail(parsed.status().code(), "spillfs " + op + ": " + parsed.status().message());
  *result = std::move(parsed).value();
  return 0;
}

}  // namespace spillfs::client
