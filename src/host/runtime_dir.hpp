// Where a user's softhca files live: the host registry, the CM port table and
// the CM sockets, all in one private directory (owned by the user, mode 0700).
//
// Why one directory rather than well-known file names in /dev/shm or /tmp:
// those directories are world-writable, so another user could create our
// names first and every ibv_open_device or rdma_cm call of ours would fail.
// A directory name can be squatted as well, but then we skip it: the
// candidates are tried in a fixed order, so every process of the user arrives
// at the same one and they still find each other.
//
// The rule: $SOFTHCA_RUNTIME_DIR when set (created if missing; it must be
// ours and 0700, or softhca fails with a message naming it); otherwise the
// first usable of /dev/shm/softhca-<uid>, then .1, .2, ... .15. Usable: a
// directory (not a link) owned by us with mode 0700, or a name that does not
// exist yet (we create it). An existing usable candidate is preferred over
// creating an earlier one, so a squatter that removes its squat later does
// not split the user's processes between two registries. /dev/shm keeps the
// shared files on tmpfs, where their robust mutexes live in memory.
// $XDG_RUNTIME_DIR is not used: a user's processes do not all see the same
// one (ssh, cron, sudo), and they must all agree on the registry.
#pragma once

#include <string>

#include "common/result.hpp"

namespace softhca::host {

inline constexpr int kRuntimeDirCandidates = 16;

// The calling user's runtime directory, by the rule above.
// Errors: permission_denied when $SOFTHCA_RUNTIME_DIR is unusable or every
// candidate is taken (logged with the paths), or mkdir's errors.
Result<std::string> runtime_directory();

// The rule with its inputs explicit (for tests): `explicit_dir` plays
// $SOFTHCA_RUNTIME_DIR (nullptr or empty: unset), `prefix` the default name.
Result<std::string> runtime_directory_for(const char* explicit_dir, const std::string& prefix);

// Why an existing path is not usable as our private directory, or nullptr
// when it is.
const char* private_dir_problem(const std::string& path);

// Which directory runtime_directory() would use, found without creating or
// changing anything: for `softhca info`, which reports and must not touch.
struct RuntimeDirProbe {
  enum class State {
    kUsable,    // exists and is ours with mode 0700 (or is ours and would be tightened)
    kCreated,   // does not exist; created at first use
    kUnusable,  // runtime_directory() fails; `problem` says why
  };
  std::string path;    // empty when no candidate is usable
  State state = State::kUnusable;
  // kUnusable: why. Otherwise empty, or what runtime_directory() would warn
  // about or do: the first name passed over and why, a mode to tighten.
  std::string detail;
};

RuntimeDirProbe probe_runtime_directory();
// The rule with its inputs explicit, as runtime_directory_for.
RuntimeDirProbe probe_runtime_directory_for(const char* explicit_dir, const std::string& prefix);

}  // namespace softhca::host
