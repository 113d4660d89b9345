// host::check_range_in_maps / check_process_range: the registration check that
// a range is mapped with the protection its access needs, first on crafted
// /proc/PID/maps text, then on real mappings of this process.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include "host/memory_check.hpp"

namespace softhca::host {
namespace {

constexpr std::string_view kMaps =
    "00400000-00401000 r-xp 00000000 08:01 123 /usr/bin/prog\n"
    "10000000-10002000 rw-p 00000000 00:00 0 \n"
    "10002000-10003000 r--p 00000000 00:00 0 \n"
    "10003000-10004000 ---p 00000000 00:00 0 \n"
    "10004000-10005000 rw-s 00000000 00:05 77 /dev/shm/file\n"
    "10006000-10007000 rw-p 00000000 00:00 0 \n"
    "ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0 [vsyscall]\n";

TEST(MemoryCheckMaps, WholeRangeInsideOneMappingIsFine) {
  EXPECT_TRUE(check_range_in_maps(kMaps, 0x10000000, 0x2000, MemoryNeed::kWrite));
  EXPECT_TRUE(check_range_in_maps(kMaps, 0x10000800, 16, MemoryNeed::kRead));
}

TEST(MemoryCheckMaps, AdjacentMappingsCoverARangeTogether) {
  EXPECT_TRUE(check_range_in_maps(kMaps, 0x10001000, 0x2000, MemoryNeed::kRead));
  // The second page of the range (0x10002000) is read-only.
  EXPECT_EQ(check_range_in_maps(kMaps, 0x10001000, 0x2000, MemoryNeed::kWrite).error(), std::errc::bad_address);
}

TEST(MemoryCheckMaps, ReadOnlyIsFineForReadAndFaultsForWrite) {
  EXPECT_TRUE(check_range_in_maps(kMaps, 0x10002000, 0x1000, MemoryNeed::kRead));
  EXPECT_EQ(check_range_in_maps(kMaps, 0x10002000, 0x1000, MemoryNeed::kWrite).error(), std::errc::bad_address);
}

TEST(MemoryCheckMaps, ProtNoneFaultsForAnyAccess) {
  EXPECT_EQ(check_range_in_maps(kMaps, 0x10003000, 1, MemoryNeed::kRead).error(), std::errc::bad_address);
  EXPECT_EQ(check_range_in_maps(kMaps, 0x10003fff, 1, MemoryNeed::kWrite).error(), std::errc::bad_address);
}

TEST(MemoryCheckMaps, SharedFileMappingIsFine) {
  EXPECT_TRUE(check_range_in_maps(kMaps, 0x10004000, 0x1000, MemoryNeed::kWrite));
}

TEST(MemoryCheckMaps, HoleFaults) {
  // Unmapped alone, and a range running from a mapping into the hole or across it.
  EXPECT_EQ(check_range_in_maps(kMaps, 0x10005000, 0x1000, MemoryNeed::kRead).error(), std::errc::bad_address);
  EXPECT_EQ(check_range_in_maps(kMaps, 0x10004000, 0x1001, MemoryNeed::kRead).error(), std::errc::bad_address);
  EXPECT_EQ(check_range_in_maps(kMaps, 0x10004000, 0x3000, MemoryNeed::kRead).error(), std::errc::bad_address);
  // Below every mapping, past the last one, and with no maps at all.
  EXPECT_EQ(check_range_in_maps(kMaps, 0x1000, 0x1000, MemoryNeed::kRead).error(), std::errc::bad_address);
  EXPECT_EQ(check_range_in_maps(kMaps, 0x10006800, 0x1000, MemoryNeed::kRead).error(), std::errc::bad_address);
  EXPECT_EQ(check_range_in_maps("", 0x10000000, 1, MemoryNeed::kRead).error(), std::errc::bad_address);
}

TEST(MemoryCheckMaps, LastLineWithoutNewlineCounts) {
  EXPECT_TRUE(check_range_in_maps("10000000-10001000 rw-p 00000000 00:00 0", 0x10000000, 0x1000,
                                  MemoryNeed::kWrite));
}

TEST(MemoryCheckMaps, ExecuteOnlyIsNotReadable) {
  EXPECT_EQ(check_range_in_maps(kMaps, 0xffffffffff600000, 0x1000, MemoryNeed::kRead).error(),
            std::errc::bad_address);
}

TEST(MemoryCheckMaps, WrapOrEmptyIsInvalid) {
  EXPECT_EQ(check_range_in_maps(kMaps, 0x10000000, 0, MemoryNeed::kRead).error(), std::errc::invalid_argument);
  EXPECT_EQ(check_range_in_maps(kMaps, UINT64_MAX - 0xfff, 0x2000, MemoryNeed::kRead).error(),
            std::errc::invalid_argument);
  // Ends exactly at 2^64 - 1: no wrap, but its page-aligned end does.
  EXPECT_EQ(check_range_in_maps(kMaps, UINT64_MAX - 0x10, 0x10, MemoryNeed::kRead).error(),
            std::errc::invalid_argument);
  EXPECT_EQ(check_range_in_maps(kMaps, 1, UINT64_MAX, MemoryNeed::kRead).error(), std::errc::invalid_argument);
}

TEST(MemoryCheckAccess, WriteNeededForEveryFlagThatCanModifyMemory) {
  EXPECT_EQ(memory_need(0), MemoryNeed::kRead);
  EXPECT_EQ(memory_need(IBV_ACCESS_REMOTE_READ), MemoryNeed::kRead);
  EXPECT_EQ(memory_need(IBV_ACCESS_REMOTE_READ | IBV_ACCESS_RELAXED_ORDERING), MemoryNeed::kRead);
  EXPECT_EQ(memory_need(IBV_ACCESS_LOCAL_WRITE), MemoryNeed::kWrite);
  EXPECT_EQ(memory_need(IBV_ACCESS_REMOTE_WRITE), MemoryNeed::kWrite);
  EXPECT_EQ(memory_need(IBV_ACCESS_REMOTE_ATOMIC), MemoryNeed::kWrite);
  EXPECT_EQ(memory_need(IBV_ACCESS_MW_BIND), MemoryNeed::kWrite);
}

// Real mappings: three pages reserved PROT_NONE, then re-protected page by page.
class ProcessRange : public ::testing::Test {
 protected:
  void SetUp() override {
    page_ = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    void* mem = ::mmap(nullptr, 3 * page_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(mem, MAP_FAILED);
    base_ = static_cast<char*>(mem);
  }
  void TearDown() override {
    if (base_ != nullptr) ::munmap(base_, 3 * page_);
  }
  char* page(int n) const { return base_ + static_cast<size_t>(n) * page_; }

  size_t page_ = 0;
  char* base_ = nullptr;
};

TEST_F(ProcessRange, ProtNoneReservationFaults) {
  EXPECT_EQ(check_process_range(base_, 3 * page_, MemoryNeed::kRead).error(), std::errc::bad_address);
  EXPECT_EQ(check_process_range(page(1), 1, MemoryNeed::kRead).error(), std::errc::bad_address);
}

TEST_F(ProcessRange, ReadWriteMappingIsFine) {
  ASSERT_EQ(::mprotect(base_, 3 * page_, PROT_READ | PROT_WRITE), 0);
  EXPECT_TRUE(check_process_range(base_, 3 * page_, MemoryNeed::kWrite));
  EXPECT_TRUE(check_process_range(page(1) + 5, 7, MemoryNeed::kRead));
}

TEST_F(ProcessRange, ReadOnlyFaultsOnlyForWrite) {
  ASSERT_EQ(::mprotect(base_, 3 * page_, PROT_READ), 0);
  EXPECT_TRUE(check_process_range(base_, 3 * page_, MemoryNeed::kRead));
  EXPECT_EQ(check_process_range(base_, 3 * page_, MemoryNeed::kWrite).error(), std::errc::bad_address);
  // One read-only page in the middle of writable ones is enough to refuse.
  ASSERT_EQ(::mprotect(base_, page_, PROT_READ | PROT_WRITE), 0);
  ASSERT_EQ(::mprotect(page(2), page_, PROT_READ | PROT_WRITE), 0);
  EXPECT_TRUE(check_process_range(base_, page_, MemoryNeed::kWrite));
  EXPECT_EQ(check_process_range(base_, 3 * page_, MemoryNeed::kWrite).error(), std::errc::bad_address);
}

TEST_F(ProcessRange, HoleInTheMiddleFaults) {
  ASSERT_EQ(::mprotect(base_, 3 * page_, PROT_READ | PROT_WRITE), 0);
  ASSERT_EQ(::munmap(page(1), page_), 0);
  EXPECT_TRUE(check_process_range(base_, page_, MemoryNeed::kWrite));
  EXPECT_TRUE(check_process_range(page(2), page_, MemoryNeed::kWrite));
  EXPECT_EQ(check_process_range(base_, 3 * page_, MemoryNeed::kRead).error(), std::errc::bad_address);
  EXPECT_EQ(check_process_range(page(1), 1, MemoryNeed::kRead).error(), std::errc::bad_address);
}

TEST_F(ProcessRange, JustUnmappedFaults) {
  ASSERT_EQ(::munmap(base_, 3 * page_), 0);
  const char* gone = base_;
  base_ = nullptr;
  EXPECT_EQ(check_process_range(gone, 3 * page_, MemoryNeed::kRead).error(), std::errc::bad_address);
}

TEST(ProcessRangeWrap, WrapIsInvalidBeforeAnyLookup) {
  EXPECT_EQ(check_process_range(reinterpret_cast<const void*>(UINT64_MAX - 0xfff), 0x2000, MemoryNeed::kRead)
                .error(),
            std::errc::invalid_argument);
}

TEST(ProcessRangeStack, StackAndHeapAreFine) {
  char local[256] = {};
  EXPECT_TRUE(check_process_range(local, sizeof local, MemoryNeed::kWrite));
  std::string heap(1 << 20, 'x');
  EXPECT_TRUE(check_process_range(heap.data(), heap.size(), MemoryNeed::kWrite));
}

}  // namespace
}  // namespace softhca::host
