// This process's attachment to the host: the host registry, its own process
// segment (whose header is its doorbell and event ring), the peers' segments
// it has mapped, and the one way to raise an event in another process. The
// engine's node holds one; the shm link reaches other processes through it.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

#include "common/result.hpp"
#include "host/host_registry.hpp"
#include "host/peer_backings.hpp"
#include "host/process_segment.hpp"
#include "host/shared_queues.hpp"

namespace softhca::host {

class Attachment {
 public:
  // Opens the registry, creates this process's segment and registers it.
  static Result<Attachment*> open();
  ~Attachment();
  Attachment(const Attachment&) = delete;
  Attachment& operator=(const Attachment&) = delete;

  HostRegistry& registry() { return *registry_; }
  ProcessSegment& segment() { return *segment_; }
  SegmentHeader& header() { return *segment_->at<SegmentHeader>(0); }
  uint32_t proc() const { return proc_; }
  uint32_t pid() const { return pid_; }

  // The base of the segment of registry process `proc` (ours or a peer's), or nullptr.
  char* segment_base(uint32_t proc);
  // The backing file of registered memory of process `proc` (a peer's, or
  // this process's own: its MRs are reached through the file, not through
  // addresses the application may have unmapped since),
  // mapped here over at least its first `length` bytes (base nullptr if it
  // cannot be). The window stays mapped while this attachment lives.
  PeerBackings::View backing_view(uint32_t proc, uint64_t length);
  // Where [addr, addr + length) of process `proc`'s registered memory lies
  // in our window onto its backing file, when `span` (the MR's pages in the
  // file) holds the range whole: those pages are reached there, not at
  // `addr`, which the application may have unmapped. nullptr otherwise (a
  // partial end page, memory that never moved, no window). `window` is the
  // caller's copy of the window, looked up again only when too short.
  char* in_backing(uint32_t proc, const SharedSpan& span, uint64_t addr, uint64_t length, PeerBackings::View& window) {
    if (!span.holds(addr, length)) return nullptr;
    const uint64_t offset = span.offset_of(addr);
    if (window.base == nullptr || offset + length > window.length) return in_new_window(proc, offset, length, window);
    return window.base + offset;
  }
  // in_backing's case of a window too short (or none yet): looked up again.
  char* in_new_window(uint32_t proc, uint64_t offset, uint64_t length, PeerBackings::View& window);
  uint32_t pid_of(uint32_t proc) const { return registry_->proc(proc).pid.load(std::memory_order_acquire); }

  // Queues an event for the owner of `proc` and rings its doorbell.
  // Only while process `pid` still holds registry slot `proc`: a reclaimed
  // slot may belong to a newcomer that knows nothing of the event's object.
  void notify(uint32_t proc, uint32_t pid, const Event& event);
  // Wakes this process's own progress thread.
  void ring_own_doorbell();

 private:
  Attachment() = default;

  HostRegistry* registry_ = nullptr;
  ProcessSegment* segment_ = nullptr;
  PeerSegments peers_;
  PeerBackings backings_;
  // Our own window, kept here: the udp link and a QP of this process reach
  // our MRs through it at every packet, and PeerBackings::map takes a lock.
  // A window of a live process is never unmapped (peer_backings.hpp), so a
  // reader that sees a length may use any base stored before it: the base
  // is stored first, the length after it with release, and only ever grows
  // (under own_mutex_).
  std::mutex own_mutex_;
  std::atomic<char*> own_base_{nullptr};
  std::atomic<uint64_t> own_length_{0};
  uint32_t proc_ = 0;
  uint32_t pid_ = 0;
  bool registered_ = false;
};

// The doorbell's futex: wake one waiter of `word`.
void wake_doorbell(std::atomic<uint32_t>& word);

}  // namespace softhca::host
