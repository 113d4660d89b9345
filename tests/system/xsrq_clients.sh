#!/usr/bin/env bash
# ibv_xsrq_pingpong with one server and several clients, unmodified:
#
#   tests/system/xsrq_clients.sh LIBDIR PORT CLIENTS [ITERS]
#
# The server sends to each client round robin over every client's XRC
# connection: a message for client A's SRQ arrives through client B's TGT
# QP, in another process, which delivers it because both opened their XRC
# domain on the same file (/tmp/xrc_domain). So this is XRC across processes,
# which a single client never exercises. Every program runs under `timeout`;
# the script kills only the processes it started, by PID.
set -u -o pipefail
libdir=$(cd "${1:?usage: xsrq_clients.sh LIBDIR PORT CLIENTS [ITERS]}" && pwd)
port=${2:?port}
clients=${3:?clients}
iters=${4:-200}
export LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
work=$(mktemp -d "${TMPDIR:-/tmp}/softhca-xsrq.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT

timeout 60 ibv_xsrq_pingpong -d softhca0 -g 0 -p "$port" -c "$clients" -n "$iters" >"$work/server" 2>&1 &
server=$!
pids+=("$server")
# The server listens once its XRC objects exist; clients that connect earlier give up.
for ((i = 0; i < 200; i++)); do
  ss -ltnH "sport = :$port" 2>/dev/null | grep -q . && break
  kill -0 "$server" 2>/dev/null || break
  sleep 0.05
done
for ((c = 0; c < clients; c++)); do
  timeout 60 ibv_xsrq_pingpong -d softhca0 -g 0 -p "$port" -n "$iters" 127.0.0.1 >"$work/client$c" 2>&1 &
  pids+=("$!")
done
status=0
for ((i = 0; i < ${#pids[@]}; i++)); do
  wait "${pids[$i]}" || status=1
done
for f in "$work"/server "$work"/client*; do
  sed "s/^/[${f##*/}] /" "$f"
  grep -q '^success$' "$f" || status=1
done
if ((status == 0)); then
  echo "PASS: ibv_xsrq_pingpong, $clients clients x $iters messages each way"
else
  echo "FAIL: ibv_xsrq_pingpong with $clients clients" >&2
fi
exit "$status"
