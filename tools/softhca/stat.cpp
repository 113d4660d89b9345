// softhca stat: the device's counters, as `rdma statistic` shows a NIC's:
// the port's (every softhca process of this host, live or gone, as this
// user) and each live QP's. They come from shared memory (common/counters.hpp):
// the port's from the host registry, a QP's from its owner's process segment,
// mapped read-only for the moment of reading. Nothing is changed and no
// device is opened, so it may run while programs do.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "commands.hpp"
#include "common/counters.hpp"
#include "host/host_identity.hpp"
#include "host/host_registry.hpp"
#include "host/shared_queues.hpp"

namespace softhca::tool {
namespace {

using Values = std::array<uint64_t, kCounterCount>;

struct Options {
  bool all = false;                // counters that are zero too
  bool port_only = false;
  std::optional<uint32_t> qpn;     // only this QP
};

const char* qp_type_name(uint32_t type) {
  switch (type) {
    case 2: return "RC";  // IBV_QPT_RC
    case 3: return "UC";
    case 4: return "UD";
    case 8: return "RAW_PACKET";  // IBV_QPT_RAW_PACKET
    case 9: return "XRC_SEND";    // IBV_QPT_XRC_SEND (INI)
    case 10: return "XRC_RECV";   // IBV_QPT_XRC_RECV (TGT)
    case host::SharedQp::kXrcSrqRecord: return "XRC_SRQ";  // an XRC SRQ's number, from the QPN space
    default: return "?";
  }
}

const char* qp_state_name(uint32_t state) {
  static constexpr const char* kNames[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};
  return state < std::size(kNames) ? kNames[state] : "GONE";
}

void print_values(const Values& values, bool all) {
  bool any = false;
  for (std::size_t c = 0; c < kCounterCount; ++c) {
    if (values[c] == 0 && !all) continue;
    any = true;
    std::printf("  %-24.*s %20llu\n", static_cast<int>(kCounterInfo[c].name.size()), kCounterInfo[c].name.data(),
                static_cast<unsigned long long>(values[c]));
  }
  if (!any) std::puts("  (all counters are zero; -a shows them)");
}

// What `softhca stat` shows of one QP.
struct QpView {
  uint32_t qpn = 0;
  uint32_t type = 0;
  uint32_t state = 0;
  Values values{};
};

// A copy of the SharedQp at `offset` in the segment of process `pid` (its
// memfd is fd `segment_fd` there), or nothing when the process is gone or
// not ours to read.
std::optional<QpView> read_shared_qp(uint32_t pid, uint32_t segment_fd, uint64_t offset) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(segment_fd);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t start = offset & ~(page - 1);
  const uint64_t length = offset - start + sizeof(host::SharedQp);
  void* map = ::mmap(nullptr, length, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(start));
  ::close(fd);
  if (map == MAP_FAILED) return std::nullopt;
  const auto* qp = reinterpret_cast<const host::SharedQp*>(static_cast<const char*>(map) + (offset - start));
  QpView view;
  view.qpn = qp->qpn;
  view.type = qp->qp_type;
  view.state = qp->state.load(std::memory_order_acquire);
  for (std::size_t c = 0; c < kCounterCount; ++c) view.values[c] = qp->counters.get(static_cast<Counter>(c));
  ::munmap(map, length);
  return view;
}

// A TGT QP (the host's, in the registry itself): its view, and the pids of
// the processes that hold handles to it.
std::optional<QpView> read_tgt_qp(const host::HostRegistry& registry, uint32_t qpn, std::string& pids) {
  const host::TgtQpRecord* record = registry.tgt_qp(qpn);
  if (record == nullptr) return std::nullopt;
  QpView view;
  view.qpn = qpn;
  view.type = record->shared.qp_type;
  view.state = record->shared.state.load(std::memory_order_acquire);
  for (std::size_t c = 0; c < kCounterCount; ++c) view.values[c] = record->shared.counters.get(static_cast<Counter>(c));
  host::TgtHandle holders[host::kMaxTgtHolders];
  const uint32_t n = registry.tgt_holders(*record, holders);
  for (uint32_t i = 0; i < n; ++i) pids += (i ? "," : "") + std::to_string(holders[i].pid);
  return view;
}

int print_qps(host::HostRegistry& registry, const Options& options) {
  int shown = 0;
  for (uint32_t index = 0; index < host::kMaxQpSlots; ++index) {
    const host::QpSlot& slot = registry.qp_slot(index);
    const uint32_t qpn = slot.qpn.load(std::memory_order_acquire);
    if (qpn == 0 || (options.qpn && *options.qpn != qpn)) continue;
    const uint32_t proc = slot.proc.load(std::memory_order_relaxed);
    if (proc == host::kHostOwned) {
      std::string pids;
      auto qp = read_tgt_qp(registry, qpn, pids);
      if (!qp || pids.empty()) continue;
      std::printf("qp 0x%06x  pids %s  %s  %s\n", qpn, pids.c_str(), qp_type_name(qp->type), qp_state_name(qp->state));
      print_values(qp->values, options.all);
      ++shown;
      continue;
    }
    if (proc >= host::kMaxProcs || !registry.process_alive(proc)) continue;
    const host::ProcSlot& owner = registry.proc(proc);
    const uint32_t pid = owner.pid.load(std::memory_order_acquire);
    auto qp = read_shared_qp(pid, owner.segment_fd, slot.shm_offset.load(std::memory_order_relaxed));
    if (!qp || qp->qpn != qpn) continue;  // gone while we looked
    std::printf("qp 0x%06x  pid %u  %s  %s\n", qpn, pid, qp_type_name(qp->type), qp_state_name(qp->state));
    print_values(qp->values, options.all);
    ++shown;
  }
  return shown;
}

bool parse_qpn(std::string_view text, uint32_t& out) {
  int base = 10;
  if (text.starts_with("0x") || text.starts_with("0X")) {
    text.remove_prefix(2);
    base = 16;
  }
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out, base);
  return ec == std::errc() && end == text.data() + text.size() && !text.empty() && out <= 0xFFFFFF;
}

int stat_main(std::span<char* const> args) {
  Options options;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string_view arg = args[i];
    if (is_help_flag(arg)) {
      std::fwrite(kStatCommand.help.data(), 1, kStatCommand.help.size(), stdout);
      return kExitOk;
    }
    if (arg == "-a" || arg == "--all") {
      options.all = true;
    } else if (arg == "--port") {
      options.port_only = true;
    } else if (arg == "--qp" && i + 1 < args.size()) {
      uint32_t qpn = 0;
      if (!parse_qpn(args[++i], qpn)) {
        std::fprintf(stderr, "softhca stat: --qp takes a QP number (decimal or 0x hex), not '%s'\n", args[i]);
        return kExitUsage;
      }
      options.qpn = qpn;
    } else {
      std::fprintf(stderr, "softhca stat: unexpected '%.*s'; see 'softhca stat --help'\n",
                   static_cast<int>(arg.size()), arg.data());
      return kExitUsage;
    }
  }

  auto dir = host::host_directory();
  if (!dir) {
    std::fprintf(stderr, "softhca stat: no runtime directory: %s\n", std::strerror(to_errno(dir.error())));
    return kExitFailure;
  }
  const std::string path = host::HostRegistry::path_in(*dir);
  if (::access(path.c_str(), F_OK) != 0) {
    // No softhca process has run here as this user: every count is zero,
    // and the registry is not created just to say so.
    if (options.qpn) {
      std::fprintf(stderr, "softhca stat: no QP 0x%x on this host\n", *options.qpn);
      return kExitFailure;
    }
    std::printf("port %s/1  (%s, no softhca process yet)\n", "softhca0", host::host_key().c_str());
    print_values(Values{}, options.all);
    return kExitOk;
  }
  auto registry = host::HostRegistry::open_in(*dir, false);
  if (!registry) {
    std::fprintf(stderr, "softhca stat: cannot open %s: %s\n", path.c_str(),
                 std::strerror(to_errno(registry.error())));
    return kExitFailure;
  }
  std::unique_ptr<host::HostRegistry> owner(*registry);
  if (!options.qpn) {
    uint32_t live = 0;
    for (uint32_t p = 0; p < host::kMaxProcs; ++p) live += owner->process_alive(p) ? 1 : 0;
    std::printf("port %s/1  (%s, %u live process%s)\n", "softhca0", host::host_key().c_str(), live,
                live == 1 ? "" : "es");
    print_values(owner->port_counters(), options.all);
  }
  if (options.port_only) return kExitOk;
  const int shown = print_qps(*owner, options);
  if (options.qpn && shown == 0) {
    std::fprintf(stderr, "softhca stat: no live QP 0x%x on this host\n", *options.qpn);
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace

const Command kStatCommand = {
    .name = "stat",
    .summary = "counters of the port and of each QP: softhca stat [-a] [--port|--qp QPN]",
    .help =
        "usage: softhca stat [-a|--all] [--port | --qp QPN]\n"
        "\n"
        "Shows softhca's counters, as `rdma statistic show` shows a NIC's: first the\n"
        "port's (the sum over every softhca process of this host, that is of this\n"
        "network namespace, run as this user, including processes that have ended),\n"
        "then each live QP's with its owner's pid, type and state (an XRC TGT QP, which\n"
        "the host owns, with the pids of every process holding a handle to it; an\n"
        "XRC SRQ's number shows as XRC_SRQ). Counters that are\n"
        "zero are left out unless -a is given. Names follow the kernel's Soft-RoCE\n"
        "(rxe) hw counters where one exists:\n"
        "\n"
        "  sent_pkts, rcvd_pkts, sent_bytes, rcvd_bytes  packets of the udp link\n"
        "  rdma_sends, rdma_recvs         SEND messages completed / received\n"
        "  duplicate_request, out_of_seq_request        responder: PSN checks\n"
        "  sent_seq_nak, send_rnr_err, sent_nak_*       responder: NAKs sent\n"
        "  rcvd_seq_err, rcvd_rnr_err, rcvd_nak_*       requester: NAKs received\n"
        "  completer_retry_err, retransmitted_pkts      requester: timeouts, resends\n"
        "  retry_exceeded_err, retry_rnr_exceeded_err   completions that gave up\n"
        "  forwarded_pkts, forward_drops  packets handed to the process owning their QP\n"
        "  icrc_err_drops, malformed_drops, unknown_qp_drops, send_err   port drops\n"
        "  src_addr_drops  packets for a connected QP not from its peer's address to its own\n"
        "  pkey_drops      packets of another partition (BTH P_Key)\n"
        "  closed_qp_drops  packets for a QP that does not receive now (RESET, INIT, ERROR)\n"
        "  stale_responses  responses that answered nothing outstanding (repeated ACKs)\n"
        "\n"
        "Processes on one host talk through shared memory, not packets: their\n"
        "messages show in rdma_sends, rdma_recvs, the NAK and retry counters, not\n"
        "in the packet counters.\n"
        "\n"
        "  -a, --all    show counters that are zero too\n"
        "  --port       only the port's counters\n"
        "  --qp QPN     only this QP's counters (decimal or 0x hex)\n"
        "\n"
        "exit status: 0 on success, 1 if the QP asked for is not there or the\n"
        "state cannot be read, 2 on a usage error.\n",
    .main = stat_main,
};

}  // namespace softhca::tool
