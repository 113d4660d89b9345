// Registered memory of whole pages, for the loopback tests of the direct
// paths (direct_path_test.cpp, send_lane_test.cpp).
#pragma once

#include <infiniband/verbs.h>
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "loopback.hpp"

namespace loopback {

// Registered memory of whole pages: what the direct path reaches (a range
// on a partly registered page is copied the general way), as perftest's
// buffers are.
class Pages {
 public:
  Pages(ibv_pd* pd, size_t size, int access = Buffer::kAllAccess) : size_(size) {
    void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return;
    bytes_ = static_cast<uint8_t*>(p);
    mr_ = ibv_reg_mr(pd, bytes_, size_, access);
  }
  ~Pages() {
    if (mr_) ibv_dereg_mr(mr_);
    if (bytes_) ::munmap(bytes_, size_);
  }
  Pages(const Pages&) = delete;
  Pages& operator=(const Pages&) = delete;

  bool ok() const { return mr_ != nullptr; }
  // Deregisters now; the memory stays.
  int dereg() {
    const int rc = ibv_dereg_mr(mr_);
    mr_ = nullptr;
    return rc;
  }
  uint8_t* data() { return bytes_; }
  size_t size() const { return size_; }
  uint64_t addr(size_t offset = 0) { return reinterpret_cast<uint64_t>(bytes_ + offset); }
  uint32_t rkey() const { return mr_->rkey; }
  ibv_mr* mr() const { return mr_; }
  ibv_sge sge(size_t offset, uint32_t length) { return ibv_sge{addr(offset), length, mr_->lkey}; }
  std::span<uint8_t> span(size_t offset, size_t length) { return {bytes_ + offset, length}; }

 private:
  size_t size_;
  uint8_t* bytes_ = nullptr;
  ibv_mr* mr_ = nullptr;
};

}  // namespace loopback
