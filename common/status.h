// Status and Result<T>: how expected failures (bad input, I/O, network, corruption) cross
// component boundaries. Exceptions are reserved for faults; a Status carries a message written
// for the user: what went wrong and what to do about it.
#pragma once

#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace strata {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // the caller's input is wrong; the message names the field and the fix
  kNotFound,
  kAlreadyExists,
  kCorruption,  // stored bytes fail their checksum or do not decode
  kIoError,
  kUnavailable,  // a peer or the coordinator cannot be reached
  kDeadlineExceeded,
  kAborted,  // work stopped on purpose (cancel, peer failure)
  kResourceExhausted,
  kInternal,
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "NotFound: run r-12 has no checkpoint at step 40"
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status Corruption(std::string m) { return {StatusCode::kCorruption, std::move(m)}; }
inline Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status Aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status DeadlineExceeded(std::string m) { return {StatusCode::kDeadlineExceeded, std::move(m)}; }

// Result<T> holds a value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT
    if (status_.ok()) status_ = Internal("Result constructed from an OK status without a value");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace strata

// Propagate a non-OK Status to the caller.
#define STRATA_RETURN_IF_ERROR(expr) \
  do {                               \
    ::strata::Status _st = (expr);   \
    if (!_st.ok()) return _st;       \
  } while (0)

#define STRATA_CONCAT_INNER(a, b) a##b
#define STRATA_CONCAT(a, b) STRATA_CONCAT_INNER(a, b)
// STRATA_ASSIGN_OR_RETURN(auto x, MakeX());
#define STRATA_ASSIGN_OR_RETURN(lhs, expr) STRATA_ASSIGN_OR_RETURN_IMPL(STRATA_CONCAT(_result_, __LINE__), lhs, expr)
#define STRATA_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

// For our own bugs only: prints the failed condition with file:line and aborts.
#define STRATA_CHECK(cond)                                                               \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::cerr << __FILE__ << ":" << __LINE__ << ": check failed: " #cond << std::endl; \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)
