#!/usr/bin/env bash
# harness_selftest.sh [PORT]: checks harness.sh itself with plain TCP peers
# (python3), no RDMA involved: readiness polling, verdicts, output checks,
# timeouts, and that every process the harness started is gone afterwards,
# including one that ignores SIGTERM.
set -u -o pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
harness=$here/harness.sh
port=${1:-18599}
python=/usr/bin/python3
[[ -x $python ]] || python=$(command -v python3) || { echo "selftest: python3 is required"; exit 1; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/softhca-selftest.XXXXXX") || exit 1
own_pids=()
cleanup() {
  local p
  for p in "${own_pids[@]}"; do kill "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT

# peer.py ROLE PORT [MODE]: a tiny TCP server or client.
cat >"$tmp/peer.py" <<'EOF'
import os, signal, socket, sys, time
role, port = sys.argv[1], int(sys.argv[2])
mode = sys.argv[3] if len(sys.argv) > 3 else "ok"
print("pid", os.getpid(), flush=True)
if role == "server":
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode == "slow":
        time.sleep(1.0)  # a client started before listen() would be refused
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(1)
    c, _ = s.accept()
    data = c.recv(100)
    if mode == "stubborn":
        time.sleep(300)
    print("served:", data.decode(), flush=True)
else:
    c = socket.create_connection(("127.0.0.1", port))
    if mode == "hang":
        time.sleep(300)
    c.sendall(b"hello")
    print("connected", flush=True)
    if mode == "loaderr":
        print("prog: symbol lookup error: prog: undefined symbol: ibv_foo", file=sys.stderr)
EOF

server() { echo "$python $tmp/peer.py server $port $*"; }
client() { echo "$python $tmp/peer.py client $port $*"; }

passed=0 failed=0
out=$tmp/out

# expect NAME RC REGEX [MAX_SECONDS] -- HARNESS_ARGS...
expect() {
  local name=$1 want_rc=$2 re=$3 max=${4:-30} rc t0 t1 secs
  shift 4
  [[ ${1:-} == -- ]] && shift
  t0=$SECONDS
  bash "$harness" --name "$name" "$@" >"$out" 2>&1
  rc=$?
  t1=$SECONDS
  secs=$((t1 - t0))
  if [[ $rc == "$want_rc" ]] && grep -E -q -- "$re" "$out" && ((secs <= max)); then
    echo "ok   $name (rc $rc, ${secs}s)"
    passed=$((passed + 1))
  else
    echo "FAIL $name: rc $rc (want $want_rc), ${secs}s (max $max), /$re/ must match:"
    sed 's/^/     | /' "$out"
    failed=$((failed + 1))
  fi
}

# gone ROLE: the pid that ROLE printed in the last run must not exist any more.
gone() {
  local role=$1 pid
  pid=$(sed -n "s/^\[[^]]* $role\] pid \([0-9]*\)$/\1/p" "$out" | head -1)
  if [[ -z $pid ]]; then
    echo "FAIL $role pid not found in output"; failed=$((failed + 1)); return
  fi
  # A zombie counts as gone: it was killed, and reaping orphans is init's job.
  if [[ -r /proc/$pid/stat && $(sed 's/.*) \([A-Za-z]\).*/\1/' "/proc/$pid/stat") != Z ]]; then
    echo "FAIL $role pid $pid still running after the harness returned"
    kill -KILL "$pid" 2>/dev/null
    failed=$((failed + 1))
  else
    echo "ok   $role pid $pid is gone"
    passed=$((passed + 1))
  fi
}

common=(--port "$port" --grace 1)

expect pair_pass 0 'pair_pass: PASS' 10 -- "${common[@]}" --timeout 10 \
  --server "$(server slow)" --client "$(client)" \
  --expect-server 'served: hello' --expect-client '^connected$'
if grep -q '^\[pair_pass server\] served: hello$' "$out" && grep -q '^\[pair_pass client\] connected$' "$out"; then
  echo "ok   prefixed output"; passed=$((passed + 1))
else
  echo "FAIL prefixed output missing"; failed=$((failed + 1))
fi

expect pair_expect_mismatch 1 'client: output does not match /nothing-like-this/' 10 -- \
  "${common[@]}" --timeout 10 --server "$(server)" --client "$(client)" --expect-client 'nothing-like-this'

expect server_dies_early 1 'server exited \(exit 1\) before listening' 5 -- \
  "${common[@]}" --timeout 10 --server 'false' --client "$(client)"

# The bound only has to tell a stopped client from one that hangs for ever:
# the gdb stacks printed before the kill take seconds on a loaded machine.
expect client_times_out 1 'client: timed out' 30 -- \
  "${common[@]}" --timeout 2 --server "$(server)" --client "$(client hang)"
gone server
gone client
if command -v gdb >/dev/null; then
  if grep -Eq '^\[client_times_out client bt\] (Thread|#0)' "$out"; then
    echo "ok   stacks of the hung client printed"; passed=$((passed + 1))
  else
    echo "FAIL no [client_times_out client bt] lines (gdb is installed)"; failed=$((failed + 1))
  fi
fi

expect stubborn_server_killed 1 'server: killed with SIGKILL' 10 -- \
  "${common[@]}" --timeout 20 --server "$(server stubborn)" --client 'false'
gone server

expect loader_error_detected 1 'loader/ABI/sanitizer error: prog: symbol lookup error' 10 -- \
  "${common[@]}" --timeout 10 --server "$(server)" --client "$(client loaderr)"

expect missing_program 1 'program not found: no-such-program-softhca' 5 -- \
  "${common[@]}" --timeout 5 --server 'no-such-program-softhca' --client "$(client)"

# A listener that is not ours: the harness must refuse to use the port.
"$python" -c "import socket,time
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', $port)); s.listen(1); time.sleep(60)" &
own_pids+=($!)
for ((i = 0; i < 100; i++)); do
  [[ -n $(ss -ltnH "sport = :$port") ]] && break
  sleep 0.05
done
expect port_in_use 1 "TCP port $port is already in use" 10 -- \
  "${common[@]}" --timeout 5 --server "$(server)" --client "$(client)"
kill "${own_pids[-1]}" 2>/dev/null
wait "${own_pids[-1]}" 2>/dev/null

expect single_pass 0 'single_pass: PASS' 5 -- --timeout 5 --run 'echo softhca0: PORT_ACTIVE' \
  --expect softhca0 --expect 'PORT_(ACTIVE|DOWN)'
expect single_mismatch 1 'run: output does not match /RoCE v2/' 5 -- --timeout 5 --run 'echo RoCE v1' --expect 'RoCE v2'
expect single_rc 1 'run: exit 3' 5 -- --timeout 5 --run 'bash -c "exit 3"'
expect single_timeout 1 'run: timed out' 5 -- --timeout 1 --no-backtrace --run 'sleep 30'
expect single_reject 1 'rejected /invalid data/' 5 -- --timeout 5 --run 'echo invalid data in page 3' --reject 'invalid data'
expect no_version_info 1 'loader/ABI/sanitizer error' 5 -- --timeout 5 \
  --run 'echo "prog: ./lib/libibverbs.so.1: no version information available (required by prog)"'
expect run_for_pass 0 'run_for_pass: PASS' 5 -- --timeout 5 --run 'bash -c "echo banner; exec sleep 30"' \
  --run-for 1 --expect banner
expect run_for_early_exit 1 'exited by itself' 5 -- --timeout 5 --run 'true' --run-for 2
expect bad_libdir 1 'does not exist' 5 -- --timeout 5 --libdir /nonexistent/softhca --run 'true'

# SIGTERM to the harness (as ctest does on timeout): it must clean up and report.
bash "$harness" --name interrupted "${common[@]}" --timeout 30 --server "$(server)" --client "$(client hang)" >"$out" 2>&1 &
hpid=$!
for ((i = 0; i < 100; i++)); do grep -q '^\[interrupted' "$out" 2>/dev/null && break; grep -q 'client:' "$out" && break; sleep 0.05; done
sleep 0.5
kill -TERM "$hpid"
wait "$hpid"
rc=$?
if [[ $rc == 1 ]] && grep -q 'interrupted by a signal' "$out"; then
  echo "ok   interrupted (rc $rc)"; passed=$((passed + 1))
else
  echo "FAIL interrupted: rc $rc"; sed 's/^/     | /' "$out"; failed=$((failed + 1))
fi
gone server
gone client

echo "$passed passed, $failed failed"
((failed == 0))
