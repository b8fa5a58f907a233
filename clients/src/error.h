// The thread-local error message behind spill_last_error().
#pragma once

#include <string>

namespace spillfs::client {

// Records `message` for this thread and returns -code (code > 0), so that
// `return Fail(EIO, "...")` reads naturally.
int Fail(int code, std::string message);
// Clears the message (at the start of each API call).
void ClearError();
const std::string& LastError();

// "message: strerror(code)"
std::string WithErrno(const std::string& message, int code);

}  // namespace spillfs::client
