#include "host/attachment.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/log.hpp"
#include "host/process_identity.hpp"

namespace softhca::host {
namespace {

constexpr uint64_t kSegmentMagic = 0x736f667468736567ULL;

}  // namespace

void wake_doorbell(std::atomic<uint32_t>& word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE, 1, nullptr, nullptr, 0);
}

Result<Attachment*> Attachment::open() {
  auto* self = new Attachment();
  auto registry = HostRegistry::open();
  if (!registry) {
    delete self;
    return fail(registry.error());
  }
  self->registry_ = *registry;
  auto segment = ProcessSegment::create();
  if (!segment) {
    delete self;
    return fail(segment.error());
  }
  self->segment_ = *segment;
  self->pid_ = self_pid();
  SegmentHeader& header = self->header();
  header.pid = self->pid_;
  header.magic = kSegmentMagic;
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&header.owner_alive, &attr);
  pthread_mutexattr_destroy(&attr);
  auto proc = self->registry_->register_process(self->pid_, static_cast<uint32_t>(self->segment_->fd()));
  if (!proc) {
    SOFTHCA_ERROR("too many softhca processes on this host");
    delete self;
    return fail(proc.error());
  }
  self->proc_ = *proc;
  self->registered_ = true;
  return self;
}

Attachment::~Attachment() {
  if (registered_) registry_->unregister_process(proc_);
  delete segment_;
  delete registry_;
}

char* Attachment::segment_base(uint32_t proc) {
  if (proc == proc_) return segment_->base();
  const ProcSlot& slot = registry_->proc(proc);
  const uint32_t pid = slot.pid.load(std::memory_order_acquire);
  if (pid == 0) return nullptr;
  return peers_.map(pid, slot.segment_fd, slot.start_time);
}

PeerBackings::View Attachment::backing_view(uint32_t proc, uint64_t length) {
  if (proc == proc_) {
    const uint64_t known = own_length_.load(std::memory_order_acquire);
    if (known >= length && known != 0) return PeerBackings::View{own_base_.load(std::memory_order_relaxed), known};
  }
  const ProcSlot& slot = registry_->proc(proc);
  const uint32_t fd_plus1 = slot.backing_fd_plus1.load(std::memory_order_acquire);
  const uint32_t pid = slot.pid.load(std::memory_order_acquire);
  if (fd_plus1 == 0 || pid == 0) return {};
  const PeerBackings::View view =
      backings_.map(pid, slot.start_time, fd_plus1 - 1, slot.backing_inode.load(std::memory_order_relaxed), length);
  if (proc == proc_ && view.base != nullptr) {
    std::lock_guard guard(own_mutex_);
    if (view.length > own_length_.load(std::memory_order_relaxed)) {
      own_base_.store(view.base, std::memory_order_relaxed);
      own_length_.store(view.length, std::memory_order_release);
    }
  }
  return view;
}

char* Attachment::in_new_window(uint32_t proc, uint64_t offset, uint64_t length, PeerBackings::View& window) {
  const PeerBackings::View view = backing_view(proc, offset + length);
  if (view.base == nullptr) return nullptr;
  window = view;
  return window.base + offset;
}

void Attachment::notify(uint32_t proc, uint32_t pid, const Event& event) {
  if (proc != proc_ && registry_->proc(proc).pid.load(std::memory_order_acquire) != pid) return;
  char* base = segment_base(proc);
  if (base == nullptr) return;
  auto* header = reinterpret_cast<SegmentHeader*>(base);
  if (!header->push(event)) {
    SOFTHCA_WARN("event ring of process %u is full; event dropped", header->pid);
    return;
  }
  header->doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (header->sleeping.load(std::memory_order_seq_cst)) wake_doorbell(header->doorbell);
}

void Attachment::ring_own_doorbell() {
  SegmentHeader& h = header();
  h.doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (h.sleeping.load(std::memory_order_seq_cst)) wake_doorbell(h.doorbell);
}

}  // namespace softhca::host
