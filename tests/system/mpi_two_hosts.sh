#!/usr/bin/env bash
# system.two_hosts.mpi.ping_allreduce.<tls>: Open MPI's ucx pml between two
# hosts (issue 13 item 3).
#
# usage: mpi_two_hosts.sh SOFTHCA_TOOL MPIRUN PROGRAM TLS
#
# Two hosts as two_hosts.sh makes them (network namespaces joined by a veth
# pair, 198.18.0.1 and 198.18.0.2/30; each its own mount namespace with an
# empty /dev/shm, each its own softhca runtime directory), and a UTS
# namespace each so their host names differ (hostA, hostB). mpirun runs on
# hostA inside `softhca run --devices` with `--host hostA,hostB -np 2`: rank
# 0 is its own child, rank 1 is started on hostB by the daemon that
# ns_rsh.sh (Open MPI's remote shell here, instead of ssh) starts there; the
# daemon connects back to mpirun over the veth. PROGRAM is
# tests/system/mpi/ping_allreduce.c, its output line asserted, and each
# host's rank must say (pml_ucx_verbose, prefixed with its host name) that
# its ucx layer found the transport on softhca0; the ucx pml
# is forced, the BTLs that could carry bytes (vader, tcp, openib) are
# excluded and UCX is limited to TLS on softhca0:1 (it picks GID 0, the
# veth's address, alone: tests/system/CMakeLists.txt says why). That the bytes
# crossed the udp link: each host's `softhca stat --port` counts, after
# the run, at least one packet sent and received per message of the
# ping-pong (both hosts' runtime directories are separate and /dev/shm is
# not shared, so there is no other way). Bounded (timeout 90 s); the
# processes of its session are killed, each by its id, at the end; only
# its namespaces are removed.
# Exits 77 where network namespaces cannot be made.
set -u -o pipefail

tool=${1:?usage: mpi_two_hosts.sh SOFTHCA_TOOL MPIRUN PROGRAM TLS}
mpirun=${2:?}
program=${3:?}
tls=${4:?}
name=two_hosts.mpi.ping_allreduce.$tls
case $tls in
  rc_v) transport=rc_verbs ;;
  ud_v) transport=ud_verbs ;;
  *) echo "mpi_two_hosts.sh: TLS must be rc_v or ud_v"; exit 2 ;;
esac
messages=160  # 8 sizes x 10 rounds x ping and pong
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

a_ip=198.18.0.1 b_ip=198.18.0.2
ns_a="softhca-$$-ma" ns_b="softhca-$$-mb"
veth_a="sma$$" veth_b="smb$$"
work=$(mktemp -d "${TMPDIR:-/tmp}/softhca-mpi-hosts.XXXXXX") || exit 1
chmod 755 "$work"
pid=""
# kill_session: every process still in the session that setsid started
# below, each by its id. A process group is not enough: mpirun puts its
# remote shell (and so hostB's daemon) and each rank in groups of their own,
# but none of them leaves the session.
kill_session() {
  local p
  [[ -n $pid ]] || return 0
  for p in $(ps -eo pid=,sid= | awk -v s="$pid" '$2 == s { print $1 }'); do kill -KILL "$p" 2>/dev/null; done
}
cleanup() {
  kill_session
  ip netns del "$ns_a" 2>/dev/null
  ip netns del "$ns_b" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

if ! ip netns add "$ns_a" 2>"$work/err"; then
  echo "[$name] SKIP: cannot create a network namespace: $(cat "$work/err")"
  exit 77
fi
ip netns add "$ns_b" || exit 1
ip link add "$veth_a" type veth peer name "$veth_b" || exit 1
ip link set "$veth_a" netns "$ns_a" && ip link set "$veth_b" netns "$ns_b" || exit 1
ip -n "$ns_a" addr add "$a_ip/30" dev "$veth_a" && ip -n "$ns_b" addr add "$b_ip/30" dev "$veth_b" || exit 1
for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up || exit 1; done
ip -n "$ns_a" link set "$veth_a" up && ip -n "$ns_b" link set "$veth_b" up || exit 1
mkdir -m 700 "$work/run-a" "$work/run-b" || exit 1

export SOFTHCA_TOOL=$tool SOFTHCA_NS_HOSTS="hostA=$ns_a:$work/run-a hostB=$ns_b:$work/run-b"
export UCX_TLS=$tls UCX_NET_DEVICES=softhca0:1
# Open MPI's own out-of-band and PMIx traffic: over the veth, where hostB's
# daemon can reach mpirun.
# shellcheck disable=SC2054  # hostA,hostB is one argument
mpi_args=(--allow-run-as-root -np 2 --host hostA,hostB --mca plm_rsh_agent "$here/ns_rsh.sh"
          --mca oob_tcp_if_include "$a_ip/30" --mca pml ucx --mca btl ^vader,tcp,openib
          --mca pml_ucx_verbose 2 -x UCX_TLS -x UCX_NET_DEVICES)
setsid ip netns exec "$ns_a" unshare -m -u --propagation private \
  sh -c 'mount -t tmpfs -o mode=1777 tmpfs /dev/shm && hostname hostA && d=$1 && shift &&
         exec env SOFTHCA_RUNTIME_DIR="$d" timeout -k 5 90 "$@"' \
  _ "$work/run-a" "$tool" run --devices -- "$mpirun" "${mpi_args[@]}" "$program" >"$work/out" 2>&1 &
pid=$!
wait "$pid"
rc=$?
kill_session  # nothing is left after a clean run; after a timeout, hostB's daemon may be
sed "s/^/[$name] /" "$work/out"
status=PASS
((rc == 0)) || { echo "[$name] mpirun exited $rc"; status=FAIL; }
for re in "^ping_allreduce: ranks 2, 8 sizes, $messages messages, [0-9]+ bytes checked, allreduce ok$" \
          "^\[hostA:[0-9]+\] .*$transport/softhca0:1: matched transport list" \
          "^\[hostB:[0-9]+\] .*$transport/softhca0:1: matched transport list"; do
  grep -Eq -- "$re" "$work/out" || { echo "[$name] the output lacks /$re/"; status=FAIL; }
done
if grep -Eq "UCX  ERROR|softhca run: warning|symbol lookup error" "$work/out"; then
  echo "[$name] an error line in the output"; status=FAIL
fi
# Each host's port counters, read in its own network namespace from its
# runtime directory.
for h in a b; do
  ns_var=ns_$h
  SOFTHCA_RUNTIME_DIR=$work/run-$h ip netns exec "${!ns_var}" "$tool" stat --port >"$work/stat-$h" 2>&1
  sed "s/^/[$name host $h stat] /" "$work/stat-$h"
  for c in sent_pkts rcvd_pkts; do
    n=$(awk -v c=$c '$1 == c { print $2 }' "$work/stat-$h")
    if ((${n:-0} < messages)); then
      echo "[$name] host $h: $c is ${n:-missing}, expected at least $messages (the udp link carried no ping-pong?)"
      status=FAIL
    fi
  done
done
echo "[$name] $status"
[[ $status == PASS ]]
