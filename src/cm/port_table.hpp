// The per-user port table of the connection manager: which (port space,
// address, port) each rdma_cm id of this host has bound or listens on, and
// where its process's CM endpoint is. It is what the kernel's rdma_cm bind
// lists are for a host, shared by the processes of one Unix user.
//
// Storage: one file in the user's runtime directory (host/runtime_dir.hpp;
// mode 0600, owner checked) mapped by every
// process that uses the CM, guarded by a robust process-shared mutex. A
// process registers once (pid, start time, socket path) and owns the bindings
// it creates; the entries of a process that died — killed, crashed, exited
// without cleaning up — are reclaimed when they get in the way (a conflicting
// bind, a lookup that finds them, a full table), never trusted: a connect to a
// dead owner's listener is answered like a connect to nobody.
//
// The rules (what conflicts, which listener takes a connection) are pure
// functions over records, tested on their own.
#pragma once

#include <pthread.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "cm/mad_codec.hpp"
#include "common/result.hpp"
#include "host/shared_file.hpp"

namespace softhca::cm {

inline constexpr uint32_t kMaxCmProcs = 512;
// Room for one port space's whole ephemeral range and then some: with 8,192
// `cmtime -c 10000` had 1,808 of its rdma_resolve_addr calls refused (the
// kernel gives each port space the 28,232 ports of ip_local_port_range).
inline constexpr uint32_t kMaxBindings = 32768;
inline constexpr std::size_t kSocketPathMax = 108;  // sizeof(sockaddr_un::sun_path)
// IANA's dynamic range, which Linux's default ip_local_port_range overlaps.
inline constexpr uint16_t kEphemeralFirst = 32768;
inline constexpr uint16_t kEphemeralLast = 60999;

// An address as the table keeps it: IPv4 in ::ffff:a.b.c.d form.
struct BindKey {
  uint16_t ps = 0;       // RDMA_PS_TCP, ...
  uint16_t port = 0;     // host order; 0 only in queries for "any port"
  uint8_t family = 0;    // AF_INET or AF_INET6
  bool wildcard = false; // 0.0.0.0 or ::
  Gid addr{};

  bool operator==(const BindKey&) const = default;
};

// kernel's cma_check_port: same port space and port, and either side is a
// wildcard or the addresses are equal.
bool bindings_conflict(const BindKey& a, const BindKey& b);
// Does a listener bound to `listener` take a connection to `dst`? An IPv4
// wildcard takes IPv4 destinations, an IPv6 wildcard takes both.
bool listener_matches(const BindKey& listener, const BindKey& dst);

struct BindingRecord {
  uint32_t proc = 0;   // owner's slot + 1; 0 = free
  uint16_t ps = 0;
  uint16_t port = 0;
  uint8_t family = 0;
  uint8_t wildcard = 0;
  uint8_t listening = 0;
  uint8_t reserved = 0;
  Gid addr{};
};

// The best listener for `dst` among `records`: an exact address beats a
// wildcard. Returns the index, or nullopt.
std::optional<std::size_t> find_listener_index(std::span<const BindingRecord> records, const BindKey& dst);

struct ProcRecord {
  uint32_t pid = 0;  // 0 = free
  uint32_t reserved = 0;
  uint64_t start_time = 0;
  char socket_path[kSocketPathMax] = {};
};

struct PortTableLayout {
  host::SharedFileHeader header;
  pthread_mutex_t mutex;
  uint32_t port_cursor;
  uint32_t reserved;
  ProcRecord procs[kMaxCmProcs];
  BindingRecord bindings[kMaxBindings];
};

struct ListenerInfo {
  uint32_t pid = 0;
  std::string socket_path;
};

class PortTable {
 public:
  // The calling user's table (cm-v<N>.ports in its runtime directory,
  // host/runtime_dir.hpp), created on first use.
  static Result<PortTable*> open();
  // The table of directory `dir` (for tests: unlinked when closed if asked).
  static Result<PortTable*> open_in(const std::string& dir, bool unlink_on_close);
  // For tests: a private table, removed when closed.
  static Result<PortTable*> open_named(const std::string& path, bool unlink_on_close);
  ~PortTable();

  // Registers a process; returns its handle (slot + 1).
  Result<uint32_t> register_process(uint32_t pid, uint64_t start_time, const std::string& socket_path);
  // Drops the process and every binding it holds.
  void unregister_process(uint32_t proc);

  // Reserves key (key.port 0: an ephemeral port). Returns the binding's handle
  // and the port. Errors: address_in_use, too_many_files_open (table full).
  Result<std::pair<uint32_t, uint16_t>> bind(uint32_t proc, const BindKey& key);
  void set_listening(uint32_t binding, bool listening);
  void unbind(uint32_t binding);

  // The process listening for dst (ps, address, port), if any and alive.
  std::optional<ListenerInfo> find_listener(const BindKey& dst);
  // The live process registered as `proc` (a handle), if any: where CM
  // messages for the comm IDs it allocated go (cm/host_routing.hpp).
  std::optional<ListenerInfo> find_process(uint32_t proc);
  // Called when a peer's endpoint turned out dead: reclaims it if it is.
  void reclaim_if_dead(uint32_t pid);

  // For tests: whether a process counts as alive (overridable).
  using AliveFn = bool (*)(uint32_t pid, uint64_t start_time);
  void set_alive_check(AliveFn fn) { alive_ = fn; }

 private:
  PortTable(PortTableLayout* layout, std::string path, bool unlink_on_close)
      : layout_(layout), path_(std::move(path)), unlink_on_close_(unlink_on_close) {}
  void lock();
  void unlock();
  bool alive_locked(uint32_t slot) const;
  void release_proc_locked(uint32_t slot);
  void reclaim_dead_locked();
  bool port_free_locked(const BindKey& key, bool& reclaimed);

  PortTableLayout* layout_;
  std::string path_;
  bool unlink_on_close_;
  AliveFn alive_ = nullptr;
};

bool process_is_alive(uint32_t pid, uint64_t start_time);

}  // namespace softhca::cm
