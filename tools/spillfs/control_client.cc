#include "control_client.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cstring>

namespace spillfs::cli {

std::string ControlPath(const std::string& mountpoint) {
  std::string base = mountpoint;
  if (!base.empty() && base.back() == '/') base.pop_back();
  return fmt::format("{}/{}/{}", base, kControlDir, kControlFile);
}

Result<nlohmann::json> ControlRequest(const std::string& mountpoint, const nlohmann::json& request) {
  const std::string path = ControlPath(mountpoint);
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT) {
      return Status::Error(ENOTSUP, fmt::format("the spillfs mount at {} has no control file {} (a "
                                                "daemon without the control interface?)",
                                                mountpoint, path));
    }
    return Status::Error(e, fmt::format("cannot open {}: {}", path, std::strerror(e)));
  }
  std::string text = request.dump();
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = pwrite(fd, text.data() + done, text.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = n < 0 ? errno : EIO;
      close(fd);
      return Status::Error(e, fmt::format("cannot send the request to {}: {}", path, std::strerror(e)));
    }
    done += static_cast<size_t>(n);
  }
  std::string reply;
  constexpr size_t kChunk = 256 << 10;
  for (;;) {
    size_t at = reply.size();
    reply.resize(at + kChunk);
    ssize_t n = pread(fd, reply.data() + at, kChunk, static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) {
      reply.resize(at);
      continue;
    }
    if (n < 0) {
      int e = errno;
      close(fd);
      return Status::Error(e, fmt::format("cannot read the reply from {}: {}", path, std::strerror(e)));
    }
    reply.resize(at + static_cast<size_t>(n));
    if (static_cast<size_t>(n) < kChunk) break;
  }
  close(fd);
  nlohmann::json parsed = nlohmann::json::parse(reply, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object() || !parsed.contains("ok")) {
    return Status::IOError(fmt::format("malformed reply from {} ({} bytes)", path, reply.size()));
  }
  if (parsed.value("ok", false)) {
    if (!parsed.contains("result")) return Status::IOError(fmt::format("reply from {} has no result", path));
    return std::move(parsed["result"]);
  }
  int code = EIO;
  if (parsed.contains("errno") && parsed["errno"].is_number_integer()) code = parsed["errno"].get<int>();
  if (code <= 0) code = EIO;
  std::string message = parsed.contains("error") && parsed["error"].is_string() ? parsed["error"].get<std::string>()
                                                                                : std::string(std::strerror(code));
  return Status::Error(code, message);
}

}  // namespace spillfs::cli
