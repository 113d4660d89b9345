// softhca C++ API: the owning handle each verbs object wrapper is built on.
#pragma once

#include <utility>

#include "error.hpp"

namespace softhca::detail {

// Owns one verbs object; Traits names its destroy verb:
//   struct Traits { static constexpr const char* verb = "ibv_dealloc_pd";
//                   static int destroy(ibv_pd*) noexcept; };
template <class T, class Traits>
class Handle {
 public:
  Handle() noexcept = default;
  // Adopts `p`: the handle destroys it.
  explicit Handle(T* p) noexcept : p_(p) {}
  Handle(Handle&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) {
      (void)reset();
      p_ = std::exchange(o.p_, nullptr);
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() { (void)reset(); }

  // Destroys the object now. On failure (EBUSY: a PD that still has QPs, a
  // CQ with unacknowledged events...) the handle keeps it, so the caller can
  // remove the cause and call reset() again; the destructor retries once.
  Expected<void> reset() noexcept {
    if (p_ == nullptr) return {};
    errno = 0;
    auto r = check_rc(Traits::destroy(p_), Traits::verb);
    if (r) p_ = nullptr;
    return r;
  }
  // Gives up ownership without destroying.
  [[nodiscard]] T* release() noexcept { return std::exchange(p_, nullptr); }

  T* get() const noexcept { return p_; }
  T* operator->() const noexcept { return p_; }
  explicit operator bool() const noexcept { return p_ != nullptr; }

 private:
  T* p_ = nullptr;
};

}  // namespace softhca::detail
