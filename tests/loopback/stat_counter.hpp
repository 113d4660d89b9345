// A counter as `softhca stat` prints it, for the tests that judge the udp
// link's drops by its counters. The test target defines SOFTHCA_TOOL, the
// path of the softhca tool.
#pragma once

#include <cstdio>
#include <string>

namespace loopback {

// The value `softhca stat -a ARGS` prints for counter `name` (its first
// line: with --qp, the QP's), or -1.
inline long long stat_counter(const std::string& args, const std::string& name) {
  const std::string command = std::string(SOFTHCA_TOOL) + " stat -a " + args + " 2>/dev/null";
  FILE* out = ::popen(command.c_str(), "r");
  if (out == nullptr) return -1;
  char line[512];
  long long value = -1;
  while (std::fgets(line, sizeof line, out) != nullptr) {
    char key[128];
    long long v = 0;
    if (value < 0 && std::sscanf(line, " %127s %lld", key, &v) == 2 && name == key) value = v;
  }
  ::pclose(out);
  return value;
}

}  // namespace loopback
