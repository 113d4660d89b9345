#include "cm/port_table.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include "common/log.hpp"
#include "host/host_identity.hpp"
#include "host/host_registry.hpp"

namespace softhca::cm {
namespace {

constexpr uint64_t kMagic = 0x736f6674636d7031ULL;  // "softcmp1"
constexpr uint32_t kVersion = 2;  // 2: 32,768 bindings

void init_layout(PortTableLayout* layout) {
  host::init_robust_mutex(&layout->mutex);
  std::random_device rd;
  layout->port_cursor = rd() % (kEphemeralLast - kEphemeralFirst + 1);
}

BindKey key_of(const BindingRecord& r) {
  BindKey k;
  k.ps = r.ps;
  k.port = r.port;
  k.family = r.family;
  k.wildcard = r.wildcard != 0;
  k.addr = r.addr;
  return k;
}

}  // namespace

bool bindings_conflict(const BindKey& a, const BindKey& b) {
  if (a.ps != b.ps || a.port != b.port) return false;
  return a.wildcard || b.wildcard || a.addr == b.addr;
}

bool listener_matches(const BindKey& listener, const BindKey& dst) {
  if (listener.ps != dst.ps || listener.port != dst.port) return false;
  if (listener.wildcard) return listener.family == AF_INET6 || dst.family == AF_INET;
  return listener.addr == dst.addr;
}

std::optional<std::size_t> find_listener_index(std::span<const BindingRecord> records, const BindKey& dst) {
  std::optional<std::size_t> wildcard;
  for (std::size_t i = 0; i < records.size(); ++i) {
    const BindingRecord& r = records[i];
    if (r.proc == 0 || r.listening == 0) continue;
    const BindKey k = key_of(r);
    if (!listener_matches(k, dst)) continue;
    if (!k.wildcard) return i;
    if (!wildcard) wildcard = i;
  }
  return wildcard;
}

bool process_is_alive(uint32_t pid, uint64_t start_time) {
  if (pid == 0) return false;
  if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  return host::process_start_time(pid) == start_time;
}

Result<PortTable*> PortTable::open() {
  auto dir = host::host_directory();
  if (!dir) return fail(dir.error());
  return open_in(*dir, false);
}

Result<PortTable*> PortTable::open_in(const std::string& dir, bool unlink_on_close) {
  return open_named(dir + "/cm-v" + std::to_string(kVersion) + ".ports", unlink_on_close);
}

Result<PortTable*> PortTable::open_named(const std::string& path, bool unlink_on_close) {
  auto mem = host::map_shared_file(path, sizeof(PortTableLayout), kMagic, kVersion, "cm port table",
                                   [](void* fresh) { init_layout(static_cast<PortTableLayout*>(fresh)); });
  if (!mem) return fail(mem.error());
  return new PortTable(static_cast<PortTableLayout*>(*mem), path, unlink_on_close);
}

PortTable::~PortTable() {
  host::unmap_shared_file(layout_, sizeof(PortTableLayout));
  if (unlink_on_close_) ::unlink(path_.c_str());
}

void PortTable::lock() {
  // A holder that died left records consistent at each store (a record's
  // owner field is written last), so the table is usable as is.
  host::lock_robust_mutex(&layout_->mutex, "cm port table");
}

void PortTable::unlock() { pthread_mutex_unlock(&layout_->mutex); }

bool PortTable::alive_locked(uint32_t slot) const {
  const ProcRecord& p = layout_->procs[slot];
  if (p.pid == 0) return false;
  return alive_ ? alive_(p.pid, p.start_time) : process_is_alive(p.pid, p.start_time);
}

void PortTable::release_proc_locked(uint32_t slot) {
  const uint32_t handle = slot + 1;
  for (auto& b : layout_->bindings)
    if (b.proc == handle) b.proc = 0;
  ProcRecord& p = layout_->procs[slot];
  if (p.pid != 0 && p.socket_path[0] != '\0' && !alive_locked(slot)) {
    // A dead process cannot remove its endpoint; do it for it.
    ::unlink(p.socket_path);
  }
  p.socket_path[0] = '\0';
  p.pid = 0;
}

void PortTable::reclaim_dead_locked() {
  for (uint32_t i = 0; i < kMaxCmProcs; ++i) {
    if (layout_->procs[i].pid == 0 || alive_locked(i)) continue;
    SOFTHCA_INFO("cm: reclaiming the ports of dead process %u", layout_->procs[i].pid);
    release_proc_locked(i);
  }
}

Result<uint32_t> PortTable::register_process(uint32_t pid, uint64_t start_time, const std::string& socket_path) {
  if (socket_path.size() >= kSocketPathMax) return fail(std::errc::filename_too_long);
  lock();
  // A new process sweeps up after the ones that died since (their ports and
  // endpoint files): cheap, and it keeps the directory from filling up.
  reclaim_dead_locked();
  for (int attempt = 0; attempt < 2; ++attempt) {
    for (uint32_t i = 0; i < kMaxCmProcs; ++i) {
      ProcRecord& p = layout_->procs[i];
      if (p.pid == pid) {  // a previous process with our pid died without cleaning up
        p.socket_path[0] = '\0';  // its endpoint path is ours now: keep the file
        release_proc_locked(i);
      }
    }
    for (uint32_t i = 0; i < kMaxCmProcs; ++i) {
      ProcRecord& p = layout_->procs[i];
      if (p.pid != 0) continue;
      p.start_time = start_time;
      std::memset(p.socket_path, 0, sizeof p.socket_path);
      std::memcpy(p.socket_path, socket_path.data(), socket_path.size());
      p.pid = pid;
      unlock();
      return i + 1;
    }
    reclaim_dead_locked();
  }
  unlock();
  return fail(std::errc::too_many_files_open_in_system);
}

void PortTable::unregister_process(uint32_t proc) {
  if (proc == 0 || proc > kMaxCmProcs) return;
  lock();
  const uint32_t slot = proc - 1;
  for (auto& b : layout_->bindings)
    if (b.proc == proc) b.proc = 0;
  layout_->procs[slot].socket_path[0] = '\0';
  layout_->procs[slot].pid = 0;
  unlock();
}

bool PortTable::port_free_locked(const BindKey& key, bool& reclaimed) {
  reclaimed = false;
  for (auto& b : layout_->bindings) {
    if (b.proc == 0 || b.port != key.port || b.ps != key.ps) continue;
    if (!bindings_conflict(key_of(b), key)) continue;
    const uint32_t slot = b.proc - 1;
    if (!alive_locked(slot)) {
      SOFTHCA_INFO("cm: port %u was held by dead process %u; reclaiming", key.port, layout_->procs[slot].pid);
      release_proc_locked(slot);
      reclaimed = true;
      continue;
    }
    return false;
  }
  return true;
}

Result<std::pair<uint32_t, uint16_t>> PortTable::bind(uint32_t proc, const BindKey& key) {
  if (proc == 0 || proc > kMaxCmProcs) return fail(std::errc::invalid_argument);
  lock();
  BindKey k = key;
  bool found = false;
  if (k.port != 0) {
    bool reclaimed = false;
    found = port_free_locked(k, reclaimed);
    if (!found) {
      unlock();
      return fail(std::errc::address_in_use);
    }
  } else {
    const uint32_t range = kEphemeralLast - kEphemeralFirst + 1;
    for (uint32_t n = 0; n < range && !found; ++n) {
      const uint32_t off = (layout_->port_cursor + n) % range;
      k.port = static_cast<uint16_t>(kEphemeralFirst + off);
      bool reclaimed = false;
      if (port_free_locked(k, reclaimed)) {
        found = true;
        layout_->port_cursor = (off + 1) % range;
      }
    }
    if (!found) {
      unlock();
      return fail(std::errc::address_in_use);
    }
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    for (uint32_t i = 0; i < kMaxBindings; ++i) {
      BindingRecord& b = layout_->bindings[i];
      if (b.proc != 0) continue;
      b.ps = k.ps;
      b.port = k.port;
      b.family = k.family;
      b.wildcard = k.wildcard ? 1 : 0;
      b.listening = 0;
      b.addr = k.addr;
      b.proc = proc;
      unlock();
      return std::pair{i + 1, k.port};
    }
    reclaim_dead_locked();
  }
  unlock();
  return fail(std::errc::too_many_files_open_in_system);
}

void PortTable::set_listening(uint32_t binding, bool listening) {
  if (binding == 0 || binding > kMaxBindings) return;
  lock();
  layout_->bindings[binding - 1].listening = listening ? 1 : 0;
  unlock();
}

void PortTable::unbind(uint32_t binding) {
  if (binding == 0 || binding > kMaxBindings) return;
  lock();
  layout_->bindings[binding - 1].proc = 0;
  unlock();
}

std::optional<ListenerInfo> PortTable::find_process(uint32_t proc) {
  if (proc == 0 || proc > kMaxCmProcs) return std::nullopt;
  const uint32_t slot = proc - 1;
  lock();
  std::optional<ListenerInfo> info;
  if (alive_locked(slot)) info = ListenerInfo{layout_->procs[slot].pid, std::string(layout_->procs[slot].socket_path)};
  unlock();
  return info;
}

std::optional<ListenerInfo> PortTable::find_listener(const BindKey& dst) {
  lock();
  for (int attempt = 0; attempt < 4; ++attempt) {
    auto idx = find_listener_index(std::span<const BindingRecord>(layout_->bindings, kMaxBindings), dst);
    if (!idx) break;
    const uint32_t slot = layout_->bindings[*idx].proc - 1;
    if (!alive_locked(slot)) {
      release_proc_locked(slot);
      continue;
    }
    ListenerInfo info{layout_->procs[slot].pid, std::string(layout_->procs[slot].socket_path)};
    unlock();
    return info;
  }
  unlock();
  return std::nullopt;
}

void PortTable::reclaim_if_dead(uint32_t pid) {
  lock();
  for (uint32_t i = 0; i < kMaxCmProcs; ++i)
    if (layout_->procs[i].pid == pid && !alive_locked(i)) release_proc_locked(i);
  unlock();
}

}  // namespace softhca::cm
