// softhca-cm-agent: the host's CM agent. It outlives the processes whose
// connections it watches, as the kernel's CM does: when a process connected
// to another host dies without disconnecting (SIGKILL, a crash), the agent
// sends what that process's CM would have sent, so that its peers see
// DISCONNECTED (or REJECTED, mid-handshake) instead of waiting for ever
// (cm/departure_table.hpp, cm/departure_agent.hpp). It holds no port: it
// sends from a socket of its own (link/udp/management_port.hpp).
//
// Started by the CM of the first process that needs it (cm/agent_launcher.hpp),
// never by hand; `--foreground` keeps it attached for a look at what it does
// (with SOFTHCA_LOG=debug). It exits once the departure table has been empty
// for kIdleExit.
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
#include "cm/port_table.hpp"
#include "common/log.hpp"
#include "host/host_identity.hpp"
#include "link/udp/management_port.hpp"

namespace {

using namespace softhca;
using Clock = std::chrono::steady_clock;

// How often the table is looked at for owners that died: the delay between
// a kill and its peers' DREQ.
constexpr auto kLookEvery = std::chrono::milliseconds(100);
constexpr auto kIdleExit = std::chrono::seconds(3);

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
  auto opened = cm::DepartureTable::open();
  if (!opened) {
    SOFTHCA_WARN("cm agent: cannot open the departure table: %s",
                 std::make_error_code(opened.error()).message().c_str());
    return 1;
  }
  const std::unique_ptr<cm::DepartureTable> table(*opened);
  auto sender = udp::ManagementSender::open();
  if (!sender) {
    SOFTHCA_WARN("cm agent: no UDP socket: %s", std::make_error_code(sender.error()).message().c_str());
    return 1;
  }
  SOFTHCA_DEBUG("cm agent: watching %s", dir->c_str());
  cm::DepartureAgent agent(cm::process_is_alive);
  auto idle_since = Clock::now();
  for (;;) {
    const auto now = Clock::now();
    for (const auto& send : agent.look(*table, now)) {
      if (auto r = (*sender)->send(send.local, send.remote, send.mad); !r)
        SOFTHCA_DEBUG("cm agent: cannot send: %s", std::make_error_code(r.error()).message().c_str());
    }
    if (!agent.table_was_empty()) {
      idle_since = now;
    } else if (now - idle_since >= kIdleExit && table->lock_if_idle()) {
      // Still empty, and nobody can write a record before the flock goes:
      // whoever writes next finds no agent and starts one.
      ::close(lock_fd);
      table->unlock_after_idle();
      SOFTHCA_DEBUG("cm agent: no connection left; exiting");
      return 0;
    }
    auto wake = now + kLookEvery;
    if (const auto due = agent.next_due()) wake = std::min(wake, *due);
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(wake - Clock::now()).count();
    ::poll(nullptr, 0, static_cast<int>(std::max<long long>(ms, 0)));
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
