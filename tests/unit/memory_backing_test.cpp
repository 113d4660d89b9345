// host::MemoryBacking, host::WriteGuard and the shareable-memory rule: pages
// of this process moved into a shared file keep their contents, are the same
// memory as the file, go back to private memory at the last unshare, and no
// store of a concurrent thread is lost while they move.
#include <gtest/gtest.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "host/memory_backing.hpp"
#include "host/host_registry.hpp"
#include "host/memory_check.hpp"
#include "host/peer_backings.hpp"
#include "host/shareable_memory.hpp"
#include "host/write_guard.hpp"

namespace softhca::host {
namespace {

constexpr uint64_t kPage = 4096;

constexpr std::string_view kMaps =
    "00400000-00401000 r-xp 00000000 08:01 123 /usr/bin/prog\n"
    "01000000-01003000 rw-p 00000000 00:00 0                          [heap]\n"
    "10000000-10002000 rw-p 00000000 00:00 0 \n"
    "10002000-10003000 rw-p 00000000 00:00 0 \n"
    "10003000-10004000 r--p 00000000 00:00 0 \n"
    "10004000-10005000 rw-s 00000000 00:05 77 /dev/shm/file\n"
    "10005000-10006000 rw-p 00000000 08:01 99 /home/u/data.bin\n"
    "10006000-10007000 rw-s 00000000 00:01 5 /dev/zero (deleted)\n"
    "10007000-10008000 rw-p 00000000 00:0f 8 /anon_hugepage (deleted)\n"
    "10009000-1000a000 rw-p 00000000 00:00 0                          [anon:arena]\n"
    "1000a000-1000b000 rwxp 00000000 00:00 0 \n"
    "7ffc0000-7ffc2000 rw-p 00000000 00:00 0                          [stack]\n";

TEST(ShareableMemory, ParsesTheFieldsOfAMapsLine) {
  MapsLine line;
  ASSERT_TRUE(parse_maps_line("10004000-10005000 rw-s 00000000 00:05 77 /dev/shm/my file", line));
  EXPECT_EQ(line.start, 0x10004000u);
  EXPECT_EQ(line.end, 0x10005000u);
  EXPECT_EQ(line.perms, "rw-s");
  EXPECT_EQ(line.inode, 77u);
  EXPECT_EQ(line.path, "/dev/shm/my file");
  ASSERT_TRUE(parse_maps_line("10000000-10002000 rw-p 00000000 00:00 0 ", line));
  EXPECT_EQ(line.path, "");
  EXPECT_FALSE(parse_maps_line("", line));
  EXPECT_FALSE(parse_maps_line("10002000-10001000 rw-p 00000000 00:00 0", line));
  EXPECT_FALSE(parse_maps_line("10000000-10002000 rw-p 00000000 00:00", line));
}

TEST(ShareableMemory, OnlyPrivateAnonymousReadWriteMemoryIsShareable) {
  EXPECT_TRUE(range_shareable_in_maps(kMaps, 0x01000000, 0x01003000));  // the heap
  EXPECT_TRUE(range_shareable_in_maps(kMaps, 0x10000000, 0x10002000));
  EXPECT_TRUE(range_shareable_in_maps(kMaps, 0x10009000, 0x1000a000));  // named anonymous
  EXPECT_FALSE(range_shareable_in_maps(kMaps, 0x10003000, 0x10004000));  // read-only
  EXPECT_FALSE(range_shareable_in_maps(kMaps, 0x10004000, 0x10005000));  // shared file
  EXPECT_FALSE(range_shareable_in_maps(kMaps, 0x10005000, 0x10006000));  // private file
  EXPECT_FALSE(range_shareable_in_maps(kMaps, 0x10006000, 0x10007000));  // shared anonymous
  EXPECT_FALSE(range_shareable_in_maps(kMaps, 0x10007000, 0x10008000));  // hugetlb
  EXPECT_FALSE(range_shareable_in_maps(kMaps, 0x1000a000, 0x1000b000));  // executable
  EXPECT_FALSE(range_shareable_in_maps(kMaps, 0x7ffc0000, 0x7ffc1000));  // the stack
}

TEST(ShareableMemory, AdjacentMappingsCoverTogetherAndAHoleBreaksTheRange) {
  EXPECT_TRUE(range_shareable_in_maps(kMaps, 0x10001000, 0x10003000));
  EXPECT_FALSE(range_shareable_in_maps(kMaps, 0x10001000, 0x10004000));  // runs into read-only
  EXPECT_FALSE(range_shareable_in_maps(kMaps, 0x10008000, 0x1000a000));  // a hole at 0x10008000
  EXPECT_FALSE(range_shareable_in_maps(kMaps, 0x20000000, 0x20001000));  // nothing there
}

// Anonymous private pages of our own, unmapped at the end.
struct Pages {
  explicit Pages(size_t count) : length(count * kPage) {
    void* p = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    bytes = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
  }
  ~Pages() {
    if (bytes) ::munmap(bytes, length);
  }
  size_t length;
  uint8_t* bytes;
};

// What /proc/self/maps says of the mapping that holds `addr`, copied out of
// the reading buffer.
struct Mapping {
  std::string perms;
  uint64_t inode = 0;
};

Mapping line_at(const void* addr) {
  const uint64_t a = reinterpret_cast<uint64_t>(addr);
  Mapping found;
  EXPECT_TRUE(scan_process_maps([&](std::string_view text) {
    MapsLine line;
    if (!parse_maps_line(text, line) || a < line.start || a >= line.end) return false;
    found = Mapping{std::string(line.perms), line.inode};
    return true;
  }));
  return found;
}

TEST(MemoryBacking, SharedPagesKeepTheirContentsAndAreTheFilesPages) {
  Pages pages(8);
  ASSERT_NE(pages.bytes, nullptr);
  for (size_t i = 0; i < pages.length; ++i) pages.bytes[i] = static_cast<uint8_t>(i * 7 + 3);
  auto& backing = MemoryBacking::process();
  auto shared = backing.share(pages.bytes, pages.length);
  ASSERT_TRUE(shared) << static_cast<int>(shared.error());
  EXPECT_EQ(shared->begin, reinterpret_cast<uint64_t>(pages.bytes));
  EXPECT_EQ(shared->length, pages.length);
  for (size_t i = 0; i < pages.length; ++i) ASSERT_EQ(pages.bytes[i], static_cast<uint8_t>(i * 7 + 3)) << i;
  const Mapping line = line_at(pages.bytes);
  EXPECT_EQ(line.perms, "rw-s");
  EXPECT_EQ(line.inode, backing.inode());

  // What a peer would do: map the file; both views are the same memory.
  void* view = ::mmap(nullptr, pages.length, PROT_READ | PROT_WRITE, MAP_SHARED, backing.fd(),
                      static_cast<off_t>(shared->offset));
  ASSERT_NE(view, MAP_FAILED);
  auto* peer = static_cast<uint8_t*>(view);
  EXPECT_EQ(std::memcmp(peer, pages.bytes, pages.length), 0);
  peer[5000] = 0xAB;
  EXPECT_EQ(pages.bytes[5000], 0xAB);
  pages.bytes[6000] = 0xCD;
  EXPECT_EQ(peer[6000], 0xCD);
  ::munmap(view, pages.length);

  backing.unshare(*shared);
  EXPECT_EQ(line_at(pages.bytes).inode, 0u) << "the last unshare moves the pages back to private memory";
  EXPECT_EQ(line_at(pages.bytes).perms, "rw-p");
  EXPECT_EQ(pages.bytes[5000], 0xAB);
  EXPECT_EQ(pages.bytes[6000], 0xCD);
  EXPECT_EQ(pages.bytes[7], static_cast<uint8_t>(7 * 7 + 3));
}

// A range longer than one piece moves piece by piece into consecutive file
// space: the bytes on both sides of the piece boundary stay in place.
TEST(MemoryBacking, ARangeLongerThanAPieceMovesWhole) {
  constexpr size_t kPiecePages = (size_t{64} << 20) / kPage;
  Pages pages(kPiecePages + 3);
  ASSERT_NE(pages.bytes, nullptr);
  for (size_t i = 0; i < pages.length; i += 512) pages.bytes[i] = static_cast<uint8_t>(i / 512);
  auto& backing = MemoryBacking::process();
  auto shared = backing.share(pages.bytes, pages.length);
  ASSERT_TRUE(shared);
  EXPECT_EQ(line_at(pages.bytes + pages.length - 1).inode, backing.inode());
  void* view = ::mmap(nullptr, pages.length, PROT_READ, MAP_SHARED, backing.fd(), static_cast<off_t>(shared->offset));
  ASSERT_NE(view, MAP_FAILED);
  for (size_t i = 0; i < pages.length; i += 512) {
    ASSERT_EQ(pages.bytes[i], static_cast<uint8_t>(i / 512)) << i;
    ASSERT_EQ(static_cast<uint8_t*>(view)[i], static_cast<uint8_t>(i / 512)) << i;
  }
  ::munmap(view, pages.length);
  backing.unshare(*shared);
  EXPECT_EQ(line_at(pages.bytes + pages.length - 1).inode, 0u);
  for (size_t i = 0; i < pages.length; i += 512) ASSERT_EQ(pages.bytes[i], static_cast<uint8_t>(i / 512)) << i;
}

TEST(MemoryBacking, ARangeInsideSharedPagesSharesThemAndOnlyTheLastUnshareMovesThemBack) {
  Pages pages(4);
  auto& backing = MemoryBacking::process();
  auto whole = backing.share(pages.bytes, pages.length);
  ASSERT_TRUE(whole);
  auto part = backing.share(pages.bytes + kPage - 10, kPage + 30);  // holds page 1 whole
  ASSERT_TRUE(part);
  EXPECT_EQ(part->length, kPage);
  EXPECT_EQ(part->begin, whole->begin + kPage);
  EXPECT_EQ(part->offset, whole->offset + kPage);
  // Partly over the shared pages and partly beyond: not supported.
  Pages next(2);
  EXPECT_EQ(backing.share(pages.bytes + pages.length - kPage, 2 * kPage).error(), std::errc::not_supported);
  backing.unshare(*whole);
  EXPECT_EQ(line_at(pages.bytes).inode, backing.inode()) << "one use is left";
  backing.unshare(*part);
  EXPECT_EQ(line_at(pages.bytes).inode, 0u);
}

// The partial pages at a range's ends hold the application's other objects:
// they never move, so nothing of theirs is ever write-protected.
TEST(MemoryBacking, OnlyWholePagesMoveAndTheirNeighboursStayPrivate) {
  Pages pages(4);
  auto& backing = MemoryBacking::process();
  auto shared = backing.share(pages.bytes + 100, pages.length - 200);
  ASSERT_TRUE(shared);
  EXPECT_EQ(shared->begin, reinterpret_cast<uint64_t>(pages.bytes + kPage));
  EXPECT_EQ(shared->length, 2 * kPage);
  EXPECT_EQ(line_at(pages.bytes).perms, "rw-p");
  EXPECT_EQ(line_at(pages.bytes + kPage).perms, "rw-s");
  EXPECT_EQ(line_at(pages.bytes + 3 * kPage - 1).perms, "rw-s");
  EXPECT_EQ(line_at(pages.bytes + 3 * kPage).perms, "rw-p");
  EXPECT_EQ(backing.share(pages.bytes + 10, kPage).error(), std::errc::not_supported) << "no whole page";
  EXPECT_EQ(backing.share(pages.bytes + 3 * kPage + 1, 100).error(), std::errc::not_supported);
  backing.unshare(*shared);
  EXPECT_EQ(line_at(pages.bytes + kPage).perms, "rw-p");
}

namespace {

// In a child: one thread with every signal blocked stores into the partial
// pages around a range, another has the kernel write there (getcpu), while
// the range moves in and out. Were those pages ever guarded, the kernel
// would kill the child for the blocked SIGSEGV, or getcpu would fail with
// EFAULT. Exit status: 0, or 3 if a system call failed.
[[noreturn]] void store_beside_moving_pages() {
  ::alarm(60);  // bounded: a hang ends the child with SIGALRM
  Pages pages(4);
  auto* head = reinterpret_cast<volatile uint64_t*>(pages.bytes + 8);
  auto* tail = reinterpret_cast<volatile uint64_t*>(pages.bytes + pages.length - 16);
  auto* by_kernel = reinterpret_cast<unsigned*>(pages.bytes + pages.length - 64);
  std::atomic<bool> stop{false};
  std::atomic<int> faults{0};
  std::thread storer([&] {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, nullptr);
    for (uint64_t n = 1; !stop.load(std::memory_order_relaxed); ++n) {
      *head = n;
      *tail = n;
    }
  });
  std::thread caller([&] {
    while (!stop.load(std::memory_order_relaxed))
      if (::syscall(SYS_getcpu, by_kernel, nullptr, nullptr) != 0) faults.fetch_add(1);
  });
  auto& backing = MemoryBacking::process();
  for (int i = 0; i < 300; ++i) {
    auto shared = backing.share(pages.bytes + 100, pages.length - 200);
    if (!shared) std::_Exit(4);
    backing.unshare(*shared);
  }
  stop = true;
  storer.join();
  caller.join();
  std::_Exit(faults.load() == 0 ? 0 : 3);
}

}  // namespace

TEST(MemoryBacking, StoresNextToMovingPagesNeedNoSignalAndNeverFail) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) store_beside_moving_pages();
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "3: the kernel could not write beside the moving pages";
}

TEST(MemoryBacking, MemoryThatCannotMoveIsNotSupported) {
  auto& backing = MemoryBacking::process();
  uint8_t on_stack[64] = {};
  EXPECT_EQ(backing.share(on_stack, sizeof on_stack).error(), std::errc::not_supported);
  void* shared = ::mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(shared, MAP_FAILED);
  EXPECT_EQ(backing.share(shared, kPage).error(), std::errc::not_supported);
  ::munmap(shared, kPage);
  Pages pages(1);
  ASSERT_EQ(::mprotect(pages.bytes, kPage, PROT_READ), 0);
  EXPECT_EQ(backing.share(pages.bytes, kPage).error(), std::errc::not_supported);
  EXPECT_EQ(backing.share(pages.bytes, 0).error(), std::errc::invalid_argument);
}

TEST(MemoryBacking, AnUnmappedRangeIsFreedWithoutMappingAnythingThere) {
  auto& backing = MemoryBacking::process();
  auto* bytes = static_cast<uint8_t*>(
      ::mmap(nullptr, 2 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(bytes, MAP_FAILED);
  auto shared = backing.share(bytes, 2 * kPage);
  ASSERT_TRUE(shared);
  const size_t before = backing.ranges();
  ASSERT_EQ(::munmap(bytes, 2 * kPage), 0);  // the application's bug, but not ours to crash on
  backing.unshare(*shared);
  EXPECT_EQ(backing.ranges(), before - 1);
  // Nothing was mapped back into the hole.
  EXPECT_EQ(::msync(bytes, kPage, MS_ASYNC), -1);
  EXPECT_EQ(errno, ENOMEM);
}

// Threads store without pause into the pages while they move in and out; a
// store made while they move must not be lost. Each thread owns the slots
// i with i % kThreads == its number and writes an increasing count into
// slot (count % its slot number): the last count each slot should hold
// follows from the thread's final count.
void no_concurrent_store_is_lost() {
  constexpr size_t kThreads = 3;
  constexpr size_t kSlotsPerThread = 3000;
  Pages pages((kThreads * kSlotsPerThread * sizeof(uint64_t) + kPage - 1) / kPage);
  auto* slots = reinterpret_cast<volatile uint64_t*>(pages.bytes);
  std::atomic<bool> stop{false};
  std::atomic<size_t> running{0};
  std::vector<uint64_t> last(kThreads, 0);
  std::vector<std::thread> writers;
  for (size_t t = 0; t < kThreads; ++t) {
    writers.emplace_back([&, t] {
      running.fetch_add(1);
      uint64_t count = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        ++count;
        slots[(count % kSlotsPerThread) * kThreads + t] = count;
      }
      last[t] = count;
    });
  }
  while (running.load() < kThreads) std::this_thread::yield();
  auto& backing = MemoryBacking::process();
  const uint64_t parked_before = WriteGuard::parked_faults();
  // Bounded: 400 moves each way, and stop earlier once enough stores have
  // been caught in the act.
  for (int i = 0; i < 400 && WriteGuard::parked_faults() - parked_before < 50; ++i) {
    auto shared = backing.share(pages.bytes, pages.length);
    ASSERT_TRUE(shared);
    backing.unshare(*shared);
  }
  stop = true;
  for (auto& w : writers) w.join();
  EXPECT_GT(WriteGuard::parked_faults(), parked_before) << "no store ever met a guard: the test proved nothing";
  for (size_t t = 0; t < kThreads; ++t) {
    for (size_t s = 0; s < kSlotsPerThread; ++s) {
      // The largest count <= last[t] that lands in slot s.
      uint64_t expect = last[t] - ((last[t] % kSlotsPerThread + kSlotsPerThread - s) % kSlotsPerThread);
      if (expect > last[t]) expect = 0;  // never written (last[t] < s)
      ASSERT_EQ(slots[s * kThreads + t], expect) << "thread " << t << " slot " << s;
    }
  }
}

TEST(MemoryBacking, NoConcurrentStoreIsLostWhilePagesMove) {
  if (WriteGuard::method() == WriteGuard::Method::kSignal) GTEST_SKIP() << "no userfaultfd here: the next test covers it";
  no_concurrent_store_is_lost();
}

// The same with the guard of kernels (or sandboxes) without userfaultfd.
TEST(MemoryBacking, NoConcurrentStoreIsLostWhilePagesMoveUnderTheSignalGuard) {
  WriteGuard::use_signals_only(true);
  no_concurrent_store_is_lost();
  WriteGuard::use_signals_only(false);
}

namespace {

// In a child: threads with every signal blocked store into the very pages
// that move, and have the kernel write into them (getcpu). With userfaultfd
// the kernel parks them in the fault, so none is killed and no store is
// lost; system calls wait too where the context covers kernel faults.
// Exit: 0; 3 when a system call failed although it should have waited; 5
// when a store was lost.
[[noreturn]] void store_into_moving_pages(bool calls_must_wait) {
  ::alarm(60);
  Pages pages(8);
  auto* slots = reinterpret_cast<volatile uint64_t*>(pages.bytes);
  const size_t count = pages.length / sizeof(uint64_t);
  auto* by_kernel = reinterpret_cast<unsigned*>(pages.bytes + pages.length - 64);
  std::atomic<bool> stop{false};
  std::atomic<int> faults{0};
  uint64_t last = 0;
  auto block_all = [] {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, nullptr);
  };
  std::thread storer([&] {
    block_all();
    uint64_t n = 1;
    for (; !stop.load(std::memory_order_relaxed); ++n) slots[(n * 512) % (count - 16)] = n;
    last = n - 1;
  });
  std::thread caller([&] {
    block_all();
    while (!stop.load(std::memory_order_relaxed))
      if (::syscall(SYS_getcpu, by_kernel, nullptr, nullptr) != 0) faults.fetch_add(1);
  });
  auto& backing = MemoryBacking::process();
  const uint64_t parked_before = WriteGuard::parked_faults();
  // 300 moves, or more until a store met a guard: on a loaded machine (CI's
  // other tests on both cores) the storer may not run during any of the
  // first 300 guard windows. Bounded at 20 s (exit 6 then).
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (int i = 0; WriteGuard::parked_faults() - parked_before < 50; ++i) {
    if (i >= 300 && (WriteGuard::parked_faults() > parked_before || std::chrono::steady_clock::now() > give_up)) break;
    auto shared = backing.share(pages.bytes, pages.length);
    if (!shared) std::_Exit(4);
    backing.unshare(*shared);
  }
  stop = true;
  storer.join();
  caller.join();
  if (calls_must_wait && faults.load() != 0) std::_Exit(3);
  // The newest store of each slot the storer used is there.
  for (uint64_t n = last; n + count > last && n > 0; --n) {
    const size_t slot = (n * 512) % (count - 16);
    if (slots[slot] > n) continue;  // a later store hit this slot
    if (slots[slot] != n) std::_Exit(5);
  }
  std::_Exit(WriteGuard::parked_faults() > parked_before ? 0 : 6);
}

}  // namespace

TEST(MemoryBacking, StoresIntoMovingPagesWaitWhateverTheSignalMask) {
  const WriteGuard::Method method = WriteGuard::method();
  if (method == WriteGuard::Method::kSignal) GTEST_SKIP() << "no userfaultfd write protection on this kernel";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) store_into_moving_pages(method == WriteGuard::Method::kAllFaults);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "3: a system call failed; 5: a store was lost; 6: no store met a guard";
}

// A child forked while pages are shared gets them as they were at the fork:
// it sees none of the parent's later stores, and the parent none of its.
TEST(MemoryBacking, AForkedChildHasItsOwnCopyOfSharedPages) {
  Pages pages(2);
  std::memset(pages.bytes, 'A', pages.length);
  auto shared = MemoryBacking::process().share(pages.bytes, pages.length);
  ASSERT_TRUE(shared);
  int parent_wrote[2];
  int child_wrote[2];
  ASSERT_EQ(::pipe(parent_wrote), 0);
  ASSERT_EQ(::pipe(child_wrote), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    char c = 0;
    if (::read(parent_wrote[0], &c, 1) != 1) ::_exit(2);
    int status = 0;
    for (size_t i = 0; i < pages.length; ++i)
      if (pages.bytes[i] != 'A') status = 3;  // the parent's store after fork showed through
    std::memset(pages.bytes, 'C', pages.length);
    if (::write(child_wrote[1], "x", 1) != 1) ::_exit(4);
    ::_exit(status);
  }
  std::memset(pages.bytes, 'B', pages.length);
  ASSERT_EQ(::write(parent_wrote[1], "x", 1), 1);
  char c = 0;
  ASSERT_EQ(::read(child_wrote[0], &c, 1), 1);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  for (size_t i = 0; i < pages.length; ++i) ASSERT_EQ(pages.bytes[i], 'B') << "the child's store showed through at " << i;
  EXPECT_EQ(line_at(pages.bytes).inode, MemoryBacking::process().inode()) << "the parent's pages stay shared";
  MemoryBacking::process().unshare(*shared);
  for (int fd : {parent_wrote[0], parent_wrote[1], child_wrote[0], child_wrote[1]}) ::close(fd);
}

// A peer's file, mapped through /proc/PID/fd: the same bytes; once the peer
// is gone, the next lookup retires its window and unmaps it after the grace.
TEST(PeerBackings, APeersFileIsMappedAndItsWindowGoesWhenThePeerDies) {
  int to_child[2];
  int from_child[2];
  ASSERT_EQ(::pipe(to_child), 0);
  ASSERT_EQ(::pipe(from_child), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const int fd = ::memfd_create("peer-test", 0);
    struct stat st {};
    if (fd < 0 || ::ftruncate(fd, 4096) != 0 || ::pwrite(fd, "hello", 5, 0) != 5 || ::fstat(fd, &st) != 0)
      ::_exit(2);
    const uint64_t said[2] = {static_cast<uint64_t>(fd), static_cast<uint64_t>(st.st_ino)};
    if (::write(from_child[1], said, sizeof said) != sizeof said) ::_exit(3);
    char c = 0;
    (void)!::read(to_child[0], &c, 1);
    ::_exit(0);
  }
  uint64_t said[2] = {};
  ASSERT_EQ(::read(from_child[0], said, sizeof said), static_cast<ssize_t>(sizeof said));
  PeerBackings backings(0);  // no grace: a retired window goes at the next lookup
  const uint64_t start = process_start_time(static_cast<uint32_t>(child));
  auto view = backings.map(static_cast<uint32_t>(child), start, static_cast<uint32_t>(said[0]), said[1], 4096);
  ASSERT_NE(view.base, nullptr);
  EXPECT_EQ(std::memcmp(view.base, "hello", 5), 0);
  EXPECT_EQ(backings.windows(), 1u);
  ASSERT_EQ(::write(to_child[1], "x", 1), 1);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  // Another file looked up anew: the dead peer's window is swept.
  Pages pages(1);
  auto shared = MemoryBacking::process().share(pages.bytes, kPage);
  ASSERT_TRUE(shared);
  const uint32_t self = static_cast<uint32_t>(::getpid());
  auto own = backings.map(self, process_start_time(self), static_cast<uint32_t>(MemoryBacking::process().fd()),
                          MemoryBacking::process().inode(), kPage);
  EXPECT_NE(own.base, nullptr);
  EXPECT_EQ(backings.windows(), 1u) << "only our own window is left";
  EXPECT_EQ(backings.retired(), 0u) << "retired windows past their grace are unmapped";
  EXPECT_EQ(backings.map(self, process_start_time(self), static_cast<uint32_t>(MemoryBacking::process().fd()),
                         MemoryBacking::process().inode() + 1, kPage)
                .base,
            nullptr)
      << "another inode behind the descriptor is another file";
  MemoryBacking::process().unshare(*shared);
  for (int fd : {to_child[0], to_child[1], from_child[0], from_child[1]}) ::close(fd);
}

// A window that a larger one replaced stays mapped while its peer lives:
// a channel that keeps it goes on copying through it. (It was retired and,
// a grace later, unmapped under that channel.)
TEST(PeerBackings, AnOutgrownWindowStaysMappedWhileItsPeerLives) {
  Pages pages(1);
  auto shared = MemoryBacking::process().share(pages.bytes, kPage);
  ASSERT_TRUE(shared);
  std::memcpy(pages.bytes, "outgrown", 8);
  PeerBackings backings(0);  // no grace
  const uint32_t self = static_cast<uint32_t>(::getpid());
  const uint64_t start = process_start_time(self);
  const auto fd = static_cast<uint32_t>(MemoryBacking::process().fd());
  const uint64_t inode = MemoryBacking::process().inode();
  const auto small = backings.map(self, start, fd, inode, kPage);
  ASSERT_NE(small.base, nullptr);
  const auto large = backings.map(self, start, fd, inode, small.length + 1);
  ASSERT_NE(large.base, nullptr);
  EXPECT_GT(large.length, small.length);
  EXPECT_EQ(backings.windows(), 1u);
  EXPECT_EQ(backings.outgrown(), 1u);
  // Another lookup sweeps: nothing of a live peer is unmapped.
  (void)backings.map(self, start, fd, inode, kPage);
  EXPECT_EQ(backings.retired(), 0u);
  EXPECT_EQ(std::memcmp(small.base + shared->offset, "outgrown", 8), 0);
  EXPECT_EQ(std::memcmp(large.base + shared->offset, "outgrown", 8), 0);
  MemoryBacking::process().unshare(*shared);
}

sigjmp_buf fault_jump;
std::atomic<int> own_handler_calls{0};

void own_handler(int, siginfo_t*, void*) {
  own_handler_calls.fetch_add(1);
  siglongjmp(fault_jump, 1);
}

// Stores into `p`; true if that faulted into own_handler. Apart, so that
// nothing of the caller lives across the jump.
[[gnu::noinline]] bool store_faults(volatile uint8_t* p) {
  if (sigsetjmp(fault_jump, 1) != 0) return true;
  *p = 1;
  return false;
}

// A fault that is not a store into moving pages reaches the handler the
// application had installed before, as if softhca were not there.
TEST(WriteGuard, OtherFaultsReachTheApplicationsHandler) {
  struct sigaction mine {};
  struct sigaction saved {};
  mine.sa_sigaction = own_handler;
  mine.sa_flags = SA_SIGINFO;
  sigemptyset(&mine.sa_mask);
  ASSERT_EQ(::sigaction(SIGSEGV, &mine, &saved), 0);
  Pages moving(1);
  Pages readonly(1);
  ASSERT_EQ(::mprotect(readonly.bytes, kPage, PROT_READ), 0);
  auto shared = MemoryBacking::process().share(moving.bytes, kPage);  // puts the guard's handler in front
  ASSERT_TRUE(shared);
  EXPECT_TRUE(store_faults(readonly.bytes)) << "the store into a read-only page did not fault";
  EXPECT_EQ(own_handler_calls.load(), 1);
  MemoryBacking::process().unshare(*shared);
  ASSERT_EQ(::sigaction(SIGSEGV, &saved, nullptr), 0);
}

}  // namespace
}  // namespace softhca::host
