// A lock that the one thread using it takes and releases without a locked
// instruction. Most QPs and CQs are driven by a single thread (perftest,
// an MPI rank, a UCX worker), yet every post and every poll paid a locked
// instruction for its lock (~6 ns on the 2-core VM, and a drain of the
// store buffer before the operation's own store).
//
// How. After a thread has taken the lock kClaimAfter times in a row (the
// setup thread that created and connected a QP is often not the one that
// posts), the lock is biased to it: from then on that thread enters by
// storing "inside" in a word of its own and then checking that the bias
// still holds, with only a compiler barrier between. Any other thread takes
// the inner lock and revokes the bias, once and for good: it marks the bias
// revoked, calls membarrier(2) so that every thread of the process passes a
// full fence, and waits for the owner to be outside. Either the owner's
// store came before that fence and the revoker sees it inside (and waits),
// or the owner's check comes after it and sees the bias revoked (and takes
// the inner lock) -- the asymmetric Dekker of FutexMutex's unlock.
//
// The bias is granted once and never passed on: the owner, after seeing it
// revoked, may still be between its first check and its store of "inside"
// (preempted there for any time), and that late store would clobber a new
// owner's word.
//
// Where the kernel refuses membarrier the bias is never granted, and the
// lock is its inner lock.
#pragma once

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

#include "common/asymmetric_fence.hpp"
#include "common/thread_identity.hpp"

namespace softhca {

// Where a test may widen the windows of the biased entry (nothing in use).
struct NoLockHooks {
  static void between_check_and_entry() {}
};

template <class Inner, class Hooks = NoLockHooks>
class BiasedLock {
 public:
  // How many acquisitions in a row by one thread earn it the bias.
  static constexpr uint32_t kClaimAfter = 32;

  BiasedLock() = default;
  // Tests build locks that never grant the bias, to compare.
  explicit BiasedLock(bool may_bias) : bias_(may_bias && asymmetric_fence::kAvailable ? kNone : kRevoked) {}
  BiasedLock(const BiasedLock&) = delete;
  BiasedLock& operator=(const BiasedLock&) = delete;

  void lock() noexcept {
    const uintptr_t me = current_thread();
    if (bias_.load(std::memory_order_relaxed) == me) [[likely]] {
      // The bias may be revoked from here on, and the revoker may already
      // have looked at inside_: hence the second check.
      Hooks::between_check_and_entry();
      inside_.store(1, std::memory_order_relaxed);
      asymmetric_fence::light_barrier();
      if (bias_.load(std::memory_order_relaxed) == me) [[likely]] return;
      leave_biased();  // revoked meanwhile: the revoker may be waiting for us
    }
    lock_inner(me);
  }

  void unlock() noexcept {
    if (owner_ == current_thread() && inside_.load(std::memory_order_relaxed) != 0) [[likely]] {
      leave_biased();
      return;
    }
    inner_.unlock();
  }

  // Whether the bias is held by a thread right now (tests).
  bool biased() const {
    const uintptr_t b = bias_.load(std::memory_order_acquire);
    return b != kNone && b != kRevoked;
  }
  bool revoked() const { return bias_.load(std::memory_order_acquire) == kRevoked; }

 private:
  static constexpr uintptr_t kNone = 0;     // not granted yet
  static constexpr uintptr_t kRevoked = 1;  // revoked (or never to be granted); no thread pointer is odd

  // Threads are told apart by current_thread(): a thread that reuses a
  // dead owner's pointer inherits the bias, which is sound: the dead owner
  // is not inside.

  void leave_biased() noexcept {
    inside_.store(0, std::memory_order_release);
    // Nothing orders this load after the store here: a revoker's fence does.
    if (bias_.load(std::memory_order_relaxed) == kRevoked) [[unlikely]] wake_revoker();
  }

  [[gnu::noinline]] void wake_revoker() noexcept {
    ::syscall(SYS_futex, &inside_, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
  }

  [[gnu::noinline]] void lock_inner(uintptr_t me) noexcept {
    inner_.lock();
    const uintptr_t bias = bias_.load(std::memory_order_relaxed);
    if (bias == kRevoked) return;
    if (bias != kNone) {
      revoke();
      return;
    }
    if (streak_thread_ != me) {
      streak_thread_ = me;
      streak_ = 0;
    }
    if (++streak_ == kClaimAfter) {
      owner_ = me;
      // Release: the next biased section reads what holders of the inner
      // lock wrote (the claim is made under it, so this is belt and braces).
      bias_.store(me, std::memory_order_release);
    }
  }

  // Under the inner lock: no other thread claims or revokes meanwhile.
  [[gnu::noinline]] void revoke() noexcept {
    bias_.store(kRevoked, std::memory_order_seq_cst);
    // Without the fence the owner could still enter unseen; the kernel gave
    // the registration (or no bias would exist), so this only repeats if a
    // child lost it. Never go on unfenced.
    while (!asymmetric_fence::fence_all_threads()) ::sched_yield();
    while (inside_.load(std::memory_order_acquire) != 0)
      ::syscall(SYS_futex, &inside_, FUTEX_WAIT_PRIVATE, 1, nullptr, nullptr, 0);
  }

  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) && std::atomic<uint32_t>::is_always_lock_free);
  std::atomic<uintptr_t> bias_{asymmetric_fence::kAvailable ? kNone : kRevoked};
  std::atomic<uint32_t> inside_{0};  // written by the owner alone: 1 while it holds the lock by the bias
  // The thread granted the bias, kept after revocation so that it still
  // releases the section it was in by the bias; written once, under the
  // inner lock, before bias_ names it.
  uintptr_t owner_ = kNone;
  uintptr_t streak_thread_ = kNone;  // under the inner lock
  uint32_t streak_ = 0;              // under the inner lock
  Inner inner_;
};

}  // namespace softhca
