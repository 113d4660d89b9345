#!/usr/bin/env bash
# two_hosts.sh: a server and a client of an unmodified RDMA program on two
# hosts made as different as two machines: each its own network namespace
# (joined by a veth pair, 198.18.0.1 and 198.18.0.2/30 and 2001:2::1 and
# 2001:2::2/64 from the benchmarking ranges, MTU 1500) and its
# own mount namespace with a private /dev/shm, so softhca's only way from
# one to the other is the udp link.
#
#   two_hosts.sh --name NAME --libdir DIR --port PORT --timeout SECS \
#                --server 'CMD ARGS' --client 'CMD ARGS' [--expect RE]... [--env VAR=VALUE]...
#                [--ready-log RE [--ready-count N]] [--server-persists] [--reject RE]...
#                [--cut-after-packets N | --kill-after-packets N | --cut-when-client-says RE]
#                [--client-fails-within SECS] [--static-neighbours] [--wire-icrc-check]
#                [--max-resent PERCENT --softhca TOOL] [--busy N] [--loss PERCENT]
#
# --cut-after-packets N takes the server's host off the network (its veth
# goes down and its processes are killed) once its veth has received N
# packets (traffic is flowing; the programs' own output is block-buffered
# into a file and shows nothing until they exit): then the run passes when
# the client exits non-zero within --client-fails-within seconds of the cut
# (its QPs ended in error instead of hanging) and its output matches every
# --expect. --kill-after-packets N is the same with the veth left up: only
# the server's processes die (SIGKILL), so the host still answers, but no
# QP is left there to acknowledge. --cut-when-client-says RE cuts as
# --cut-after-packets does, once the client's output matches RE instead (a
# client that reports a state, line-buffered, and then waits for the cut).
# --static-neighbours gives each host a permanent neighbour entry (ARP,
# neighbour discovery) for the other's addresses, as on a network with
# static ARP: no packet is needed before the first one softhca sends, so a
# cut after packet 1 falls after address resolution.
# --wire-icrc-check judges the wire with tools that share no code with
# softhca: tcpdump captures the server's veth (both directions) and
# wire_icrc_check.py checks every RoCEv2 IPv4 packet's ICRC with scapy
# against the real IPv4 header, ID included; it fails the run on any wrong
# ICRC, and when no packet had a nonzero IP ID (no GSO send was segmented).
# Both veths then segment GSO sends in software before the capture point
# (tx-udp-segmentation off), as a NIC without UDP segmentation offload
# does, so that the capture holds the very segments a wire would carry
# rather than the unsegmented sends a veth passes on. Skipped (77) without
# tcpdump, ethtool or scapy.
#
# --max-resent PERCENT judges what the transfer cost on the wire: each
# host keeps softhca's files in a runtime directory of its own, and once
# the programs are done `softhca stat --port` (TOOL) reads both hosts'
# counters; the run fails when the packets requesters sent again
# (retransmitted_pkts) or the responses that answered nothing
# (stale_responses: a READ answered again, a repeated ACK) exceed PERCENT
# of all packets sent. --busy N runs N busy loops beside the hosts for the
# run, for a machine short of cores. --loss PERCENT drops that share of the
# RoCEv2 datagrams (UDP port 4791) each host receives, at random, in the
# host's own nftables: loss that softhca does not inject and cannot see
# coming (skipped, 77, without nft or ethtool). The veths then segment GSO
# sends before they pass them on, so that each datagram is dropped on its
# own, as on a wire, not a run of up to 64 with the send that carried them.
#
# In the commands, @SERVER@ and @CLIENT@ stand for the hosts' IPv4
# addresses, @SERVER6@ and @CLIENT6@ for their IPv6 ones, @LL_GID@ for the
# GID index of the host's own IPv6 link-local address (fe80::); @NOBODY@ and
# @NOBODY6@ for addresses no host owns but the client's host reaches
# on-link (198.18.0.5 by a host route on its veth, as the /30 has no free
# host address; 2001:2::3 in the /64), so that only the neighbour table
# (ARP, neighbour discovery nobody answers) stands in the way.
# The client starts once the server listens on TCP PORT in its namespace
# (the out-of-band exchange of perftest and the pingpongs), or, with
# --ready-log, once the server's output matches RE (an rdma_cm server
# listens on no TCP port: run it with SOFTHCA_LOG=info and wait for
# softhca's "cm: listening on" line); with --ready-count N, once N lines
# of it match (a server command that starts N listening processes). The
# wait is bounded (20 s) and ends early if the server exits.
# --server-persists: the server never exits by itself (cmtime); it is
# stopped once the client has exited, and
# only the client's status counts. --reject RE fails the run when either
# program's output matches RE (rdma_cm programs report some failures and
# still exit 0). Each program is
# bounded by --timeout; the run passes when both exit 0 and every --expect
# regex matches the client's output (perftest's latency servers print none). Exits 77 (skipped) where network namespaces
# cannot be made (no CAP_SYS_ADMIN). Only the processes and namespaces it
# made are removed.
set -u -o pipefail

name="" libdir="" port="" timeout=60 server="" client="" cut_packets="" cut_link=1 cut_log="" fail_within=""
expects=() rejects=() envs=() ready_log="" ready_count=1 server_persists=0 static_neighbours=0 wire_check=0
max_resent="" softhca_tool="" busy=0 loss=""
while (($#)); do
  case $1 in
    --name) name=$2; shift ;;
    --libdir) libdir=$2; shift ;;
    --port) port=$2; shift ;;
    --timeout) timeout=$2; shift ;;
    --server) server=$2; shift ;;
    --client) client=$2; shift ;;
    --expect) expects+=("$2"); shift ;;
    --reject) rejects+=("$2"); shift ;;
    --env) envs+=("$2"); shift ;;
    --ready-log) ready_log=$2; shift ;;
    --ready-count) ready_count=$2; shift ;;
    --server-persists) server_persists=1 ;;
    --cut-after-packets) cut_packets=$2 cut_link=1; shift ;;
    --kill-after-packets) cut_packets=$2 cut_link=0; shift ;;
    --cut-when-client-says) cut_log=$2 cut_link=1; shift ;;
    --client-fails-within) fail_within=$2; shift ;;
    --static-neighbours) static_neighbours=1 ;;
    --wire-icrc-check) wire_check=1 ;;
    --max-resent) max_resent=$2; shift ;;
    --softhca) softhca_tool=$2; shift ;;
    --busy) busy=$2; shift ;;
    --loss) loss=$2; shift ;;
    -h|--help) sed -n '2,/^set -u/{/^set -u/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "two_hosts.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[[ -n $name && -n $libdir && -n $port && -n $server && -n $client ]] || { echo "two_hosts.sh: missing arguments (see --help)" >&2; exit 2; }
[[ $ready_count =~ ^[1-9][0-9]*$ ]] || { echo "two_hosts.sh: --ready-count takes a whole number >= 1" >&2; exit 2; }
[[ -z $max_resent || ( $max_resent =~ ^[0-9]+(\.[0-9]+)?$ && -x $softhca_tool ) ]] ||
  { echo "two_hosts.sh: --max-resent takes a percentage and needs --softhca TOOL" >&2; exit 2; }
[[ $busy =~ ^[0-9]+$ ]] || { echo "two_hosts.sh: --busy takes a whole number" >&2; exit 2; }
[[ -z $loss || $loss =~ ^[1-9][0-9]?$ ]] || { echo "two_hosts.sh: --loss takes a percentage, 1 to 99" >&2; exit 2; }
if [[ -n $loss ]]; then
  for tool in nft ethtool; do
    command -v "$tool" >/dev/null || { echo "[$name] SKIP: $tool is not installed"; exit 77; }
  done
fi

if ((wire_check)); then
  for tool in tcpdump ethtool; do
    command -v "$tool" >/dev/null || { echo "[$name] SKIP: $tool is not installed"; exit 77; }
  done
  # scapy may be installed for the system's python only.
  scapy_python=""
  for py in python3 /usr/bin/python3; do
    if "$py" -c 'import scapy.contrib.roce' 2>/dev/null; then scapy_python=$py; break; fi
  done
  [[ -n $scapy_python ]] || { echo "[$name] SKIP: no python3 with scapy (python3-scapy)"; exit 77; }
fi

a_ip=198.18.0.1 b_ip=198.18.0.2 a_ip6=2001:2::1 b_ip6=2001:2::2 nobody_ip=198.18.0.5 nobody_ip6=2001:2::3
ns_a="softhca-$$-a" ns_b="softhca-$$-b"
veth_a="sha$$" veth_b="shb$$"
work=$(mktemp -d "${TMPDIR:-/tmp}/softhca-two-hosts.XXXXXX") || exit 1
pids=()

cleanup() {
  for pid in "${pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null; done
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
ip -n "$ns_a" addr add "$a_ip6/64" dev "$veth_a" nodad && ip -n "$ns_b" addr add "$b_ip6/64" dev "$veth_b" nodad || exit 1
for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up || exit 1; done
# No duplicate address detection: each veth's IPv6 link-local address
# (fe80::, made when it comes up) is usable at once, as its global one is.
ip netns exec "$ns_a" sysctl -qw "net.ipv6.conf.$veth_a.accept_dad=0" &&
  ip netns exec "$ns_b" sysctl -qw "net.ipv6.conf.$veth_b.accept_dad=0" || exit 1
ip -n "$ns_a" link set "$veth_a" up && ip -n "$ns_b" link set "$veth_b" up || exit 1
ip -n "$ns_b" route add "$nobody_ip/32" dev "$veth_b" || exit 1
if ((static_neighbours)); then
  mac_a=$(ip netns exec "$ns_a" cat "/sys/class/net/$veth_a/address") || exit 1
  mac_b=$(ip netns exec "$ns_b" cat "/sys/class/net/$veth_b/address") || exit 1
  for ip in "$a_ip" "$a_ip6"; do ip -n "$ns_b" neigh replace "$ip" lladdr "$mac_a" dev "$veth_b" nud permanent || exit 1; done
  for ip in "$b_ip" "$b_ip6"; do ip -n "$ns_a" neigh replace "$ip" lladdr "$mac_b" dev "$veth_a" nud permanent || exit 1; done
fi

if [[ -n $loss ]]; then
  ip netns exec "$ns_a" ethtool -K "$veth_a" tx-udp-segmentation off >/dev/null &&
    ip netns exec "$ns_b" ethtool -K "$veth_b" tx-udp-segmentation off >/dev/null || exit 1
  for ns in "$ns_a" "$ns_b"; do
    ip netns exec "$ns" nft -f - <<EOF || exit 1
table inet softhca_loss {
  chain input {
    type filter hook input priority 0; policy accept;
    udp dport 4791 numgen random mod 100 < $loss counter drop
  }
}
EOF
  done
fi

capture_pid=""
if ((wire_check)); then
  ip netns exec "$ns_a" ethtool -K "$veth_a" tx-udp-segmentation off >/dev/null &&
    ip netns exec "$ns_b" ethtool -K "$veth_b" tx-udp-segmentation off >/dev/null || exit 1
  setsid ip netns exec "$ns_a" tcpdump -i "$veth_a" -n -U -w "$work/wire.pcap" udp port 4791 \
    >/dev/null 2>"$work/tcpdump.err" &
  capture_pid=$!
  pids+=("$capture_pid")
  for ((i = 0; i < 200; i++)); do
    grep -q "listening on" "$work/tcpdump.err" 2>/dev/null && break
    kill -0 "$capture_pid" 2>/dev/null || { cat "$work/tcpdump.err"; exit 1; }
    sleep 0.05
  done
fi

# The GID index of host NS's IPv6 link-local address (fe80::/10), as
# ibv_devinfo on softhca lists its GID table (in a private /dev/shm).
link_local_gid() {
  ip netns exec "$1" unshare -m --propagation private sh -c \
    "mount -t tmpfs -o mode=1777 tmpfs /dev/shm && exec env LD_LIBRARY_PATH=$libdir timeout 10 ibv_devinfo -v" 2>/dev/null |
    awk '/GID\[ *[0-9]+\]:[[:space:]]*fe80:/ { sub(/.*GID\[ */, ""); sub(/\].*/, ""); print; exit }'
}

# expand CMD NS: CMD with the placeholders filled in, @LL_GID@ for host NS.
expand() {
  local s=${1//@SERVER6@/$a_ip6}
  if [[ $s == *@LL_GID@* ]]; then
    local ll
    ll=$(link_local_gid "$2")
    [[ -n $ll ]] || { echo "[$name] no link-local GID on $2" >&2; ll=none; }
    s=${s//@LL_GID@/$ll}
  fi
  s=${s//@NOBODY6@/$nobody_ip6}
  s=${s//@NOBODY@/$nobody_ip}
  s=${s//@CLIENT6@/$b_ip6}
  s=${s//@SERVER@/$a_ip}
  echo "${s//@CLIENT@/$b_ip}"
}

# runtime_dir NS: where host NS keeps softhca's files with --max-resent.
runtime_dir() { echo "$work/runtime-${1##*-}"; }
if [[ -n $max_resent ]]; then
  mkdir -m 700 "$(runtime_dir "$ns_a")" "$(runtime_dir "$ns_b")" || exit 1
fi
for ((i = 0; i < busy; i++)); do
  setsid sh -c 'while :; do :; done' &
  pids+=($!)
done

# run_on NS LOG CMD: CMD on host NS, in a mount namespace of its own with an
# empty /dev/shm, in a process group of its own (setsid), bounded by timeout.
run_on() {
  local ns=$1 log=$2 cmd=$3 env_args=""
  for e in "${envs[@]}"; do env_args+=" $(printf '%q' "$e")"; done
  [[ -n $max_resent ]] && env_args+=" SOFTHCA_RUNTIME_DIR=$(printf '%q' "$(runtime_dir "$ns")")"
  # exec: the background job's own pid becomes the session and group leader,
  # so that `kill -- -PID` reaches everything it started.
  exec setsid ip netns exec "$ns" unshare -m --propagation private \
    sh -c "mount -t tmpfs -o mode=1777 tmpfs /dev/shm && exec env LD_LIBRARY_PATH=$libdir$env_args timeout $timeout $cmd" \
    >"$log" 2>&1
}

run_on "$ns_a" "$work/server" "$(expand "$server" "$ns_a")" &
pids+=($!)
server_pid=$!
ready=0
for ((i = 0; i < 400; i++)); do
  if [[ -n $ready_log ]]; then
    matched=$(grep -Ec -- "$ready_log" "$work/server" 2>/dev/null)
    if ((${matched:-0} >= ready_count)); then ready=1; break; fi
  elif ip netns exec "$ns_a" ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; then
    ready=1
    break
  fi
  kill -0 "$server_pid" 2>/dev/null || break
  sleep 0.05
done
status=PASS
cut=0
[[ -n $cut_packets || -n $cut_log ]] && cut=1
if ((ready && cut)); then
  run_on "$ns_b" "$work/client" "$(expand "$client" "$ns_b")" &
  client_pid=$!
  pids+=($client_pid)
  # Cut once traffic flows (bounded; a client that dies first is judged
  # below like any other).
  for ((i = 0; i < 20 * timeout; i++)); do
    if [[ -n $cut_log ]]; then
      grep -Eq -- "$cut_log" "$work/client" 2>/dev/null && break
    else
      received=$(ip netns exec "$ns_a" cat "/sys/class/net/$veth_a/statistics/rx_packets" 2>/dev/null || echo 0)
      ((received >= cut_packets)) && break
    fi
    kill -0 "$client_pid" 2>/dev/null || break
    sleep 0.05
  done
  if ((cut_link)); then
    ip -n "$ns_a" link set "$veth_a" down
    what="the server's host was cut off (veth down, processes killed)"
  else
    what="the server's processes were killed (veth still up)"
  fi
  # Only the server's process group: the one this script started (setsid).
  kill -KILL -- "-$server_pid" 2>/dev/null
  cut_ms=$(date +%s%3N)
  wait "$client_pid"
  client_rc=$?
  took_ms=$(($(date +%s%3N) - cut_ms))
  server_rc=killed
  echo "[$name] $what; the client exited $client_rc after $took_ms ms"
  status=PASS
  if [[ $client_rc == 0 || $client_rc == 124 || $took_ms -gt $((${fail_within:-30} * 1000)) ]]; then
    echo "[$name] the client should have failed within ${fail_within:-30}s of the cut"
    status=FAIL
  fi
elif ((ready)); then
  run_on "$ns_b" "$work/client" "$(expand "$client" "$ns_b")" &
  pids+=($!)
  wait $!
  client_rc=$?
  if ((server_persists)); then
    if kill -0 "$server_pid" 2>/dev/null; then
      kill -TERM -- "-$server_pid" 2>/dev/null
      wait "$server_pid"
      server_rc=0
    else
      wait "$server_pid"
      server_rc="$?(exited by itself)"
    fi
  else
    wait "$server_pid"
    server_rc=$?
  fi
else
  if [[ -n $ready_log ]]; then
    echo "[$name] the server's output did not have $ready_count line(s) matching /$ready_log/ within 20 s"
  else
    echo "[$name] the server did not listen on TCP $port within 20 s"
  fi
  status=FAIL client_rc=- server_rc=-
  touch "$work/client"
fi
sed "s/^/[$name server] /" "$work/server"
sed "s/^/[$name client] /" "$work/client"
if [[ -n $capture_pid ]]; then
  # SIGINT: tcpdump writes out what it holds and exits.
  kill -INT -- "-$capture_pid" 2>/dev/null
  wait "$capture_pid"
  if ! "$scapy_python" "$(dirname "${BASH_SOURCE[0]}")/wire_icrc_check.py" "$work/wire.pcap" --min-gso-segments 1 \
    >"$work/wire_check" 2>&1; then
    status=FAIL
  fi
  sed "s/^/[$name wire] /" "$work/wire_check"
fi
((cut)) || [[ $server_rc == 0 && $client_rc == 0 ]] || status=FAIL
if [[ -n $max_resent ]]; then
  # Both hosts' port counters, which count the processes that have ended.
  for ns in "$ns_a" "$ns_b"; do
    ip netns exec "$ns" env SOFTHCA_RUNTIME_DIR="$(runtime_dir "$ns")" "$softhca_tool" stat -a --port
  done >"$work/stat" 2>&1
  if ! verdict=$(awk -v limit="$max_resent" '
      NF == 2 && $2 ~ /^[0-9]+$/ { sum[$1] += $2 }
      END {
        sent = sum["sent_pkts"]; resent = sum["retransmitted_pkts"]; stale = sum["stale_responses"]
        printf "sent %d packets, resent %d (%.3f%%), stale responses %d (%.3f%%), duplicate requests %d; limit %s%%",
          sent, resent, sent ? 100 * resent / sent : 0, stale, sent ? 100 * stale / sent : 0,
          sum["duplicate_request"], limit
        exit !(sent > 0 && 100 * resent <= limit * sent && 100 * stale <= limit * sent)
      }' "$work/stat"); then
    status=FAIL
  fi
  echo "[$name] on the wire: $verdict"
fi
for re in "${expects[@]}"; do
  grep -Eq -- "$re" "$work/client" || { echo "[$name] the client's output lacks /$re/"; status=FAIL; }
done
for re in "${rejects[@]}"; do
  if grep -Eq -- "$re" "$work/server" "$work/client"; then echo "[$name] an output matches /$re/"; status=FAIL; fi
done
if grep -Eq "symbol lookup error|no version information available|ERROR: (Address|Thread)Sanitizer" "$work/server" "$work/client"; then
  echo "[$name] a loader or sanitizer error"; status=FAIL
fi
if [[ -n $loss ]]; then
  for ns in "$ns_a" "$ns_b"; do
    echo "[$name] nftables dropped on ${ns##*-}: $(ip netns exec "$ns" nft list table inet softhca_loss 2>/dev/null |
      grep -o 'packets [0-9]*' | head -1)"
  done
fi
echo "[$name] $status (server exit $server_rc, client exit $client_rc)"
[[ $status == PASS ]]
