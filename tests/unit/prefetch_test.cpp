// common/prefetch.hpp: the direct path prefetches lines from hints that
// nothing validated (QueuePair::prefetch_for_direct), which is sound only
// because a prefetch never faults and changes nothing. Both, here, on
// addresses no load could touch.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

#include "common/prefetch.hpp"

namespace softhca {
namespace {

TEST(Prefetch, NeverFaultsOnAddressesThatWould) {
  const long page = sysconf(_SC_PAGESIZE);
  void* gone = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(gone, MAP_FAILED);
  ASSERT_EQ(munmap(gone, page), 0);
  void* guarded = mmap(nullptr, page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(guarded, MAP_FAILED);
  const void* wild[] = {nullptr, gone, guarded, reinterpret_cast<const void*>(uintptr_t{0xffff800000000000})};
  for (const void* p : wild) {
    prefetch_for_write(p);
    prefetch_for_read(p);
  }
  EXPECT_EQ(munmap(guarded, page), 0);
}

TEST(Prefetch, ChangesNothing) {
  unsigned char line[64];
  for (unsigned i = 0; i < sizeof line; ++i) line[i] = static_cast<unsigned char>(i * 7);
  unsigned char copy[sizeof line];
  std::memcpy(copy, line, sizeof line);
  prefetch_for_write(line);
  prefetch_for_read(line + 32);
  EXPECT_EQ(std::memcmp(line, copy, sizeof line), 0);
}

}  // namespace
}  // namespace softhca
