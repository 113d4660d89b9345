// Result<T>: the error convention inside softhca.
// Errors are std::errc codes so that the C shim maps them to errno by identity.
#pragma once

#include <cerrno>
#include <expected>
#include <system_error>

namespace softhca {

template <typename T = void>
using Result = std::expected<T, std::errc>;

inline std::unexpected<std::errc> fail(std::errc code) { return std::unexpected(code); }

// The errno value the C boundary reports for an error code.
inline int to_errno(std::errc code) { return static_cast<int>(code); }

}  // namespace softhca
