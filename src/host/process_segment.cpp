#include "host/process_segment.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/log.hpp"

namespace softhca::host {

int SegmentAllocator::size_class(uint64_t bytes) {
  if (bytes < 64) bytes = 64;
  return std::bit_width(bytes - 1);
}

uint64_t SegmentAllocator::allocate(uint64_t bytes) {
  const int cls = size_class(bytes);
  const uint64_t rounded = 1ULL << cls;
  std::lock_guard guard(mutex_);
  if (auto it = free_.find(cls); it != free_.end()) {
    const uint64_t offset = it->second;
    free_.erase(it);
    return offset;
  }
  // Align each block to min(its size, 4 KiB) so rings start on cache lines and
  // big blocks on pages.
  const uint64_t align = rounded < 4096 ? rounded : 4096;
  const uint64_t offset = (next_ + align - 1) & ~(align - 1);
  if (offset + rounded > limit_) return 0;
  next_ = offset + rounded;
  return offset;
}

void SegmentAllocator::release(uint64_t offset, uint64_t bytes) {
  std::lock_guard guard(mutex_);
  free_.emplace(size_class(bytes), offset);
}

Result<ProcessSegment*> ProcessSegment::create() {
  int fd = ::memfd_create("softhca-segment", MFD_CLOEXEC);
  if (fd < 0) return fail(static_cast<std::errc>(errno));
  if (::ftruncate(fd, static_cast<off_t>(kSegmentBytes)) != 0) {
    const int err = errno;
    ::close(fd);
    return fail(static_cast<std::errc>(err));
  }
  void* mem = ::mmap(nullptr, kSegmentBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (mem == MAP_FAILED) {
    const int err = errno;
    ::close(fd);
    return fail(static_cast<std::errc>(err));
  }
  return new ProcessSegment(fd, static_cast<char*>(mem));
}

ProcessSegment::~ProcessSegment() {
  ::munmap(base_, kSegmentBytes);
  ::close(fd_);
}

uint64_t ProcessSegment::allocate(uint64_t bytes) {
  const uint64_t offset = allocator_.allocate(bytes);
  if (offset != 0) std::memset(base_ + offset, 0, bytes);
  return offset;
}

void ProcessSegment::release(uint64_t offset, uint64_t bytes) {
  // Give the pages back so a freed ring does not keep memory.
  if (bytes >= 4096 && (offset & 4095) == 0)
    ::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                static_cast<off_t>(bytes & ~uint64_t{4095}));
  allocator_.release(offset, bytes);
}

char* PeerSegments::map(uint32_t pid, uint32_t fd, uint64_t start_time) {
  const uint64_t key = (uint64_t{pid} << 32) | fd;
  std::lock_guard guard(mutex_);
  if (auto it = mappings_.find(key); it != mappings_.end()) {
    if (it->second.start_time == start_time) return it->second.base;
    ::munmap(it->second.base, kSegmentBytes);  // the pid was reused by another process
    mappings_.erase(it);
  }
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%u/fd/%u", pid, fd);
  const int peer_fd = ::open(path, O_RDWR | O_CLOEXEC);
  if (peer_fd < 0) {
    SOFTHCA_DEBUG("cannot open the segment of process %u: %s", pid, std::strerror(errno));
    return nullptr;
  }
  void* mem = ::mmap(nullptr, kSegmentBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, peer_fd, 0);
  ::close(peer_fd);
  if (mem == MAP_FAILED) return nullptr;
  mappings_.emplace(key, Mapping{static_cast<char*>(mem), start_time});
  return static_cast<char*>(mem);
}

PeerSegments::~PeerSegments() {
  for (auto& [key, mapping] : mappings_) ::munmap(mapping.base, kSegmentBytes);
}

}  // namespace softhca::host
