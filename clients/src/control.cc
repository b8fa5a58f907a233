#include "control.h"

#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
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

// Every entry of /proc/self/mountinfo, in its order.
std::vector<MountInfo> Mounts() {
  std::vector<MountInfo> out;
  std::ifstream in("/proc/self/mountinfo");
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
    out.push_back(MountInfo{Unescape(parts[4]), Unescape(parts[dash + 1]), Unescape(parts[dash + 2])});
  }
  return out;
}

}  // namespace

std::optional<MountInfo> FindMount(const std::string& canonical_path) {
  std::optional<MountInfo> found;
  for (MountInfo& m : Mounts()) {
    if (m.mountpoint == canonical_path) found = std::move(m);
  }
  return found;
}

std::optional<MountInfo> FindMountHolding(const std::string& canonical_path) {
  std::optional<MountInfo> found;
  for (MountInfo& m : Mounts()) {
    const std::string& mp = m.mountpoint;
    const bool holds = mp == "/" || canonical_path == mp ||
                       (canonical_path.size() > mp.size() && canonical_path.compare(0, mp.size(), mp) == 0 &&
                        canonical_path[mp.size()] == '/');
    // The longest; of equal ones the last (stacked mounts: the top one).
    if (holds && (!found || mp.size() >= found->mountpoint.size())) found = std::move(m);
  }
  return found;
}

int ControlChannel::Open(const std::string& control_path, std::unique_ptr<ControlChannel>* out) {
  int fd = open(control_path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT) {
      return Fail(ENOTSUP, "no control file " + control_path +
                               " (not a spillfs mount, or a daemon without the control interface)");
    }
    if (e == EACCES || e == EPERM) {
      return Fail(
          e, WithErrno("cannot open " + control_path + " (the direct path is for root, like the backing store)", e));
    }
    return Fail(e, WithErrno("cannot open " + control_path, e));
  }
  out->reset(new ControlChannel(fd, control_path));
  return 0;
}

ControlChannel::~ControlChannel() {
  if (fd_ >= 0) close(fd_);
}

namespace {
std::string OpOf(const nlohmann::json& request) {
  auto it = request.find("op");
  return it != request.end() && it->is_string() ? it->get<std::string>() : std::string("?");
}
}  // namespace

int ControlChannel::Request(const nlohmann::json& request, nlohmann::json* result) {
  std::string reply;
  int rc = RequestText(request, &reply);
  if (rc != 0) return rc;
  return ParseReply(OpOf(request), reply, result);
}

int ControlChannel::RequestText(const nlohmann::json& request, std::string* reply_out) {
  return RequestText(request.dump(), OpOf(request), reply_out);
}

int ControlChannel::RequestText(std::string text, const std::string& op, std::string* reply_out) {
  std::lock_guard lock(mu_);
  // The daemon overwrites the request bytes it is sent at their offset; a
  // shorter request must cover what a longer one left (JSON allows trailing
  // white space).
  if (text.size() < longest_) text.append(longest_ - text.size(), ' ');
  longest_ = text.size();
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = pwrite(fd_, text.data() + done, text.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = n < 0 ? errno : EIO;
      return Fail(e, WithErrno("cannot send a " + op + " request to " + path_, e));
    }
    done += static_cast<size_t>(n);
  }
  std::string reply;
  constexpr size_t kChunk = 1 << 20;
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
      return Fail(e, WithErrno("cannot read the reply from " + path_, e));
    }
    reply.resize(at + static_cast<size_t>(n));
    if (static_cast<size_t>(n) < kChunk) break;  // a short read ends the reply
  }
  *reply_out = std::move(reply);
  return 0;
}

int ControlChannel::ParseReply(const std::string& op, const std::string& reply, nlohmann::json* result) const {
  nlohmann::json parsed = nlohmann::json::parse(reply, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object() || !parsed.contains("ok")) {
    return Fail(EPROTO, "malformed reply from " + path_ + " (" + std::to_string(reply.size()) + " bytes) to " + op);
  }
  if (parsed["ok"].is_boolean() && parsed["ok"].get<bool>()) {
    if (!parsed.contains("result")) return Fail(EPROTO, "reply from " + path_ + " has no result");
    *result = std::move(parsed["result"]);
    return 0;
  }
  int code = EIO;
  if (parsed.contains("errno") && parsed["errno"].is_number_integer()) code = parsed["errno"].get<int>();
  if (code <= 0) code = EIO;
  std::string message = parsed.contains("error") && parsed["error"].is_string() ? parsed["error"].get<std::string>()
                                                                                : std::string(std::strerror(code));
  return Fail(code, "spillfs " + op + ": " + message);
}

}  // namespace spillfs::client
