#!/usr/bin/env bash
# mckey_hosts.sh: rdma-core's mckey between three hosts on one Ethernet
# segment: a sender on host A and a receiver on each of hosts B and C, all
# joined to one multicast group, so that every datagram must cross the wire
# as IP multicast and reach both other hosts.
#
#   mckey_hosts.sh --libdir DIR --group ADDR [--name NAME] [--timeout SECS] [--count N]
#
# Each host is its own network namespace and its own mount namespace (a
# private /dev/shm); a fourth namespace holds the bridge that joins their
# veths (multicast snooping off: every port gets every group, so delivery
# depends on the hosts' own membership, not on the bridge's). Addresses come
# from the benchmarking ranges: 198.18.1.1-3/24 and 2001:2:1::1-3/64; the
# group's family (239.x.y.z or ff0e::...) picks which one mckey binds.
#
# Judged: each receiver completes all N receives, the sender sends N; while
# the receivers run, the kernel lists the group on their veth (`ip maddr`:
# softhca joined it there, on that interface) and never on the sender's
# (a send-only member joins nothing); once they have exited it is gone.
# Where dumpcap and tshark are installed, a capture on host C's veth (taken
# by dumpcap, not by softhca) must hold N RoCEv2 UD SENDs to the group's IP
# address with BTH destination QP 0xFFFFFF, and nothing tshark finds malformed.
# KEEP_WORK=1 keeps the outputs and the capture (their directory is printed).
# Exits 77 (skipped) where network namespaces cannot be made. Only the
# processes and namespaces it made are removed.
set -u -o pipefail

name=mckey_hosts libdir="" group="" timeout=40 count=10
while (($#)); do
  case $1 in
    --name) name=$2; shift ;;
    --libdir) libdir=$2; shift ;;
    --group) group=$2; shift ;;
    --timeout) timeout=$2; shift ;;
    --count) count=$2; shift ;;
    -h|--help) sed -n '2,/^set -u/{/^set -u/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "mckey_hosts.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[[ -n $libdir && -n $group ]] || { echo "mckey_hosts.sh: --libdir and --group are needed (see --help)" >&2; exit 2; }

if [[ $group == *:* ]]; then v6=1; else v6=0; fi
hosts=(a b c)
declare -A ns veth ip
for h in "${hosts[@]}"; do
  ns[$h]="softhca-$$-$h"
  veth[$h]="sh$h$$"
done
ns_br="softhca-$$-br"
ip[a]=198.18.1.1 ip[b]=198.18.1.2 ip[c]=198.18.1.3
if ((v6)); then ip[a]=2001:2:1::1 ip[b]=2001:2:1::2 ip[c]=2001:2:1::3; fi
work=$(mktemp -d "${TMPDIR:-/tmp}/softhca-mckey-hosts.XXXXXX") || exit 1
pids=()

cleanup() {
  for pid in "${pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null; done
  for n in "${ns[@]}" "$ns_br"; do ip netns del "$n" 2>/dev/null; done
  if [[ -n ${KEEP_WORK:-} ]]; then echo "[$name] kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
# shellcheck source=bridged_hosts.sh
source "$(dirname "${BASH_SOURCE[0]}")/bridged_hosts.sh"

bridge_hosts mcast_snooping 0 || exit $?
for h in "${hosts[@]}"; do
  if ((v6)); then
    ip -n "${ns[$h]}" addr add "${ip[$h]}/64" dev "${veth[$h]}" nodad || exit 1
  else
    ip -n "${ns[$h]}" addr add "${ip[$h]}/24" dev "${veth[$h]}" || exit 1
    ip -n "${ns[$h]}" route add 224.0.0.0/4 dev "${veth[$h]}" || exit 1
  fi
done

# run_on HOST LOG CMD: CMD on HOST, in a mount namespace of its own with an
# empty /dev/shm, in a process group of its own (setsid), bounded by timeout,
# line-buffered (readiness is read from the output while it runs).
run_on() {
  exec setsid ip netns exec "${ns[$1]}" unshare -m --propagation private \
    sh -c "mount -t tmpfs -o mode=1777 tmpfs /dev/shm && exec env LD_LIBRARY_PATH=$libdir timeout $timeout stdbuf -oL -eL $3" \
    >"$2" 2>&1
}

# joined_on HOST: whether the kernel lists the group on HOST's veth.
joined_on() {
  ip -n "${ns[$1]}" maddr show dev "${veth[$1]}" | grep -qw -- "$group"
}

status=PASS
fail() { echo "[$name] $*"; status=FAIL; }

capture=0
if command -v dumpcap >/dev/null && command -v tshark >/dev/null; then
  # It stops by itself after N RoCEv2 packets: stopped from outside, it
  # would lose what its capture ring has not handed over yet.
  setsid ip netns exec "${ns[c]}" dumpcap -q -i "${veth[c]}" -f "udp port 4791" -c "$count" -w "$work/c.pcap" \
    >"$work/dumpcap" 2>&1 &
  pids+=($!)
  dumpcap_pid=$!
  # dumpcap writes the file's header once it captures.
  for ((i = 0; i < 200; i++)); do [[ -s $work/c.pcap ]] && { capture=1; break; }; sleep 0.05; done
  ((capture)) || echo "[$name] dumpcap did not start ($(cat "$work/dumpcap")); the wire is not judged"
fi

receiver_pids=()
for h in b c; do
  run_on "$h" "$work/$h" "mckey -m $group -b ${ip[$h]} -C $count" &
  pids+=($!)
  receiver_pids+=($!)
done
# mckey says "joined dgid" once its receives are posted and its QP attached.
ready=0
for ((i = 0; i < 400; i++)); do
  if grep -q "joined dgid" "$work/b" 2>/dev/null && grep -q "joined dgid" "$work/c" 2>/dev/null; then ready=1; break; fi
  sleep 0.05
done
if ((ready)); then
  for h in b c; do joined_on "$h" || fail "host $h's veth does not list $group while its receiver runs"; done
  run_on a "$work/a" "mckey -m $group -b ${ip[a]} -s -o -C $count" &
  pids+=($!)
  wait $!
  sender_rc=$?
  joined_on a && fail "the sender's host joined $group, which it only sends to"
else
  fail "the receivers did not both join within 20 s"
  sender_rc=-
fi
receiver_rc=()
for pid in "${receiver_pids[@]}"; do
  wait "$pid"
  receiver_rc+=($?)
done
for h in b c; do joined_on "$h" && fail "host $h's veth still lists $group after its receiver exited"; done

if ((capture)); then
  # It has N packets or never will: the receivers had them all or timed out.
  for ((i = 0; i < 100; i++)); do kill -0 "$dumpcap_pid" 2>/dev/null || break; sleep 0.05; done
  kill -INT -- "-$dumpcap_pid" 2>/dev/null
  wait "$dumpcap_pid"
  if ((v6)); then ip_field=ipv6.dst; else ip_field=ip.dst; fi
  ts() { tshark -r "$work/c.pcap" "$@" 2>/dev/null; }
  sends=$(ts -Y "$ip_field == $group && infiniband.bth.destqp == 0xffffff && (infiniband.bth.opcode == 0x64 || infiniband.bth.opcode == 0x65)" | wc -l)
  malformed=$(ts -Y "_ws.malformed || _ws.expert.severity >= error" | wc -l)
  echo "[$name] host c's veth saw $sends UD SENDs to $group (QP 0xFFFFFF), $malformed malformed packets"
  ((sends == count)) || fail "the capture on host c's veth holds $sends UD SENDs to the group, not $count"
  ((malformed == 0)) || fail "the capture holds malformed packets"
fi

for h in a b c; do [[ -f $work/$h ]] && sed "s/^/[$name $h] /" "$work/$h"; done
[[ $sender_rc == 0 ]] || fail "the sender exited $sender_rc"
for i in 0 1; do
  h=${hosts[$((i + 1))]}
  [[ ${receiver_rc[$i]} == 0 ]] || fail "the receiver on host $h exited ${receiver_rc[$i]}"
  grep -q "receiving data transfers" "$work/$h" || fail "the receiver on host $h did not receive"
  grep -q "data transfers complete" "$work/$h" || fail "the receiver on host $h did not complete its $count receives"
done
grep -q "initiating data transfers" "$work/a" 2>/dev/null || fail "the sender did not send"
if grep -Eq "failure|failed|unable|mckey: event:|ERROR: (Address|Thread)Sanitizer" "$work"/*; then
  fail "an output reports an error"
fi
echo "[$name] $status (sender exit $sender_rc, receivers exit ${receiver_rc[*]})"
[[ $status == PASS ]]
