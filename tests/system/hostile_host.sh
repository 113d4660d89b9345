#!/usr/bin/env bash
# hostile_host.sh: a hostile third host on the Ethernet of an RC connection,
# in the manner of the ReDMArk paper (Rothenberger et al., USENIX Security
# 2021): it knows the server's QPN, the PSN its QP expects, an rkey and an
# address, and forges RoCEv2 packets with correct ICRCs (scapy).
#
#   hostile_host.sh --libdir DIR --peer HOSTILE_PEER --tool SOFTHCA [--name NAME] [--timeout SECS]
#
# Hosts S (server, 198.18.1.1/24, and 198.18.1.4 as a second address), C
# (client, 198.18.1.2/24) and A (attacker, 198.18.1.3/24, no softhca) are
# network namespaces joined by a bridge in a fourth one; S and C each run
# in a mount namespace of their own with a private /dev/shm and their own
# runtime directory (SOFTHCA_RUNTIME_DIR). hostile_peer (tests/system/
# hostile_peer.cpp) connects two RC QP pairs by hand between S and C and
# writes what the attacker needs to a file; hostile_probe.py then attacks
# from A (its header lists the packets: a positive control on a separate
# QP pair, a WRITE and a READ from A's own address, a WRITE as the client
# with a foreign P_Key, one as the client to S's other address, WRITEs past
# the expected PSN marked for selective recovery, garbage); then the peers
# get their go-signal and the client WRITEs 64 bytes and READs the whole
# 4 KiB MR back.
#
# Judged: both peers exit 0 (every completion IBV_WC_SUCCESS, the READ and
# the server's own buffer show the pattern and the client's 64 bytes alone,
# and both control writes landed: the forged packets are well-formed, so the
# others were dropped for their source, destination or P_Key); nothing came
# back to A (no READ response, no ACK or NAK: drops are silent), counted by
# A's kernel (its UDP datagrams in, /proc/net/snmp) from before the first
# forged packet until the peers have exited, and listed by the probe's
# sniffer;
# `softhca stat --port` on S shows src_addr_drops >= the well-formed packets
# from A's own address plus the one to S's other address, pkey_drops >= 1,
# and out_of_seq_request = sent_seq_nak = 0 (no packet of A's, many of
# them past the expected PSN, reached the responder's sequence checks: its
# out-of-order keeping never started; the client's own two requests are in
# order on a lossless bridge).
# KEEP_WORK=1 keeps the outputs (their directory is printed). Exits 77
# (skipped) where network namespaces cannot be made or no python3 has
# scapy. Only the processes and namespaces it made are removed.
set -u -o pipefail

name=hostile_host libdir="" peer="" tool="" timeout=30
while (($#)); do
  case $1 in
    --name) name=$2; shift ;;
    --libdir) libdir=$2; shift ;;
    --peer) peer=$2; shift ;;
    --tool) tool=$2; shift ;;
    --timeout) timeout=$2; shift ;;
    -h|--help) sed -n '2,/^set -u/{/^set -u/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "hostile_host.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[[ -n $libdir && -n $peer && -n $tool ]] || { echo "hostile_host.sh: --libdir, --peer and --tool are needed (see --help)" >&2; exit 2; }
probe=$(dirname "$0")/hostile_probe.py

# scapy may be installed for the system's python only.
python=""
for py in python3 /usr/bin/python3; do
  if "$py" -c 'import scapy.contrib.roce' 2>/dev/null; then python=$py; break; fi
done
[[ -n $python ]] || { echo "[$name] SKIP: no python3 with scapy (python3-scapy)"; exit 77; }

hosts=(s c a)
declare -A ns veth ip
for h in "${hosts[@]}"; do
  ns[$h]="softhca-$$-$h"
  veth[$h]="sh$h$$"
done
ns_br="softhca-$$-br"
ip[s]=198.18.1.1 ip[c]=198.18.1.2 ip[a]=198.18.1.3
s_alt=198.18.1.4
work=$(mktemp -d "${TMPDIR:-/tmp}/softhca-hostile.XXXXXX") || exit 1
pids=()

cleanup() {
  for pid in "${pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null; done
  for n in "${ns[@]}" "$ns_br"; do ip netns del "$n" 2>/dev/null; done
  if [[ -n ${KEEP_WORK:-} ]]; then echo "[$name] kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
# shellcheck source=bridged_hosts.sh
source "$(dirname "${BASH_SOURCE[0]}")/bridged_hosts.sh"

bridge_hosts || exit $?
for h in "${hosts[@]}"; do
  ip -n "${ns[$h]}" addr add "${ip[$h]}/24" dev "${veth[$h]}" || exit 1
done
ip -n "${ns[s]}" addr add "$s_alt/24" dev "${veth[s]}" || exit 1

# run_on HOST LOG CMD: CMD on HOST, in a mount namespace of its own with an
# empty /dev/shm and the host's own runtime directory, in a process group of
# its own (setsid), bounded by timeout, line-buffered.
run_on() {
  mkdir -m 700 "$work/runtime-$1" 2>/dev/null
  exec setsid ip netns exec "${ns[$1]}" unshare -m --propagation private \
    sh -c "mount -t tmpfs -o mode=1777 tmpfs /dev/shm && exec env LD_LIBRARY_PATH=$libdir SOFTHCA_RUNTIME_DIR=$work/runtime-$1 timeout $timeout stdbuf -oL -eL $3" \
    >"$2" 2>&1
}

status=PASS
fail() { echo "[$name] $*"; status=FAIL; }
started=$SECONDS

# The driver talks to the programs through FIFOs it holds open read-write
# (so that opening them never blocks and a reader sees no end of file while
# the driver lives): the server's connection details, each peer's go-signal,
# the probe's "sent" and its stop.
mkfifo "$work/info" "$work/go-s" "$work/go-c" "$work/probe-ready" "$work/probe-stop" || exit 1
exec {info_fd}<>"$work/info" {go_s_fd}<>"$work/go-s" {go_c_fd}<>"$work/go-c" \
  {ready_fd}<>"$work/probe-ready" {stop_fd}<>"$work/probe-stop" || exit 1

# UDP datagrams host A's kernel took in, whatever their port: the judge of
# "nothing came back to the attacker", counted as they arrive.
udp_in_a() { ip netns exec "${ns[a]}" awk '$1 == "Udp:" && $2 ~ /^[0-9]+$/ { print $2 + $3 + $4 }' /proc/net/snmp; }

common="--timeout $((timeout - 5))"
run_on s "$work/server" "$peer --server --local ${ip[s]} --info $work/info --go $work/go-s $common" &
pids+=($!)
server_pid=$!
run_on c "$work/client" "$peer --client ${ip[s]} --local ${ip[c]} --go $work/go-c $common" &
pids+=($!)
client_pid=$!

# The server writes its line once both ends' QPs are in RTS.
probe_rc=- probe_pid="" udp_before="" udp_after=""
if read -r -t 20 -u "$info_fd" line; then
  declare -A info
  read -ra fields <<<"$line"
  for kv in "${fields[@]}"; do info[${kv%%=*}]=${kv#*=}; done
  echo "[$name] the server's QP: $line"
  udp_before=$(udp_in_a)
  setsid ip netns exec "${ns[a]}" timeout $((timeout - 5)) "$python" "$probe" --iface "${veth[a]}" --own "${ip[a]}" \
    --server "${ip[s]}" --server-alt "$s_alt" --client "${ip[c]}" \
    --qpn "${info[qpn]}" --psn "${info[psn]}" --rkey "${info[rkey]}" --addr "${info[addr]}" \
    --ctl-qpn "${info[ctl_qpn]}" --ctl-psn "${info[ctl_psn]}" --ctl-rkey "${info[ctl_rkey]}" \
    --ctl-addr "${info[ctl_addr]}" --ready "$work/probe-ready" <"$work/probe-stop" >"$work/probe" 2>&1 &
  probe_pid=$!
  pids+=("$probe_pid")
  read -r -t 30 -u "$ready_fd" _ || fail "the probe did not finish sending within 30 s"
else
  fail "the peers did not connect within 20 s"
fi
# Whatever the probe did, the peers check their memory and end.
echo go >&"$go_s_fd"
echo go >&"$go_c_fd"
wait "$server_pid"
server_rc=$?
wait "$client_pid"
client_rc=$?
# The peers are done: the server handled the probe's packets (and sent
# whatever it answered) before the client's WRITE and READ could complete.
if [[ -n $probe_pid ]]; then
  udp_after=$(udp_in_a)
  echo stop >&"$stop_fd"
  wait "$probe_pid"
  probe_rc=$?
fi

for f in server client probe; do [[ -f $work/$f ]] && sed "s/^/[$name $f] /" "$work/$f"; done
[[ $server_rc == 0 ]] || fail "the server exited $server_rc"
[[ $client_rc == 0 ]] || fail "the client exited $client_rc"
case $probe_rc in
  0) ;;
  1) fail "packets came back to the attacker (see its lines above)" ;;
  *) fail "the probe did not run through (exit $probe_rc)" ;;
esac
if [[ -n $udp_before && -n $udp_after ]]; then
  (( udp_after == udp_before )) ||
    fail "host A's kernel took in $((udp_after - udp_before)) UDP datagrams during the attack (/proc/net/snmp): answers to the attacker"
fi

# The server's host's port counters (its runtime directory, its namespace:
# one host to softhca).
ip netns exec "${ns[s]}" env SOFTHCA_RUNTIME_DIR="$work/runtime-s" timeout 10 "$tool" stat --port -a >"$work/stat" 2>&1 ||
  fail "softhca stat --port failed on host S"
sed "s/^/[$name stat S] /" "$work/stat"
counter() { awk -v n="$1" '$1 == n { print $2; exit }' "$work/stat"; }
summary() { sed -n 's/^hostile_probe: summary //p' "$work/probe" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$1=//p"; }
from_a=$(summary from_own_address) wrong_dst=$(summary wrong_destination) pkey_sent=$(summary foreign_pkey)
if [[ -n $from_a ]]; then
  src_drops=$(counter src_addr_drops) pkey_drops=$(counter pkey_drops)
  want=$((from_a + wrong_dst))
  [[ -n $src_drops ]] || fail "softhca stat shows no src_addr_drops counter"
  [[ -n $pkey_drops ]] || fail "softhca stat shows no pkey_drops counter"
  ((${src_drops:-0} >= want)) ||
    fail "src_addr_drops is ${src_drops:-absent}, not >= $want ($from_a well-formed packets from A's own address, $wrong_dst to S's other address)"
  ((${pkey_drops:-0} >= pkey_sent)) || fail "pkey_drops is ${pkey_drops:-absent}, not >= $pkey_sent"
  for zero in out_of_seq_request sent_seq_nak; do
    [[ $(counter $zero) == 0 ]] || fail "$zero is $(counter $zero) on host S: packets past the expected PSN reached the responder"
  done
  echo "[$name] host S counted src_addr_drops ${src_drops:-absent} (>= $want wanted), pkey_drops ${pkey_drops:-absent} (>= $pkey_sent wanted)"
fi
echo "[$name] $status in $((SECONDS - started)) s (server exit $server_rc, client exit $client_rc, probe exit $probe_rc)"
[[ $status == PASS ]]
