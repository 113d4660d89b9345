#!/usr/bin/env bash
# three_hosts_soak.sh: mixed traffic between three hosts for a long while,
# every byte and completion checked (issue #42, item 6). Run by hand (root,
# as the other namespace tests); 30 minutes by default, too long for CI.
#
#   three_hosts_soak.sh --build DIR [--minutes M] [--fault SPEC] [--name NAME]
#
# Hosts A, B and C (198.18.2.1-3/24) are network namespaces joined by a
# bridge in a fourth one, each in a mount namespace of its own with a
# private /dev/shm and its own runtime directory, so softhca's only way
# between them is the udp link. Around the ring A->B, B->C, C->A, two
# streams run at once for M minutes, each an integrity_peer client run
# after run against a server started afresh for each run:
#   - RC, every opcode and size, through SOFTHCA_FAULT (default
#     loss=0.01,reorder=0.01 on both ends' sends): checked byte by byte even
#     though packets are lost and reordered;
#   - RC, UC and UD, every opcode and size, lossless (UC and UD lose
#     messages under loss by design, and integrity_peer counts every one).
# Judged: every run of every stream ends "integrity: ... all correct",
# except that a UC or UD message that never arrived (those transports do
# not recover, and a loaded host's kernel drops datagrams) counts as
# "lost", not failed; the script prints the runs per stream, each host's
# kernel UDP counters and softhca port counters (resends, drops), and exits
# non-zero on any failed run (whose output it keeps). KEEP_WORK=1 keeps all
# outputs.
set -u -o pipefail

name=three_hosts_soak build="" minutes=30 fault="loss=0.01,reorder=0.01"
while (($#)); do
  case $1 in
    --build) build=$(cd "$2" && pwd) || exit 2; shift ;;
    --minutes) minutes=$2; shift ;;
    --fault) fault=$2; shift ;;
    --name) name=$2; shift ;;
    -h | --help) sed -n '2,/^set -u/{/^set -u/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "three_hosts_soak.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[[ -n $build ]] || { echo "three_hosts_soak.sh: --build DIR is needed (see --help)" >&2; exit 2; }
peer=$build/bin/integrity_peer tool=$build/bin/softhca libdir=$build/lib
[[ -x $peer && -x $tool ]] || { echo "three_hosts_soak.sh: no $peer or $tool" >&2; exit 2; }

hosts=(a b c)
declare -A ns veth ip next
for h in "${hosts[@]}"; do
  ns[$h]="softhca-$$-$h"
  veth[$h]="sk$h$$"
done
ns_br="softhca-$$-br"
ip[a]=198.18.2.1 ip[b]=198.18.2.2 ip[c]=198.18.2.3
next[a]=b next[b]=c next[c]=a
work=$(mktemp -d "${TMPDIR:-/tmp}/softhca-soak.XXXXXX") || exit 1
pids=()

cleanup() {
  for pid in "${pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null; done
  for n in "${ns[@]}" "$ns_br"; do ip netns del "$n" 2>/dev/null; done
  if [[ -n ${KEEP_WORK:-} || $status != PASS ]]; then echo "[$name] outputs kept in $work"; else rm -rf "$work"; fi
}
status=PASS
trap cleanup EXIT
# shellcheck source=bridged_hosts.sh
source "$(dirname "${BASH_SOURCE[0]}")/bridged_hosts.sh"

bridge_hosts || exit $?
for h in "${hosts[@]}"; do
  ip -n "${ns[$h]}" addr add "${ip[$h]}/24" dev "${veth[$h]}" || exit 1
  mkdir -m 700 "$work/runtime-$h" || exit 1
done

# (CMD's `timeout` runs with --foreground: by default it puts itself in a
# process group of its own, which the clean-up's group kill would miss.)
# loop_on HOST LOG DEADLINE CMD: CMD on HOST again and again until DEADLINE
# (seconds since the epoch), in a mount namespace of its own with an empty
# /dev/shm and the host's runtime directory; each run's verdict line goes
# to LOG ("ok" or the run's last lines).
loop_on() {
  local host=$1 log=$2 deadline=$3 cmd=$4
  exec setsid ip netns exec "${ns[$host]}" unshare -m --propagation private sh -c "
    mount -t tmpfs -o mode=1777 tmpfs /dev/shm || exit 1
    export LD_LIBRARY_PATH=$libdir SOFTHCA_RUNTIME_DIR=$work/runtime-$host
    i=0
    while [ \$(date +%s) -lt $deadline ]; do
      i=\$((i + 1))
      if $cmd >$log.run 2>&1; then
        grep -q 'all correct' $log.run && echo ok >>$log || { echo \"run \$i: no verdict\" >>$log; cp $log.run $log.fail.\$i; }
      else
        echo \"run \$i: exit \$?: \$(tail -3 $log.run | tr '\n' ' ')\" >>$log
        cp $log.run $log.fail.\$i
      fi
    done" >"$log.loop" 2>&1
}

deadline=$(($(date +%s) + minutes * 60))
# Clients stop starting runs at the deadline; servers a little later, so
# that the last client run finds one.
server_deadline=$((deadline + 5))
port=18700
streams=() clients=()
for h in "${hosts[@]}"; do
  to=${next[$h]}
  for kind in lossy lossless; do
    port=$((port + 1))
    if [[ $kind == lossy ]]; then
      opts="--rc-only --burst 16" env="env SOFTHCA_FAULT=$fault"
    else
      opts="" env="env"
    fi
    common="--gid-index 0 --port $port --timeout 170 $opts"
    loop_on "$to" "$work/server-$h$to-$kind" "$server_deadline" "$env timeout --foreground 180 $peer --server $common" &
    pids+=($!)
    loop_on "$h" "$work/client-$h$to-$kind" "$deadline" "$env timeout --foreground 180 $peer $common ${ip[$to]}" &
    pids+=($!) clients+=($!)
    streams+=("$h$to-$kind")
  done
done
echo "[$name] ${#streams[@]} streams for $minutes minute(s) (fault on the lossy ones: $fault)"
# The client loops end with their first run past the deadline (each run is
# bounded by 180 s); then the servers are stopped.
for pid in "${clients[@]}"; do wait "$pid"; done
for pid in "${pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null; done
# A UC or UD message that did not arrive is what those transports promise
# (no recovery), and the kernel drops datagrams on a loaded host: such runs
# count as "lost", not as failures, and the hosts' UDP drop counters are
# printed beside them. A UC RDMA WRITE whose packets were partly lost leaves
# the target's bytes undefined (IBTA), so its memory check counts as lost
# too. Anything else (an RC failure, a wrong byte in a message that came) fails.
unreliable='FAILED at case [0-9]+ of [0-9]+ \((UC|UD) [A-Z_]+ [0-9]+ B x[0-9]+\): server: ([0-9]+ of [0-9]+ receive completions came|memory:)'
total_ok=0 total_lost=0 total_bad=0
for s in "${streams[@]}"; do
  log=$work/client-$s
  ok=$(grep -c '^ok$' "$log" 2>/dev/null)
  lost=$(grep -v '^ok$' "$log" 2>/dev/null | grep -Ec -- "$unreliable")
  bad=$(grep -v '^ok$' "$log" 2>/dev/null | grep -Evc -- "$unreliable")
  echo "[$name] $s: ${ok:-0} runs all correct, ${lost:-0} with a UC/UD message lost, ${bad:-0} failed"
  grep -v '^ok$' "$log" 2>/dev/null | grep -Ev -- "$unreliable" | sed "s/^/[$name]   /" | head -5
  total_ok=$((total_ok + ${ok:-0})) total_lost=$((total_lost + ${lost:-0})) total_bad=$((total_bad + ${bad:-0}))
done
for h in "${hosts[@]}"; do
  echo "[$name] host $h: kernel UDP $(ip netns exec "${ns[$h]}" awk '$1 == "Udp:" && $2 == "InDatagrams" { for (i = 2; i <= NF; i++) k[i] = $i } $1 == "Udp:" && $2 ~ /^[0-9]+$/ { for (i = 2; i <= NF; i++) if (k[i] ~ /Errors|InDatagrams/) printf "%s %s ", k[i], $i }' /proc/net/snmp)"
  ip netns exec "${ns[$h]}" env SOFTHCA_RUNTIME_DIR="$work/runtime-$h" "$tool" stat --port 2>&1 |
    grep -E 'sent_pkts|rcvd_pkts|retransmitted|seq|drops|retry' | sed "s/^/[$name]   /"
done
((total_ok > 0 && total_bad == 0)) || status=FAIL
echo "[$name] $status: $total_ok runs all correct, $total_lost with a UC/UD message lost, $total_bad failed"
[[ $status == PASS ]]
