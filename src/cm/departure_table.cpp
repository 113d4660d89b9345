#include "cm/departure_table.hpp"

#include <unistd.h>

#include <cstring>

#include "host/host_identity.hpp"

namespace softhca::cm {
namespace {

constexpr uint64_t kMagic = 0x736f6674636d6431ULL;  // "softcmd1"
constexpr uint32_t kVersion = 1;

}  // namespace

Result<DepartureTable*> DepartureTable::open() {
  auto dir = host::host_directory();
  if (!dir) return fail(dir.error());
  return open_in(*dir, false);
}

Result<DepartureTable*> DepartureTable::open_in(const std::string& dir, bool unlink_on_close) {
  const std::string path = dir + "/cm-v" + std::to_string(kVersion) + ".departures";
  auto mem = host::map_shared_file(path, sizeof(DepartureTableLayout), kMagic, kVersion, "cm departure table",
                                   [](void* fresh) {
                                     auto* layout = static_cast<DepartureTableLayout*>(fresh);
                                     host::init_robust_mutex(&layout->mutex);
                                   });
  if (!mem) return fail(mem.error());
  return new DepartureTable(static_cast<DepartureTableLayout*>(*mem), path, unlink_on_close);
}

DepartureTable::~DepartureTable() {
  host::unmap_shared_file(layout_, sizeof(DepartureTableLayout));
  if (unlink_on_close_) ::unlink(path_.c_str());
}

// A holder that died inside left every record consistent: a record's pid,
// which says it is in use, is written last and cleared first.
void DepartureTable::lock() { host::lock_robust_mutex(&layout_->mutex, "cm departure table"); }
void DepartureTable::unlock() { pthread_mutex_unlock(&layout_->mutex); }

Result<uint32_t> DepartureTable::write(std::optional<uint32_t> slot, const DepartureRecord& record) {
  lock();
  uint32_t at = kMaxDepartures;
  if (slot && *slot < kMaxDepartures && layout_->records[*slot].pid == record.pid &&
      layout_->records[*slot].local_comm_id == record.local_comm_id) {
    at = *slot;
  } else {
    for (uint32_t n = 0; n < kMaxDepartures; ++n) {
      const uint32_t i = (layout_->cursor + n) % kMaxDepartures;
      if (layout_->records[i].pid == 0) {
        at = i;
        layout_->cursor = (i + 1) % kMaxDepartures;
        break;
      }
    }
  }
  if (at == kMaxDepartures) {
    unlock();
    return fail(std::errc::too_many_files_open_in_system);
  }
  DepartureRecord& r = layout_->records[at];
  r.pid = 0;
  r.local_comm_id = record.local_comm_id;
  r.start_time = record.start_time;
  r.generation = ++layout_->generation;
  r.wait_ms = record.wait_ms;
  r.retries = record.retries;
  r.local = record.local;
  r.remote = record.remote;
  r.mad = record.mad;
  r.pid = record.pid;
  if (at >= layout_->high_water) layout_->high_water = at + 1;
  unlock();
  return at;
}

void DepartureTable::free_locked(uint32_t slot) {
  layout_->records[slot].pid = 0;
  while (layout_->high_water > 0 && layout_->records[layout_->high_water - 1].pid == 0) --layout_->high_water;
}

void DepartureTable::free(uint32_t slot, uint32_t pid, uint32_t local_comm_id) {
  if (slot >= kMaxDepartures) return;
  lock();
  const DepartureRecord& r = layout_->records[slot];
  if (r.pid == pid && r.local_comm_id == local_comm_id) free_locked(slot);
  unlock();
}

bool DepartureTable::end(uint32_t local_comm_id, const Gid& remote) {
  bool ended = false;
  lock();
  for (uint32_t i = 0; i < layout_->high_water; ++i) {
    const DepartureRecord& r = layout_->records[i];
    if (r.pid != 0 && r.local_comm_id == local_comm_id && r.remote == remote) {
      free_locked(i);
      ended = true;
      break;
    }
  }
  unlock();
  return ended;
}

std::vector<DepartureSnapshot> DepartureTable::snapshot() {
  std::vector<DepartureSnapshot> out;
  lock();
  for (uint32_t i = 0; i < layout_->high_water; ++i)
    if (layout_->records[i].pid != 0) out.push_back({i, layout_->records[i]});
  unlock();
  return out;
}

void DepartureTable::free_generation(uint32_t slot, uint32_t generation) {
  if (slot >= kMaxDepartures) return;
  lock();
  if (layout_->records[slot].pid != 0 && layout_->records[slot].generation == generation) free_locked(slot);
  unlock();
}

bool DepartureTable::lock_if_idle() {
  lock();
  if (layout_->high_water == 0) return true;
  unlock();
  return false;
}

void DepartureTable::unlock_after_idle() { unlock(); }

}  // namespace softhca::cm
