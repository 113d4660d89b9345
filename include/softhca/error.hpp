// softhca C++ API: the error type every verb wrapper reports.
//
// Verbs report failure three ways: a positive errno as the return value
// (ibv_modify_qp, ibv_post_send, the destroy calls), -1 with errno set
// (ibv_query_gid, ibv_get_cq_event), or NULL with errno set (the create
// calls). Error folds all three into one value that also remembers which
// verb failed, because "Invalid argument" alone does not tell a caller whether
// it was the QP's caps or its state transition that was rejected.
#pragma once

#include <infiniband/verbs.h>

#include <cerrno>
#include <cstring>
#include <expected>
#include <string>
#include <system_error>
#include <utility>

namespace softhca {

class Error {
 public:
  constexpr Error(int code, const char* verb) noexcept : code_(code), verb_(verb) {}

  // The errno value; never 0.
  constexpr int code() const noexcept { return code_; }
  // The name of the verb that failed, e.g. "ibv_create_qp" (a string literal).
  constexpr const char* verb() const noexcept { return verb_; }
  std::error_code error_code() const noexcept { return {code_, std::generic_category()}; }
  std::string message() const { return std::string(verb_) + ": " + std::strerror(code_); }

  friend constexpr bool operator==(const Error& a, const Error& b) noexcept {
    return a.code_ == b.code_ && std::string_view(a.verb_) == std::string_view(b.verb_);
  }

 private:
  int code_;
  const char* verb_;
};

template <class T>
using Expected = std::expected<T, Error>;

// What the throwing forms throw. A std::system_error so that callers who only
// know the standard library can still read code().value() as the errno.
class VerbsError : public std::system_error {
 public:
  explicit VerbsError(const Error& e) : std::system_error(e.error_code(), e.verb()), error_(e) {}
  const Error& error() const noexcept { return error_; }

 private:
  Error error_;
};

// Unwraps an Expected, turning its error into a VerbsError.
template <class T>
T value_or_throw(Expected<T>&& e) {
  if (!e) throw VerbsError(e.error());
  if constexpr (!std::is_void_v<T>) return std::move(*e);
}

namespace detail {

// errno as a verb left it, or `fallback` where it left none (some providers
// fail without setting it; an Error must never carry 0).
inline int errno_or(int fallback) noexcept { return errno != 0 ? errno : fallback; }

// For verbs returning 0 / positive errno / -1 with errno. The caller clears
// errno before the call so that a stale value is not blamed on this verb.
inline Expected<void> check_rc(int rc, const char* verb) noexcept {
  if (rc == 0) return {};
  return std::unexpected(Error(rc > 0 ? rc : errno_or(EIO), verb));
}

// For verbs returning an object or NULL with errno.
template <class T>
Expected<T*> check_ptr(T* p, const char* verb) noexcept {
  if (p != nullptr) return p;
  return std::unexpected(Error(errno_or(ENOMEM), verb));
}

}  // namespace detail
}  // namespace softhca
