// Memory for a registered buffer: whole pages of its own, as rdma-core's
// forksafe_alloc gives. Our shm link moves a registered range's pages into
// a shared file (docs/architecture.md, "shm"); a small heap buffer would
// take its neighbours on the heap page (a socket's mutex, malloc's own
// lists) along, and every registration and deregistration would then
// write-protect memory other threads are using.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <utility>

namespace softhca::rsocket {

class PageBuffer {
 public:
  PageBuffer() = default;
  ~PageBuffer() { reset(); }
  PageBuffer(const PageBuffer&) = delete;
  PageBuffer& operator=(const PageBuffer&) = delete;

  // Zero-filled; false when the memory could not be mapped.
  bool allocate(size_t size) {
    reset();
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    const size_t mapped = (size + page - 1) / page * page;
    void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    data_ = static_cast<uint8_t*>(p);
    size_ = size;
    mapped_ = mapped;
    return true;
  }
  void reset() {
    if (data_ != nullptr) ::munmap(data_, mapped_);
    data_ = nullptr;
    size_ = mapped_ = 0;
  }
  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  uint8_t& operator[](size_t i) { return data_[i]; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;
};

}  // namespace softhca::rsocket
