#include "common/system_random.hpp"

#include <sys/random.h>

#include <cerrno>
#include <cstddef>
#include <random>

namespace softhca {

uint64_t system_random_u64() {
  uint64_t value = 0;
  auto* bytes = reinterpret_cast<unsigned char*>(&value);
  std::size_t got = 0;
  while (got < sizeof value) {
    const ssize_t n = ::getrandom(bytes + got, sizeof value - got, 0);
    if (n > 0) {
      got += static_cast<std::size_t>(n);
    } else if (n < 0 && errno != EINTR) {
      // No getrandom (a seccomp filter that refuses it): the C++ library's
      // own source, which reads the same pool another way.
      std::random_device device;
      return (uint64_t{device()} << 32) | device();
    }
  }
  return value;
}

}  // namespace softhca
