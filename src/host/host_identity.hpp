// Which host a process is on. A host is a network namespace: two processes
// in different namespaces have different addresses, routes and ports, so
// they are two machines to softhca as well — each with its own host registry
// (QPNs, keys), CM port table and CM endpoints, and they reach each other
// only over the network. Processes of one namespace share all of that and
// use the shm link.
//
// A host's files live in a directory of their own inside the user's runtime
// directory (host/runtime_dir.hpp): <runtime dir>/net-<inode of the
// namespace>, created with the same private mode.
#pragma once

#include <string>

#include "common/result.hpp"

namespace softhca::host {

// "net-<inode>" of this process's network namespace (/proc/self/ns/net), or
// "net-unknown" where /proc cannot tell (then every such process is one host).
std::string host_key();

// This process's host directory: runtime_directory()/host_key(), created if missing.
Result<std::string> host_directory();

// The same with its inputs explicit (tests): `runtime_dir` must exist.
Result<std::string> host_directory_in(const std::string& runtime_dir, const std::string& key);

}  // namespace softhca::host
