#!/usr/bin/env bash
# loss_soak.sh: the rdma_cm programs of issue #42 run again and again between
# two namespace hosts (two_hosts.sh) with a share of each host's incoming
# RoCEv2 datagrams dropped by nftables, and how many runs passed. Run by
# hand (as root, like two_hosts.sh); too long for CI.
#
#   loss_soak.sh --build DIR [--runs N] [--loss PERCENT] [--keep DIR] [PROGRAM...]
#
# --build DIR   the build tree (its lib/ is loaded, its bin/ holds rdma_copy
#               and cm_probe); --runs N runs of each (20); --loss PERCENT on
#               each host's input (20); --keep DIR keeps the output of every
#               failed run there (default: a new directory under /tmp).
# PROGRAMS: rping, ucmatose, udaddy, ib_write_bw (-R), rdma_copy (3 MB, CRC
# checked), killed_peer (a client killed by SIGKILL once connected; the
# server must see DISCONNECTED); all of them by default.
#
# What no RoCE stack can do every time at 20% loss, and softhca does not
# either: udaddy's data (it waits for every UD datagram, which may be lost,
# so it runs with -C 0: the SIDR exchange alone), udaddy's server exiting
# right after its one SIDR_REP (a lost SIDR_REP leaves the client asking a
# host where nobody listens any more), and perftest's closing handshake (the
# server exits once its last SEND is acknowledged; when the ACK of the
# client's last SEND is lost, nobody is left to acknowledge it again, and
# the client ends in RETRY_EXC_ERR, "Failed to close connection").
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build="" runs=20 loss=20 keep=""
programs=()
while (($#)); do
  case $1 in
    --build) build=$(cd "$2" && pwd) || exit 2; shift ;;
    --runs) runs=$2; shift ;;
    --loss) loss=$2; shift ;;
    --keep) keep=$2; shift ;;
    -h | --help) sed -n '2,/^set -u/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "loss_soak.sh: unknown option $1" >&2; exit 2 ;;
    *) programs+=("$1") ;;
  esac
  shift
done
[[ -n $build ]] || { echo "loss_soak.sh: --build DIR is required" >&2; exit 2; }
((${#programs[@]})) || programs=(rping ucmatose udaddy ib_write_bw rdma_copy killed_peer)
[[ -n $keep ]] || keep=$(mktemp -d /tmp/softhca-loss-soak.XXXXXX)
mkdir -p "$keep"
work=$(mktemp -d /tmp/softhca-loss-soak-run.XXXXXX)
trap 'rm -rf "$work"' EXIT
head -c 3000000 /dev/urandom >"$work/file.bin"

total_failed=0
for program in "${programs[@]}"; do
  args=()
  case $program in
    rping) args=(--server "rping -s -a @SERVER@ -C 10 -v" --client "rping -c -a @SERVER@ -C 10 -v"
                 --expect "^ping data: rdma-ping-9: ") ;;
    ucmatose) args=(--server "ucmatose" --client "ucmatose -s @SERVER@" --expect "test complete"
                    --expect "return status 0") ;;
    udaddy) args=(--server "udaddy -C 0" --client "udaddy -s @SERVER@ -C 0" --expect "test complete"
                  --expect "return status 0") ;;
    ib_write_bw) args=(--server "ib_write_bw -d softhca0 -R -x 0 -p 7174 -n 1000"
                       --client "ib_write_bw -d softhca0 -R -x 0 -p 7174 -n 1000 @SERVER@" --expect "^ 65536 ") ;;
    rdma_copy) args=(--server "$build/bin/rdma_copy --server --port 7191 --output $work/copy.out"
                     --client "$build/bin/rdma_copy --port 7191 $work/file.bin @SERVER@") ;;
    killed_peer) args=(--server "$build/bin/cm_probe await-disconnect 7174 20"
                       --client "$build/bin/cm_probe killed-when-connected @SERVER@ 7174" --expect "was killed"
                       --env SOFTHCA_CM_RESPONSE_TIMEOUT=16) ;;  # cm_probe waits 10 s for each event
    *) echo "loss_soak.sh: unknown program $program" >&2; exit 2 ;;
  esac
  passed=0 failed=0 began=$(date +%s)
  for ((i = 1; i <= runs; i++)); do
    log=$work/run.log
    timeout 150 bash "$here/two_hosts.sh" --name "$program.$i" --timeout 120 --libdir "$build/lib" --port 18515 \
      --loss "$loss" --env SOFTHCA_LOG=info --ready-log "cm: listening on|await-disconnect: listening" \
      "${args[@]}" >"$log" 2>&1
    if tail -1 "$log" | grep -q " PASS "; then
      passed=$((passed + 1))
    else
      failed=$((failed + 1))
      cp "$log" "$keep/$program.$i.log"
    fi
    printf '\r%s: %d of %d runs, %d failed' "$program" "$i" "$runs" "$failed"
  done
  printf '\r%s: %d of %d passed at %s%% loss (%d s)\n' "$program" "$passed" "$runs" "$loss" $(($(date +%s) - began))
  total_failed=$((total_failed + failed))
done
((total_failed == 0)) || echo "the failed runs' output: $keep"
((total_failed == 0))
