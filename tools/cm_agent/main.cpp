// softhca-cm-agent: the host's CM agent. It outlives the processes whose
// connections it watches, as the kernel's CM does: when a process connected
// to another host dies without disconnecting (SIGKILL, a crash), the agent
// sends the DREQs that process's CM would have sent, so that its peers see
// DISCONNECTED instead of waiting for ever (cm/departure_table.hpp,
// cm/departure_agent.hpp). While no process of the host has a udp link, it
// also answers for them on port 4791 as the kernel's CM answers for ids it
// no longer has (cm/refusals.hpp): a DREP for a DREQ (the peer of a process
// that exited asks again because its DREP was lost), a REJ for a REQ and a
// SIDR_REP for a SIDR_REQ to a listener that is gone.
//
// Started by the CM of the first process that needs it (cm/agent_launcher.hpp),
// never by hand; `--foreground` keeps it attached for a look at what it does
// (with SOFTHCA_LOG=debug). It exits once the departure table has been empty
// for kIdleExit, or kIdleExitAlone while no process of the host is left.
#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "cm/agent_launcher.hpp"
#include "cm/departure_agent.hpp"
#include "cm/departure_table.hpp"
#include "cm/host_routing.hpp"
#include "cm/local_transport.hpp"
#include "cm/mad_codec.hpp"
#include "cm/port_table.hpp"
#include "cm/refusals.hpp"
#include "common/log.hpp"
#include "host/host_identity.hpp"
#include "host/host_registry.hpp"
#include "link/udp/management_port.hpp"

namespace {

using namespace softhca;
using Clock = std::chrono::steady_clock;

// How often the table is looked at for owners that died: the delay between
// a kill and its peers' DREQ.
constexpr auto kLookEvery = std::chrono::milliseconds(100);
constexpr auto kIdleExit = std::chrono::seconds(3);
// With nobody left on the host, the peers of the processes that exited may
// still ask again (a DREQ whose DREP was lost is retried for up to its
// retries x its wait): answer them for a while.
constexpr auto kIdleExitAlone = std::chrono::seconds(30);

void usage(FILE* to) {
  std::fputs(
      "usage: softhca-cm-agent [--foreground]\n"
      "\n"
      "The host's softhca CM agent: sends the DREQs of processes that died while\n"
      "connected to another host, and retries them until answered, as the kernel's\n"
      "CM does for a killed process. softhca's librdmacm starts it when needed;\n"
      "there is no need to run it by hand. It exits once no connection is left.\n"
      "\n"
      "  --foreground  stay attached to the terminal (default: detach at once)\n"
      "  --help        this text\n"
      "\n"
      "Environment: SOFTHCA_RUNTIME_DIR (whose table to watch), SOFTHCA_LOG.\n",
      to);
}

// Whether any process of the host is attached to softhca (and may receive
// on port 4791): then the agent leaves the port to it.
bool host_has_processes(const host::HostRegistry& registry) {
  for (uint32_t i = 0; i < host::kMaxProcs; ++i)
    if (registry.proc(i).pid.load(std::memory_order_acquire) != 0 && registry.process_alive(i)) return true;
  return false;
}

// What came to the host's QP1 while the agent held the port. A MAD for a
// live process (one that started since the agent's last look, and binds the
// port too, but the kernel gave this flow to the agent) is passed on to it
// over the local CM transport, as processes pass on each other's MADs
// (cm/host_routing.hpp). The rest is answered as the kernel's CM answers
// for an id it does not have.
void answer(const udp::ArrivedGsi& arrived, cm::DepartureTable& departures, cm::PortTable& ports,
            cm::LocalTransport& local, udp::ManagementSender& sender) {
  const auto mad = cm::decode(arrived.mad);
  if (!mad) return;
  const cm::MadRoute route = cm::route_of(*mad);
  std::optional<cm::ListenerInfo> owner;
  if (route.by == cm::MadRoute::By::kListener) owner = ports.find_listener(route.listener);
  if (route.by == cm::MadRoute::By::kCommId) owner = ports.find_process(cm::comm_id_owner(route.comm_id));
  if (owner) {
    cm::RelayedMad relayed;
    relayed.remote = arrived.src;
    relayed.local = arrived.dst;
    relayed.mad = arrived.mad;
    if (auto r = local.send(cm::Peer{owner->pid, owner->socket_path, std::nullopt}, cm::encode_relayed(relayed)); !r)
      SOFTHCA_DEBUG("cm agent: cannot pass a MAD on to process %u", owner->pid);
    return;
  }
  if (const auto* drep = std::get_if<cm::DrepMsg>(&mad->msg)) departures.end(drep->remote_comm_id, arrived.src);
  if (const auto* dreq = std::get_if<cm::DreqMsg>(&mad->msg)) departures.end(dreq->remote_comm_id, arrived.src);
  const auto reply = cm::answer_for_nobody(*mad);
  if (!reply) return;
  SOFTHCA_DEBUG("cm agent: answering a %s for nobody with a %s", cm::message_name(mad->msg),
                cm::message_name(reply->msg));
  const cm::MadBytes bytes = cm::encode(*reply);
  if (auto r = sender.send(arrived.dst, arrived.src, bytes); !r)
    SOFTHCA_DEBUG("cm agent: cannot answer: %s", std::make_error_code(r.error()).message().c_str());
}

int run() {
  auto dir = host::host_directory();
  if (!dir) {
    SOFTHCA_WARN("cm agent: no runtime directory: %s", std::make_error_code(dir.error()).message().c_str());
    return 1;
  }
  const std::string lock_path = cm::agent_lock_path(*dir);
  const int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd < 0) {
    SOFTHCA_WARN("cm agent: cannot open %s: %s", lock_path.c_str(), std::strerror(errno));
    return 1;
  }
  if (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) return 0;  // another agent runs
  auto opened_table = cm::DepartureTable::open();
  auto opened_ports = cm::PortTable::open();
  auto opened_registry = host::HostRegistry::open();
  if (!opened_table || !opened_ports || !opened_registry) {
    SOFTHCA_WARN("cm agent: cannot open the host's tables in %s", dir->c_str());
    return 1;
  }
  const std::unique_ptr<cm::DepartureTable> table(*opened_table);
  const std::unique_ptr<cm::PortTable> ports(*opened_ports);
  const std::unique_ptr<host::HostRegistry> registry(*opened_registry);
  auto endpoints = cm::endpoint_directory();
  auto local = endpoints ? cm::LocalTransport::open(*endpoints + "/cm-agent-" + std::to_string(::getpid()) + ".sock")
                         : Result<std::unique_ptr<cm::LocalTransport>>(fail(endpoints.error()));
  if (!local) {
    SOFTHCA_WARN("cm agent: no local CM endpoint: %s", std::make_error_code(local.error()).message().c_str());
    return 1;
  }
  auto sender = udp::ManagementSender::open();
  if (!sender) {
    SOFTHCA_WARN("cm agent: no UDP socket: %s", std::make_error_code(sender.error()).message().c_str());
    return 1;
  }
  SOFTHCA_DEBUG("cm agent: watching %s", dir->c_str());
  cm::DepartureAgent agent(cm::process_is_alive);
  std::unique_ptr<udp::ManagementListener> listener;
  auto idle_since = Clock::now();
  for (;;) {
    const auto now = Clock::now();
    for (const auto& send : agent.look(*table, now)) {
      if (auto r = (*sender)->send(send.local, send.remote, send.mad); !r)
        SOFTHCA_DEBUG("cm agent: cannot send a DREQ: %s", std::make_error_code(r.error()).message().c_str());
    }
    const bool alone = !host_has_processes(*registry);
    if (alone && !listener) {
      if (auto l = udp::ManagementListener::open()) {
        listener = std::move(*l);
        SOFTHCA_DEBUG("cm agent: no process of the host is left; answering for them on port 4791");
      }
    } else if (!alone && listener) {
      listener.reset();
      SOFTHCA_DEBUG("cm agent: a process of the host is back; leaving port 4791 to it");
    }
    if (!agent.table_was_empty()) {
      idle_since = now;
    } else if (now - idle_since >= (alone ? kIdleExitAlone : kIdleExit) && table->lock_if_idle()) {
      // Still empty, and nobody can write a record before the flock goes:
      // whoever writes next finds no agent and starts one.
      ::close(lock_fd);
      table->unlock_after_idle();
      SOFTHCA_DEBUG("cm agent: no connection left; exiting");
      (*local)->leave_at_exit();
      return 0;
    }
    auto wake = now + kLookEvery;
    if (const auto due = agent.next_due()) wake = std::min(wake, *due);
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(wake - Clock::now()).count();
    pollfd fds[2] = {{-1, POLLIN, 0}, {-1, POLLIN, 0}};
    if (listener) {
      const auto lfds = listener->fds();
      fds[0].fd = lfds[0];
      fds[1].fd = lfds[1];
    }
    if (::poll(fds, 2, static_cast<int>(std::max<long long>(ms, 0))) > 0 && listener) {
      for (const auto& arrived : listener->take()) answer(arrived, *table, *ports, **local, **sender);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool foreground = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--foreground") {
      foreground = true;
    } else if (arg == "--help" || arg == "-h") {
      usage(stdout);
      return 0;
    } else {
      std::fprintf(stderr, "softhca-cm-agent: unknown argument '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  // The terminal's signals are for the application it started us beside:
  // Ctrl-C on rping must not take the agent that disconnects rping's peers.
  for (int sig : {SIGINT, SIGQUIT, SIGHUP, SIGTSTP, SIGTTIN, SIGTTOU, SIGPIPE}) std::signal(sig, SIG_IGN);
  if (!foreground) {
    // Detach: the process that started us waits for this one, which leaves
    // at once; the agent goes on as a child of init (or of a subreaper).
    // It stays in the starter's process group, so that whoever kills that
    // group (a test's clean-up) kills it too.
    const pid_t child = ::fork();
    if (child < 0) return 1;
    if (child > 0) _exit(0);
    if (::chdir("/") != 0) return 1;
  }
  return run();
}
