// The host's table of raw packet flows.
#include "host/raw_flows.hpp"

#include <cstring>
#include <new>

#include "host/host_identity.hpp"
#include "host/host_registry.hpp"

namespace softhca::host {
namespace {

constexpr uint64_t kMagic = 0x736f667472617731ULL;  // "softraw1"
constexpr uint32_t kVersion = 2;  // 2: entries carry the owner's start time

ProcessIdentity owner_of(const RawFlowEntry& e) { return ProcessIdentity{e.proc, e.pid, e.start_time}; }

class Locked {
 public:
  explicit Locked(pthread_mutex_t* m) : m_(m) { lock_robust_mutex(m_, "raw flow table"); }
  ~Locked() { pthread_mutex_unlock(m_); }
  Locked(const Locked&) = delete;
  Locked& operator=(const Locked&) = delete;

 private:
  pthread_mutex_t* m_;
};

}  // namespace

Result<RawFlows*> RawFlows::open() {
  auto dir = host_directory();
  if (!dir) return fail(dir.error());
  return open_in(*dir);
}

Result<RawFlows*> RawFlows::open_in(const std::string& dir) {
  const std::string path = dir + "/raw-flows-v" + std::to_string(kVersion);
  auto mem = map_shared_file(path, sizeof(RawFlowsLayout), kMagic, kVersion, "raw flow table", [](void* fresh) {
    auto* layout = static_cast<RawFlowsLayout*>(fresh);
    init_robust_mutex(&layout->mutex);
    layout->generation.store(1, std::memory_order_relaxed);
  });
  if (!mem) return fail(mem.error());
  return new RawFlows(static_cast<RawFlowsLayout*>(*mem));
}

RawFlows::~RawFlows() { unmap_shared_file(layout_, sizeof(RawFlowsLayout)); }

Result<void> RawFlows::add(const ProcessIdentity& owner, uint64_t id, const void* payload, std::size_t len,
                           const HostRegistry& registry) {
  if (len > kRawFlowPayloadBytes) return fail(std::errc::invalid_argument);
  Locked guard(&layout_->mutex);
  RawFlowEntry* free_entry = nullptr;
  for (RawFlowEntry& e : layout_->entries) {
    if (e.in_use == 0) {
      free_entry = &e;
      break;
    }
  }
  if (free_entry == nullptr) {
    // Full: take back the entries of processes that are gone.
    for (RawFlowEntry& e : layout_->entries) {
      if (!registry.process_alive(owner_of(e))) {
        e.in_use = 0;
        if (free_entry == nullptr) free_entry = &e;
      }
    }
  }
  if (free_entry == nullptr) return fail(std::errc::not_enough_memory);
  free_entry->proc = owner.proc;
  free_entry->pid = owner.pid;
  free_entry->start_time = owner.start_time;
  free_entry->id = id;
  free_entry->payload_len = static_cast<uint32_t>(len);
  std::memcpy(free_entry->payload, payload, len);
  free_entry->in_use = 1;
  layout_->generation.fetch_add(1, std::memory_order_seq_cst);
  return {};
}

void RawFlows::remove(const ProcessIdentity& owner, uint64_t id) {
  Locked guard(&layout_->mutex);
  for (RawFlowEntry& e : layout_->entries) {
    if (e.in_use != 0 && e.id == id && owner_of(e) == owner) {
      e.in_use = 0;
      layout_->generation.fetch_add(1, std::memory_order_seq_cst);
      return;
    }
  }
}

void RawFlows::snapshot(std::vector<RawFlowEntry>& out, const HostRegistry& registry, uint64_t& generation) {
  out.clear();
  Locked guard(&layout_->mutex);
  generation = layout_->generation.load(std::memory_order_acquire);
  for (const RawFlowEntry& e : layout_->entries)
    if (e.in_use != 0 && registry.process_alive(owner_of(e))) out.push_back(e);
}

}  // namespace softhca::host
