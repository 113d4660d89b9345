#!/usr/bin/env bash
# run_in_netns.sh CMD [ARGS...]: runs CMD in a network namespace of its own
# that holds only lo (up). For tests of the udp link on one host: every
# softhca process of a network namespace binds UDP port 4791 (SO_REUSEPORT)
# and the kernel spreads arriving packets over them all, so any other
# softhca process there (another test, another checkout's test run, a
# user's program with another runtime directory) may be given this test's
# packets and drop them. In a namespace of its own the test is alone.
# Where no namespace can be made (not root), CMD runs here, with a note.
set -u -o pipefail
(($#)) || { echo "usage: run_in_netns.sh CMD [ARGS...]" >&2; exit 2; }
if [[ ${SOFTHCA_TEST_NETNS:-} != 1 ]]; then
  if [[ $(id -u) == 0 ]] && unshare -n true 2>/dev/null; then
    exec unshare -n env SOFTHCA_TEST_NETNS=1 bash "${BASH_SOURCE[0]}" "$@"
  fi
  echo "run_in_netns.sh: no network namespace of its own (needs root); port 4791 is shared with" \
       "this machine's other softhca processes" >&2
  exec "$@"
fi
ip link set lo up || exit 1
exec "$@"
