#include "control.h"

#include <cctype>
#include <fstream>
#include <sstream>
#include <vector>

#include "error.h"

namespace spillfs::client {
namespace {

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string Unescape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && std::isdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isdigit(static_cast<unsigned char>(s[i + 2])) && std::isdigit(static_cast<unsigned char>(s[i + 3]))) {
      out.push_back(static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

}  // namespace

std::optional<MountInfo> FindMount(const std::string& canonical_path) {
  std::ifstream in("/proc/self/mountinfo");
  std::optional<MountInfo> found;
  std::string line;
  while (std::getline(in, line)) {
    // id parent major:minor root mountpoint options [optional...] - fstype source superopts
    std::istringstream fields(line);
    std::vector<std::string> parts;
    std::string part;
    while (fields >> part) parts.push_back(part);
    size_t dash = 0;
    for (size_t i = 6; i < parts.size(); ++i) {
      if (parts[i] == "-") {
        dash = i;
        break;
      }
    }
    if (parts.size() < 5 || dash == 0 || dash + 2 >= parts.size()) continue;
    std::string mountpoint = Unescape(parts[4]);
    if (mountpoint != canonical_path) continue;
    found = MountInfo{mountpoint, Unescape(parts[dash + 1]), Unescape(parts[dash + 2])};
  }
  return found;
}

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
