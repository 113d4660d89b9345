#include "transport/tag_matching.hpp"

#include <new>

namespace softhca::transport {
namespace {

uint64_t load_be(const unsigned char* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v = (v << 8) | p[i];
  return v;
}

void store_be(unsigned char* p, int n, uint64_t v) {
  for (int i = n - 1; i >= 0; --i) {
    p[i] = static_cast<unsigned char>(v & 0xff);
    v >>= 8;
  }
}

// Spins between two questions about a holder's liveness: a walk of the
// longest list takes microseconds, the question a system call or two.
constexpr uint32_t kSpinsBetweenLivenessChecks = 1u << 16;

// The list's lock held for a scope.
class Held {
 public:
  Held(TagList& list, const LockTaker& me) : list_(list) { list_.lock(me); }
  ~Held() { list_.unlock(); }
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;

 private:
  TagList& list_;
};

}  // namespace

void TagList::lock(const LockTaker& me) {
  for (uint32_t spins = 1;; ++spins) {
    uint32_t holder = 0;
    if (lock_word.compare_exchange_weak(holder, me.pid, std::memory_order_acquire, std::memory_order_relaxed)) return;
    if (holder != 0 && me.alive != nullptr && spins % kSpinsBetweenLivenessChecks == 0 && !me.alive(holder) &&
        lock_word.compare_exchange_strong(holder, me.pid, std::memory_order_acquire, std::memory_order_relaxed)) {
      uint32_t in_use = 0;
      for (uint32_t i = 0; i < max_tags; ++i) in_use += entries()[i].in_use != 0;
      used = in_use;
      return;
    }
    __builtin_ia32_pause();
  }
}

TmHeader decode_tm_header(std::span<const unsigned char, kTmHeaderBytes> bytes) {
  TmHeader h;
  h.opcode = bytes[0];
  h.app_ctx = static_cast<uint32_t>(load_be(bytes.data() + 4, 4));
  h.tag = load_be(bytes.data() + 8, 8);
  return h;
}

void encode_tm_header(const TmHeader& header, std::span<unsigned char, kTmHeaderBytes> out) {
  out[0] = header.opcode;
  out[1] = out[2] = out[3] = 0;
  store_be(out.data() + 4, 4, header.app_ctx);
  store_be(out.data() + 8, 8, header.tag);
}

RndvHeader decode_rndv_header(std::span<const unsigned char, kRndvHeaderBytes> bytes) {
  RndvHeader h;
  h.va = load_be(bytes.data(), 8);
  h.rkey = static_cast<uint32_t>(load_be(bytes.data() + 8, 4));
  h.length = static_cast<uint32_t>(load_be(bytes.data() + 12, 4));
  return h;
}

TagList* TagList::init(void* memory, uint32_t max_tags) {
  auto* list = new (memory) TagList{};
  list->max_tags = max_tags;
  return list;
}

Result<uint32_t> TagList::add(uint64_t tag, uint64_t mask, uint64_t wr_id, const ReceiveSge* sges, uint32_t num_sge,
                              const LockTaker& me) {
  if (num_sge > limits::kTmMaxSge || (num_sge > 0 && sges == nullptr)) return fail(std::errc::invalid_argument);
  Held guard(*this, me);
  if (used >= max_tags) return fail(std::errc::not_enough_memory);
  for (uint32_t i = 0; i < max_tags; ++i) {
    const uint32_t slot = (next_slot + i) % max_tags;
    TagEntry& e = entries()[slot];
    if (e.in_use) continue;
    e.tag = tag;
    e.mask = mask;
    e.wr_id = wr_id;
    e.num_sge = num_sge;
    for (uint32_t s = 0; s < num_sge; ++s) e.sge[s] = sges[s];
    e.seq = next_seq++;
    e.in_use = 1;
    ++used;
    next_slot = (slot + 1) % max_tags;
    return slot;
  }
  return fail(std::errc::not_enough_memory);  // unreachable while `used` is right
}

bool TagList::remove(uint32_t handle, const LockTaker& me) {
  Held guard(*this, me);
  if (handle >= max_tags || !entries()[handle].in_use) return false;
  entries()[handle].in_use = 0;
  --used;
  return true;
}

void TagList::report(uint32_t unexpected_cnt, const LockTaker& me) {
  Held guard(*this, me);
  synced = unexpected_cnt;
}

bool TagList::in_sync(const LockTaker& me) {
  Held guard(*this, me);
  return in_sync_locked();
}

std::optional<TagEntry> TagList::match_locked(uint64_t tag) {
  if (!in_sync_locked()) return std::nullopt;
  // The oldest posted entry wins, as MPI's ordering asks.
  TagEntry* best = nullptr;
  for (uint32_t i = 0; i < max_tags; ++i) {
    TagEntry& e = entries()[i];
    if (!e.in_use || ((tag ^ e.tag) & e.mask) != 0) continue;
    if (best == nullptr || e.seq < best->seq) best = &e;
  }
  if (best == nullptr) return std::nullopt;
  best->in_use = 0;
  --used;
  return *best;
}

}  // namespace softhca::transport
