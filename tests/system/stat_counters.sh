#!/usr/bin/env bash
# stat_counters.sh BINDIR LIBDIR: `softhca stat` tells what the udp link did.
# In a private runtime directory (so only this test's processes count):
#   1. the RC data tests over the udp link, lossless: packets went both ways,
#      none was dropped, and the port's counts outlive the processes;
#   2. the same through the fault link (loss and corruption): the counters
#      show the retransmissions, the PSN gaps and the ICRC drops;
#   3. a live ibv_rc_pingpong server: its QP is listed with its owner's pid,
#      type and state, and --qp of a QPN nobody has fails;
#   4. a live ibv_xsrq_pingpong pair: the server's XRC TGT QP, which the host
#      owns, is listed with the pid of the process that holds it.
set -u -o pipefail
bindir=${1:?usage: stat_counters.sh BINDIR LIBDIR}
libdir=${2:?usage: stat_counters.sh BINDIR LIBDIR}
work=$(mktemp -d "${TMPDIR:-/tmp}/softhca-stat.XXXXXX") || exit 1
server_pid=""
cleanup() {
  [[ -n $server_pid ]] && kill -KILL "$server_pid" 2>/dev/null
  [[ -n ${xsrq_client_pid:-} ]] && kill -KILL "$xsrq_client_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
status=0
fail() { echo "FAIL: $*"; status=1; }

# counter NAME FILE: the value `softhca stat -a` printed for NAME (first match: the port).
counter() { awk -v n="$1" '$1 == n { print $2; exit }' "$2"; }

export SOFTHCA_RUNTIME_DIR=$work/lossless
mkdir -p "$SOFTHCA_RUNTIME_DIR"
SOFTHCA_LINK=udp timeout 120 "$bindir/loopback_data_test" --gtest_filter='Ops/RcData.*' >"$work/data.log" 2>&1 ||
  { tail -20 "$work/data.log"; fail "the data tests failed over the udp link"; }
"$bindir/softhca" stat --port -a >"$work/lossless.txt" || fail "softhca stat --port failed"
cat "$work/lossless.txt"
sent=$(counter sent_pkts "$work/lossless.txt")
rcvd=$(counter rcvd_pkts "$work/lossless.txt")
((${sent:-0} > 1000)) || fail "lossless: sent_pkts is '${sent:-}', expected the data tests' packets"
((${rcvd:-0} > 0 && rcvd <= sent)) || fail "lossless: rcvd_pkts '${rcvd:-}' against sent_pkts '$sent'"
((${rcvd:-0} * 100 >= sent * 99)) || fail "lossless: only $rcvd of $sent packets were received"
for zero in icrc_err_drops malformed_drops retry_exceeded_err; do
  [[ $(counter $zero "$work/lossless.txt") == 0 ]] || fail "lossless: $zero is not 0"
done
(($(counter rdma_sends "$work/lossless.txt") > 0)) || fail "lossless: no rdma_sends"
(($(counter rdma_recvs "$work/lossless.txt") > 0)) || fail "lossless: no rdma_recvs"

export SOFTHCA_RUNTIME_DIR=$work/faults
mkdir -p "$SOFTHCA_RUNTIME_DIR"
SOFTHCA_LINK=udp SOFTHCA_FAULT="loss=0.05,corrupt=0.01,seed=11" timeout 200 "$bindir/loopback_data_test" \
  --gtest_filter='Ops/RcData.*Write*:Ops/RcData.*Read*' >"$work/faults.log" 2>&1 ||
  { tail -20 "$work/faults.log"; fail "the data tests failed through the fault link"; }
"$bindir/softhca" stat --port >"$work/faults.txt" || fail "softhca stat --port failed"
cat "$work/faults.txt"
for positive in sent_pkts rcvd_pkts retransmitted_pkts out_of_seq_request sent_seq_nak rcvd_seq_err icrc_err_drops; do
  (($(counter $positive "$work/faults.txt") > 0)) || fail "faults: $positive is not counted"
done
(($(counter rcvd_seq_err "$work/faults.txt") <= $(counter sent_seq_nak "$work/faults.txt"))) ||
  fail "faults: more sequence NAKs received than sent"

export SOFTHCA_RUNTIME_DIR=$work/live
mkdir -p "$SOFTHCA_RUNTIME_DIR"
port=$((20000 + RANDOM % 20000))
LD_LIBRARY_PATH=$libdir stdbuf -oL ibv_rc_pingpong -g 1 -p "$port" >"$work/server.log" 2>&1 &
server_pid=$!
qpn=""
for _ in $(seq 100); do
  qpn=$(awk '/local address/ { for (i = 1; i <= NF; ++i) if ($i == "QPN") { sub(",", "", $(i + 1)); print $(i + 1) } }' \
    "$work/server.log")
  [[ -n $qpn ]] && break
  sleep 0.1
done
if [[ -z $qpn ]]; then
  cat "$work/server.log"
  fail "the pingpong server printed no QPN"
else
  "$bindir/softhca" stat --qp "$qpn" -a >"$work/live.txt" || fail "softhca stat --qp $qpn failed"
  cat "$work/live.txt"
  # ibv_rc_pingpong prints its QPN as softhca stat does (0x and six digits).
  grep -Eq "^qp $qpn  pid $server_pid  RC  INIT\$" "$work/live.txt" ||
    fail "the live QP $qpn of pid $server_pid is not listed as an RC QP in INIT"
  grep -q "^  sent_pkts " "$work/live.txt" || fail "-a did not list the zero counters"
fi
kill -KILL "$server_pid" 2>/dev/null
wait "$server_pid" 2>/dev/null
server_pid=""
xsrq_client_pid=""
port=$((20000 + RANDOM % 20000))
# A server that waits for a second client keeps its QPs alive after the first.
LD_LIBRARY_PATH=$libdir stdbuf -oL ibv_xsrq_pingpong -g 1 -p "$port" -c 2 >"$work/xserver.log" 2>&1 &
server_pid=$!
for _ in $(seq 100); do  # the client connects once: wait (bounded) until the server listens
  [[ -n $(ss -Hltn "sport = :$port" 2>/dev/null) ]] && break
  sleep 0.1
done
LD_LIBRARY_PATH=$libdir stdbuf -oL ibv_xsrq_pingpong -g 1 -p "$port" 127.0.0.1 >"$work/xclient.log" 2>&1 &
xsrq_client_pid=$!
tgt=""
for _ in $(seq 100); do
  tgt=$(awk '/ local:/ { for (i = 1; i <= NF; ++i) if ($i == "RECV") print $(i + 1) }' "$work/xserver.log")
  [[ -n $tgt ]] && break
  sleep 0.1
done
if [[ -z $tgt ]]; then
  cat "$work/xserver.log" "$work/xclient.log"
  fail "the xsrq pingpong server printed no TGT QPN"
else
  "$bindir/softhca" stat --qp "0x$tgt" >"$work/tgt.txt" || fail "softhca stat --qp 0x$tgt failed"
  cat "$work/tgt.txt"
  grep -Eq "^qp 0x$tgt  pids $server_pid  XRC_RECV  (RTR|RTS)\$" "$work/tgt.txt" ||
    fail "the TGT QP 0x$tgt held by pid $server_pid is not listed as an XRC_RECV QP in RTR"
fi
kill -KILL "$server_pid" "$xsrq_client_pid" 2>/dev/null
wait "$server_pid" "$xsrq_client_pid" 2>/dev/null
server_pid=""

if "$bindir/softhca" stat --qp 0xfffff0 >"$work/none.txt" 2>&1; then
  fail "--qp of a QPN nobody has succeeded"
fi
"$bindir/softhca" stat --qp nonsense >/dev/null 2>&1
[[ $? == 2 ]] || fail "--qp nonsense is not a usage error"

((status == 0)) && echo PASS || echo FAIL
exit "$status"
