#!/usr/bin/env bash
# smoke.sh: does the rxe guest (rxe_guest.sh) work? Boots it and checks,
# inside the guest only (the host side has no rxe device, and softhca is
# not involved here):
#   - rxe0 exists (rdma link, ibv_devices) and is ACTIVE on eth0;
#   - its GID table holds RoCE v2 GIDs for eth0's IPv4 address
#     (::ffff:198.18.1.2) and IPv6 address (2001:2:1::2), found the way
#     rdma-core's show_gids finds them: /sys/class/infiniband/rxe0/ports/1/
#     gids/N and gid_attrs/types/N; ibv_devinfo -v lists the same;
#   - rxe to rxe through the guest's own stack, rdma-core's stock libibverbs
#     and rxe provider: ibv_rc_pingpong and ibv_ud_pingpong over the IPv4
#     GID (out of band over 127.0.0.1), and rping (rdma_cm) over IPv4.
# Prints the boot time and each step's time; on a failure the guest's dmesg.
# Needs root. Exit 0 when every check passes, 1 otherwise.
#
#   tests/rxe/smoke.sh            (RXE_NAME, RXE_MEM, ... as in rxe_guest.sh)
set -u -o pipefail
export RXE_NAME=${RXE_NAME:-smoke}
# shellcheck source=rxe_guest.sh
source "$(dirname "${BASH_SOURCE[0]}")/rxe_guest.sh"

t_start=$SECONDS
rxe_prepare || exit 1
rxe_start || { rxe_dmesg 2>/dev/null | tail -50; exit 1; }   # sets the EXIT trap (rxe_stop)

failures=0
step() { # step NAME: times and reports the check that follows (check_end)
  step_name=$1 step_t0=$(date +%s%N)
}
check_end() { # check_end RC [DETAIL]
  local ms=$((($(date +%s%N) - step_t0) / 1000000))
  if (($1 == 0)); then echo "PASS  $step_name (${ms} ms)"; else
    echo "FAIL  $step_name (${ms} ms) ${2:-}"; failures=$((failures + 1)); fi
}

step "rxe0 is ACTIVE on eth0 (rdma link, ibv_devices)"
out=$(rxe_run -t 20 'rdma link show; ibv_devices'); rc=$?
[[ $rc == 0 && $out == *"link rxe0/1 state ACTIVE"*"netdev eth0"* && $out == *rxe0* ]]
check_end $? "$(echo "$out" | head -5)"

# The GID table the show_gids way: index, GID, type for each non-zero GID.
step "RoCE v2 GIDs for 198.18.1.2 and 2001:2:1::2 in sysfs"
# rxe's table has 1024 entries: read them with bash's read, not a cat each
# (a fork and exec over 9p costs tens of ms under TCG).
gids=$(rxe_run -t 20 'cd /sys/class/infiniband/rxe0/ports/1/gids && for n in *; do
  read -r g <$n; [ "$g" = 0000:0000:0000:0000:0000:0000:0000:0000 ] && continue
  read -r t <../gid_attrs/types/$n; echo "$n $g $t"; done | sort -n')
gid4=$(awk '$2 == "0000:0000:0000:0000:0000:ffff:c612:0102" && /RoCE v2/ { print $1 }' <<<"$gids")
gid6=$(awk '$2 == "2001:0002:0001:0000:0000:0000:0000:0002" && /RoCE v2/ { print $1 }' <<<"$gids")
[[ -n $gid4 && -n $gid6 ]]
check_end $? "$gids"
echo "      $(tr '\n' ';' <<<"$gids")  -> IPv4 GID index ${gid4:-?}, IPv6 GID index ${gid6:-?}"
gid4=${gid4:-1}

step "ibv_devinfo -v lists the same GIDs"
out=$(rxe_run -t 20 'ibv_devinfo -v -d rxe0'); rc=$?
[[ $rc == 0 && $out == *"PORT_ACTIVE"* && $out =~ GID\[\ *$gid4\]:[[:space:]]*::ffff:198.18.1.2,\ RoCE\ v2 && $out == *"2001:2:1::2, RoCE v2"* ]]
check_end $? "$(grep -E 'GID|state' <<<"$out")"

# pingpong PROG PORT EXTRA: a server and a client of PROG in the guest.
pingpong() {
  local prog=$1 port=$2 extra=$3 srv out rc src
  srv=$(rxe_spawn -t 40 "$prog -d rxe0 -g $gid4 -p $port $extra") || return 1
  # Ready: the server listens on its TCP port (checked inside the guest,
  # bounded), not a fixed sleep.
  rxe_run -t 20 "timeout 15 bash -c 'until ss -Hltn \"sport = :$port\" | grep -q .; do sleep 0.05; done'" ||
    { echo "      the server did not listen: $(rxe_out "$srv")"; rxe_kill "$srv" KILL >/dev/null; return 1; }
  out=$(rxe_run -t 40 "$prog -d rxe0 -g $gid4 -p $port $extra 127.0.0.1"); rc=$?
  rxe_wait -t 20 "$srv" >/dev/null; src=$?
  echo "      client: $(grep -E 'iters|bytes|rror|fail' <<<"$out" | tr '\n' ' ')"
  [[ $rc == 0 && $src == 0 && $out == *"iters in"* ]] || { echo "      client exit $rc, server exit $src"; echo "$out" | sed 's/^/      /'; return 1; }
}

step "ibv_rc_pingpong rxe0 <-> rxe0 (GID $gid4, 200 iterations)"
pingpong ibv_rc_pingpong 18515 "-n 200"
check_end $?

step "ibv_ud_pingpong rxe0 <-> rxe0 (GID $gid4, 200 iterations, 512 bytes)"
pingpong ibv_ud_pingpong 18516 "-n 200 -s 512"
check_end $?

# rping: rdma_cm over IPv4 (rdma_cm, ib_cm, rdma_ucm). An rdma_cm server
# opens no TCP port: ready once the kernel lists its cm_id as LISTEN.
step "rping rxe0 <-> rxe0 over 198.18.1.2 (rdma_cm, 20 pings)"
srv=$(rxe_spawn -t 40 "rping -s -a $RXE_GUEST_IP4 -C 20")
rxe_run -t 20 "timeout 15 bash -c 'until rdma res show cm_id | grep -q \"state LISTEN\"; do sleep 0.05; done'" >/dev/null
out=$(rxe_run -t 40 "rping -c -a $RXE_GUEST_IP4 -C 20 -v"); rc=$?
rxe_wait -t 20 "$srv" >/dev/null; src=$?
[[ $rc == 0 && $src == 0 && $(grep -c 'ping data' <<<"$out") -ge 20 ]]
check_end $? "client exit $rc, server exit $src: $(tail -3 <<<"$out")"

((failures)) && { echo "--- guest dmesg (tail)"; rxe_dmesg | tail -40; }
boot_ms=$(awk -F= '/RXE_BOOT_MS/ { print $2 }' "$RXE_STATE/env")
echo "smoke: $( ((failures)) && echo "FAILED ($failures)" || echo PASSED): boot to ready ${boot_ms} ms, whole run $((SECONDS - t_start)) s"
((failures == 0))
