#include "host/memory_backing.hpp"

#include <fcntl.h>
#include <linux/falloc.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iterator>

#include "common/log.hpp"
#include "host/memory_check.hpp"
#include "host/shareable_memory.hpp"
#include "host/write_guard.hpp"

namespace softhca::host {
namespace {

constexpr uint64_t kPage = 4096;
// Ranges moved at most at a time (see share()).
constexpr size_t kMaxRanges = 8192;
// The most that moves at once (see move_in_locked).
constexpr uint64_t kMovePiece = uint64_t{64} << 20;

std::unexpected<std::errc> fail_errno() { return fail(static_cast<std::errc>(errno)); }

// Copies between memory and the file with raw system calls: the kernel reads
// and writes whole pages, so no sanitizer interceptor sees our reads of the
// allocator's red zones or of words other threads wrote (they are parked).
Result<void> file_io(long call, int fd, uint64_t addr, uint64_t length, uint64_t offset) {
  while (length > 0) {
    const long done = ::syscall(call, fd, addr, length, offset);
    if (done < 0 && errno == EINTR) continue;
    if (done < 0) return fail_errno();
    if (done == 0) return fail(std::errc::io_error);
    addr += static_cast<uint64_t>(done);
    offset += static_cast<uint64_t>(done);
    length -= static_cast<uint64_t>(done);
  }
  return {};
}

// Mapping over and moving pages in place, as raw system calls. A move keeps
// every byte, so nothing was written; ThreadSanitizer's mmap interceptor
// would record a write over the whole range, racing every other thread's use
// of the objects that share those pages (the heap's neighbours of a buffer).
void* map_over(uint64_t at, uint64_t length, int fd, uint64_t offset) {
  return reinterpret_cast<void*>(::syscall(SYS_mmap, at, length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd,
                                           offset));
}

void* move_over(void* from, uint64_t length, uint64_t at) {
  return reinterpret_cast<void*>(
      ::syscall(SYS_mremap, from, length, length, MREMAP_MAYMOVE | MREMAP_FIXED, at));
}

// Whether [begin, end) is still mapped from the file with inode `inode`: the
// application may have unmapped or replaced a registered range.
bool mapped_from(uint64_t begin, uint64_t end, ino_t inode) {
  uint64_t cursor = begin;
  bool ok = false;
  auto read = scan_process_maps([&](std::string_view text) {
    MapsLine line;
    if (!parse_maps_line(text, line) || line.end <= cursor) return false;
    if (line.start > cursor || line.inode != inode || line.perms != "rw-s") return true;
    cursor = line.end;
    ok = cursor >= end;
    return ok;
  });
  return read && ok;
}

}  // namespace

MemoryBacking& MemoryBacking::process() {
  static MemoryBacking* backing = new MemoryBacking();  // never destroyed: its mappings outlive exit handlers
  return *backing;
}

int MemoryBacking::fd() const {
  std::lock_guard lock(mutex_);
  return fd_;
}

ino_t MemoryBacking::inode() const {
  std::lock_guard lock(mutex_);
  return inode_;
}

size_t MemoryBacking::ranges() const {
  std::lock_guard lock(mutex_);
  return ranges_.size();
}

void MemoryBacking::before_fork() {
  MemoryBacking& self = process();
  self.mutex_.lock();  // held until after_fork_*: no range moves meanwhile
  for (const auto& [begin, range] : self.ranges_) {
    const uint64_t length = range.end - begin;
    void* copy = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (copy == MAP_FAILED || !file_io(SYS_pread64, self.fd_, reinterpret_cast<uint64_t>(copy), length, range.offset)) {
      SOFTHCA_WARN("memory backing: no private copy of %llu registered bytes for a child; it shares them",
                   static_cast<unsigned long long>(length));
      if (copy != MAP_FAILED) ::munmap(copy, length);
      continue;
    }
    self.snapshots_.push_back(Snapshot{begin, length, copy});
  }
}

void MemoryBacking::after_fork_in_parent() {
  MemoryBacking& self = process();
  for (const Snapshot& s : self.snapshots_) ::munmap(s.copy, s.length);
  self.snapshots_.clear();
  self.mutex_.unlock();
}

void MemoryBacking::after_fork_in_child() {
  MemoryBacking& self = process();
  for (const Snapshot& s : self.snapshots_)
    move_over(s.copy, s.length, s.begin);
  self.snapshots_.clear();
  // The child registered nothing: it starts without a file.
  if (self.fd_ >= 0) ::close(self.fd_);
  self.fd_ = -1;
  self.inode_ = 0;
  self.file_size_ = 0;
  self.holes_.clear();
  self.ranges_.clear();
  self.mutex_.unlock();
}

Result<void> MemoryBacking::open_file_locked() {
  if (fd_ >= 0) return {};
  static const int fork_handlers = ::pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);
  if (fork_handlers != 0) return fail(static_cast<std::errc>(fork_handlers));
  const int fd = ::memfd_create("softhca-registered", MFD_CLOEXEC);
  if (fd < 0) return fail_errno();
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return fail(static_cast<std::errc>(err));
  }
  fd_ = fd;
  inode_ = st.st_ino;
  return {};
}

Result<uint64_t> MemoryBacking::allocate_locked(uint64_t length) {
  for (auto it = holes_.begin(); it != holes_.end(); ++it) {
    if (it->second < length) continue;
    const uint64_t offset = it->first;
    const uint64_t rest = it->second - length;
    holes_.erase(it);
    if (rest > 0) holes_.emplace(offset + length, rest);
    return offset;
  }
  const uint64_t offset = file_size_;
  if (::ftruncate(fd_, static_cast<off_t>(offset + length)) != 0) return fail_errno();
  file_size_ = offset + length;
  return offset;
}

void MemoryBacking::free_locked(uint64_t offset, uint64_t length) {
  // The pages go back to the system; the file keeps its size (peers may map
  // up to it) and the space is reused.
  if (::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                  static_cast<off_t>(length)) != 0)
    SOFTHCA_WARN("memory backing: cannot free %llu bytes of the file: %s", static_cast<unsigned long long>(length),
                 strerror(errno));
  auto next = holes_.lower_bound(offset);
  if (next != holes_.end() && offset + length == next->first) {
    length += next->second;
    next = holes_.erase(next);
  }
  if (next != holes_.begin()) {
    auto before = std::prev(next);
    if (before->first + before->second == offset) {
      before->second += length;
      return;
    }
  }
  holes_.emplace(offset, length);
}

Result<void> MemoryBacking::move_in_locked(uint64_t begin, uint64_t end, uint64_t offset) {
  // In pieces: a piece's pages exist twice while it moves, and its writers
  // wait only for that piece.
  for (uint64_t at = begin; at < end; at += kMovePiece) {
    const uint64_t length = end - at < kMovePiece ? end - at : kMovePiece;
    const uint64_t file_at = offset + (at - begin);
    if (auto ok = WriteGuard::protect(at, at + length); !ok) return fail(ok.error());
    auto copied = file_io(SYS_pwrite64, fd_, at, length, file_at);
    void* mapped = MAP_FAILED;
    if (copied)
      mapped = map_over(at, length, fd_, file_at);
    const int err = errno;
    if (mapped == MAP_FAILED) {
      // This piece's old pages are still there, whole: make them writable
      // again, and move the pieces before it back.
      WriteGuard::restore();
      if (at > begin) move_out_locked(begin, at, offset);
      return copied ? fail(static_cast<std::errc>(err)) : copied;
    }
    WriteGuard::release();
  }
  return {};
}

void MemoryBacking::move_out_locked(uint64_t begin, uint64_t end, uint64_t offset) {
  for (uint64_t at = begin; at < end; at += kMovePiece) {
    const uint64_t length = end - at < kMovePiece ? end - at : kMovePiece;
    void* fresh = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (fresh == MAP_FAILED) {
      SOFTHCA_WARN("memory backing: no memory to move %llu bytes back; they stay shared",
                   static_cast<unsigned long long>(length));
      continue;
    }
    if (auto ok = WriteGuard::protect(at, at + length); !ok) {
      ::munmap(fresh, length);
      continue;
    }
    auto copied = file_io(SYS_pread64, fd_, reinterpret_cast<uint64_t>(fresh), length, offset + (at - begin));
    void* moved = MAP_FAILED;
    if (copied)
      moved = move_over(fresh, length, at);
    if (moved == MAP_FAILED) {
      ::munmap(fresh, length);
      WriteGuard::restore();
    } else {
      WriteGuard::release();
    }
  }
}

Result<SharedPages> MemoryBacking::share(const void* addr, uint64_t length) {
  const uint64_t start = reinterpret_cast<uint64_t>(addr);
  if (length == 0 || start + length < start) return fail(std::errc::invalid_argument);
  // Whole pages only (see the header): the partial ones stay where they are.
  const uint64_t begin = (start + kPage - 1) & ~(kPage - 1);
  const uint64_t end = (start + length) & ~(kPage - 1);
  if (begin < start || end <= begin) return fail(std::errc::not_supported);

  std::lock_guard lock(mutex_);
  auto after = ranges_.upper_bound(begin);
  if (after != ranges_.begin()) {
    auto& [first, range] = *std::prev(after);
    if (first <= begin && end <= range.end) {
      ++range.uses;
      return SharedPages{begin, end - begin, range.offset + (begin - first)};
    }
    if (range.end > begin) return fail(std::errc::not_supported);
  }
  if (after != ranges_.end() && after->first < end) return fail(std::errc::not_supported);

  // Each moved range is a mapping of its own and may split the one around it
  // in three: keep well below vm.max_map_count (65,530 by default), which
  // the application needs too. Past this, registrations keep copying.
  if (ranges_.size() >= kMaxRanges) return fail(std::errc::not_supported);
  auto shareable = range_shareable_in_process(begin, end);
  if (!shareable) return fail(shareable.error());
  if (!*shareable) return fail(std::errc::not_supported);
  if (auto ok = open_file_locked(); !ok) return fail(ok.error());
  auto offset = allocate_locked(end - begin);
  if (!offset) return fail(offset.error());
  if (auto ok = move_in_locked(begin, end, *offset); !ok) {
    free_locked(*offset, end - begin);
    return fail(ok.error());
  }
  ranges_.emplace(begin, Range{end, *offset, 1});
  return SharedPages{begin, end - begin, *offset};
}

void MemoryBacking::unshare(const SharedPages& pages) {
  std::lock_guard lock(mutex_);
  auto after = ranges_.upper_bound(pages.begin);
  if (after == ranges_.begin()) return;
  auto it = std::prev(after);
  if (pages.begin + pages.length > it->second.end || --it->second.uses > 0) return;
  const uint64_t begin = it->first;
  const Range range = it->second;
  ranges_.erase(it);
  if (mapped_from(begin, range.end, inode_)) move_out_locked(begin, range.end, range.offset);
  free_locked(range.offset, range.end - begin);
}

}  // namespace softhca::host
