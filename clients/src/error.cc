#include "error.h"

#include <cstring>

namespace spillfs::client {
namespace {
thread_local std::string g_error;
}

int Fail(int code, std::string message) {
  if (code <= 0) code = EIO;
  g_error = std::move(message);
  return -code;
}

void ClearError() { g_error.clear(); }

const std::string& LastError() { return g_error; }

std::string WithErrno(const std::string& message, int code) { return message + ": " + std::strerror(code); }

}  // namespace spillfs::client
