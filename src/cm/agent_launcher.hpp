// Starts the host's CM agent (tools/cm_agent) when a process first needs
// one: when it writes a record into the departure table
// (cm/departure_table.hpp) and no agent runs. No daemon for the user to
// start, as the issue asks, and none left running: the agent exits once the
// table has been empty for a while.
//
// One agent per runtime directory: it holds an exclusive flock on
// cm-agent.lock there for its life, which the kernel drops when it dies, so
// "is an agent running" is one non-blocking flock. An agent exits only with
// the departure table locked and empty, letting go of the flock first; a
// process writes its record (under the same lock) before it looks, so
// either the agent sees the record and stays, or the process sees no agent
// and starts one. Two processes that both start one leave one: the second
// agent cannot take the flock and exits.
//
// The agent is the executable softhca-cm-agent beside the library this code
// is in (build/lib, or the installed private library directory); SOFTHCA_CM_AGENT=off
// never starts one.
#pragma once

#include <string>

namespace softhca::cm {

// The agent's lock file in host directory `dir`.
std::string agent_lock_path(const std::string& dir);

class AgentLauncher {
 public:
  explicit AgentLauncher(std::string host_dir);
  ~AgentLauncher();
  AgentLauncher(const AgentLauncher&) = delete;
  AgentLauncher& operator=(const AgentLauncher&) = delete;

  // After a record was written: starts an agent unless one runs. Cheap when
  // one does (two flock calls).
  void ensure_running();

 private:
  bool spawn();

  std::string lock_path_;
  std::string executable_;  // empty: none to start (off, or not found)
  int fd_ = -1;
};

}  // namespace softhca::cm
