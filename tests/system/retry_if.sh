#!/usr/bin/env bash
# retry_if.sh: run a test command; if it fails and its output matches RE,
# which names a known race of the peer program itself (not of softhca), say
# so and run it again, up to twice more.
#
#   retry_if.sh RE -- COMMAND [ARGS...]
#
# Used for perftest's rdma_cm mode (-R) in Debian's perftest 4.5-0.17: its
# client connects the data QPs as soon as the control connection is up, and
# can reach the server before the server listens for them; the server's CM
# then rejects the request (no listener: error 8), as a kernel's would.
# Upstream perftest retries the connection, but 4.5-0.17 retries with the
# CM ids it has just destroyed and dies (SIGBUS). Reruns stand in for
# upstream's retry: on a loaded 2-core machine the race came twice in a row
# in 2 of 3 full CI runs (about 1 run in 10 alone), so a run gets three
# tries; a failure of any other kind fails at once.
set -u -o pipefail

re=${1:?usage: retry_if.sh RE -- COMMAND [ARGS...]}
shift
[[ ${1:-} == -- ]] && shift
(($#)) || { echo "usage: retry_if.sh RE -- COMMAND [ARGS...]" >&2; exit 2; }

log=$(mktemp "${TMPDIR:-/tmp}/retry_if.XXXXXX") || exit 1
trap 'rm -f "$log"' EXIT

for try in 1 2 3; do
  "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  ((rc != 0)) && grep -E -q -- "$re" "$log" || break
  ((try < 3)) && echo "retry_if: the run failed on a known race of the peer program (/$re/); running it again"
done
exit "$rc"
