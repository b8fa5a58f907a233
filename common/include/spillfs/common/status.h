// Status and Result<T>: errors carried as values across every spillfs layer.
//
// A Status is either OK or an error with an errno-style code and a message. The
// filesystem layer returns the exact errno ext4 would give (ENOENT, ENOSPC, ...);
// lower layers use EIO/EINVAL/... with a message that says what went wrong. The
// FUSE adapter turns a Status into fuse_reply_err(code) and nothing else, so no
// exception ever crosses the FUSE boundary.
#pragma once

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>
#include <variant>

namespace spillfs {

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK

  static Status OK() { return Status(); }
  // An error with an errno code (must be > 0) and a human-readable message.
  static Status Error(int code, std::string message) { return Status(code, std::move(message)); }
  static Status IOError(std::string message) { return Status(EIO, std::move(message)); }
  static Status Invalid(std::string message) { return Status(EINVAL, std::move(message)); }
  static Status Corruption(std::string message) { return Status(EUCLEAN, "corruption: " + std::move(message)); }
  static Status NotFound(std::string message = "not found") { return Status(ENOENT, std::move(message)); }
  static Status NoSpace(std::string message = "no space left on volume") { return Status(ENOSPC, std::move(message)); }

  bool ok() const { return code_ == 0; }
  bool IsNotFound() const { return code_ == ENOENT; }
  // errno value; 0 when OK.
  int code() const { return code_; }
  const std::string& message() const { return message_; }
  // "OK" or "<strerror>: <message>".
  std::string ToString() const {
    if (ok()) return "OK";
    std::string out = std::strerror(code_);
    if (!message_.empty()) out += ": " + message_;
    return out;
  }

  // Returns a copy with `context` prepended to the message ("context: message").
  Status WithContext(const std::string& context) const {
    if (ok()) return *this;
    return Status(code_, message_.empty() ? context : context + ": " + message_);
  }

 private:
  Status(int code, std::string message) : code_(code), message_(std::move(message)) {}

  int code_ = 0;
  std::string message_;
};

// Either a value of T or a non-OK Status. Minimal std::expected stand-in that
// also compiles under nvcc's C++20.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  Result(Status status) : state_(std::move(status)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return std::holds_alternative<T>(state_); }
  explicit operator bool() const { return ok(); }

  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(state_);
  }
  T& value() & { return std::get<T>(state_); }
  const T& value() const& { return std::get<T>(state_); }
  T&& value() && { return std::get<T>(std::move(state_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> state_;
};

}  // namespace spillfs

// Propagates a non-OK Status from an expression returning Status.
#define SPILLFS_RETURN_IF_ERROR(expr)                  \
  do {                                                 \
    ::spillfs::Status _spillfs_status = (expr);        \
    if (!_spillfs_status.ok()) return _spillfs_status; \
  } while (0)

#define SPILLFS_CONCAT_INNER(a, b) a##b
#define SPILLFS_CONCAT(a, b) SPILLFS_CONCAT_INNER(a, b)
// Declares `lhs` from a Result<T> expression, or returns its Status.
#define SPILLFS_ASSIGN_OR_RETURN(lhs, expr)                                                                         \
  auto SPILLFS_CONCAT(_spillfs_result_, __LINE__) = (expr);                                                         \
  if (!SPILLFS_CONCAT(_spillfs_result_, __LINE__).ok()) return SPILLFS_CONCAT(_spillfs_result_, __LINE__).status(); \
  lhs = std::move(SPILLFS_CONCAT(_spillfs_result_, __LINE__)).value()
