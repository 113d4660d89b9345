#!/usr/bin/env bash
# many_processes.sh BINDIR LIBDIR: several processes of one host on the udp
# link at once (SOFTHCA_LINK=udp). They all share UDP port 4791, and the
# kernel gives a packet to any of them; each must reach the process that
# owns its QP. Four client/server pairs of RC pingpongs that check every
# byte they receive (-c) run together; all must pass, and `softhca stat`
# must show packets handed from one process to another. (RC, because a
# hand-off that waits past its patience loses the packet, as a full queue
# would on a NIC: RC recovers it, UD and UC by design do not.)
set -u -o pipefail
bindir=${1:?usage: many_processes.sh BINDIR LIBDIR}
libdir=${2:?usage: many_processes.sh BINDIR LIBDIR}
work=$(mktemp -d "${TMPDIR:-/tmp}/softhca-many.XXXXXX") || exit 1
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
export SOFTHCA_RUNTIME_DIR=$work/run SOFTHCA_LINK=udp LD_LIBRARY_PATH=$libdir
mkdir -p "$SOFTHCA_RUNTIME_DIR"
base=$((20000 + RANDOM % 20000))
programs=("ibv_rc_pingpong -g 0 -n 400 -s 8192 -c" "ibv_rc_pingpong -g 0 -n 400 -s 100 -c"
          "ibv_rc_pingpong -g 0 -n 400 -s 20000 -c" "ibv_rc_pingpong -g 0 -n 400 -s 1 -c")

# wait_listening PORT: until a server listens on TCP PORT (10 s at most).
wait_listening() {
  for _ in $(seq 200); do
    ss -ltn "sport = :$1" | grep -q LISTEN && return 0
    sleep 0.05
  done
  return 1
}

for i in "${!programs[@]}"; do
  timeout 90 ${programs[$i]} -p $((base + i)) >"$work/server$i.log" 2>&1 &
  pids+=($!)
done
for i in "${!programs[@]}"; do
  wait_listening $((base + i)) || { echo "FAIL: server $i does not listen"; cat "$work/server$i.log"; exit 1; }
done
clients=()
for i in "${!programs[@]}"; do
  timeout 90 ${programs[$i]} -p $((base + i)) 127.0.0.1 >"$work/client$i.log" 2>&1 &
  clients+=($!)
  pids+=($!)
done
status=0
for i in "${!programs[@]}"; do
  if ! wait "${clients[$i]}"; then
    echo "FAIL: client of '${programs[$i]}' failed:"
    cat "$work/client$i.log"
    status=1
  elif ! grep -q "400 iters" "$work/client$i.log"; then
    echo "FAIL: client of '${programs[$i]}' did not report 400 iterations:"
    cat "$work/client$i.log"
    status=1
  fi
done
for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
pids=()
"$bindir/softhca" stat --port -a >"$work/stat.txt" || status=1
cat "$work/stat.txt"
forwarded=$(awk '$1 == "forwarded_pkts" { print $2 }' "$work/stat.txt")
((${forwarded:-0} > 0)) || { echo "FAIL: no packet was handed from one process to another"; status=1; }
((status == 0)) && echo PASS || echo FAIL
exit "$status"
