#include "spillfs/status.h"

#include <cstring>

namespace spillfs {

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string out = std::strerror(code_);
  if (!message_.empty()) out += ": " + message_;
  return out;
}

Status Status::WithContext(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, message_.empty() ? context : context + ": " + message_);
}

}  // namespace spillfs
