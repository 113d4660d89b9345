#!/usr/bin/env bash
# softhca_rxe.sh: softhca on the host side against the kernel's Soft-RoCE
# (rxe) in the guest of rxe_guest.sh, with unmodified rdma-core programs at
# both ends: softhca's libibverbs.so.1 (LD_LIBRARY_PATH) in the guest's
# network namespace on the host, rdma-core's own libibverbs and rxe provider
# in the guest.
#
#   tests/rxe/softhca_rxe.sh [TRY...]     (default: every try)
#
# Tries, NAME = PROGRAM FAMILY - SERVER SIDE, e.g. rc4-hs, rping6-gs:
#   rc uc ud              ibv_rc_pingpong -c, ibv_uc_pingpong, ibv_ud_pingpong
#   sbw wbw rbw abw       perftest ib_send_bw, ib_write_bw, ib_read_bw, ib_atomic_bw
#   wlat slat             ib_write_lat, ib_send_lat
#   wbwR                  ib_write_bw -R (its QPs connected by rdma_cm)
#   rping ucmatose udaddy rdmacm-utils' rdma_cm programs (rping -v -V)
#   mckey                 multicast: the "server" receives, the client sends
#   copy                  softhca's examples/rdma_copy (rdma_cm, RDMA WRITE)
# FAMILY 4 or 6: the GIDs (verbs programs) or addresses (rdma_cm) of
# IPv4 or IPv6; every program runs over both.
# hs: the server on softhca (host), the client on rxe (guest); gs: reversed.
# The pingpongs' out-of-band exchange is TCP over IPv4 in every case; the
# family picks the GIDs (softhca's and rxe's index for 198.18.1.x or
# 2001:2:1::x, looked up with `softhca devices` and ibv_devinfo -v).
#
# For each try it reports both programs' exit status and last lines, what
# changed in the port counters of softhca (`softhca stat -a --port`, s_*)
# and of rxe (`rdma statistic`, g_*), the UDP counters of
# both kernels (nstat: a kernel that drops a datagram counts it there), and
# a summary of a tcpdump capture of the tap (pcap_summary.py: packets per
# direction, opcodes, nonzero IPv4 IDs, zero UDP checksums, ICRCs checked
# with scapy). The captures stay in build-rxe-cache/run/softhca-rxe/.
# Each program is bounded (RXE_TRY_TIMEOUT, 20 s). Exit 0 when every try
# passed, 1 otherwise. SOFTHCA_BUILD: softhca's build tree (default build/).
set -u -o pipefail
export RXE_NAME=${RXE_NAME:-softhca-rxe}
# shellcheck source=rxe_guest.sh
source "$(dirname "${BASH_SOURCE[0]}")/rxe_guest.sh"

# Skipped (77), with the reason, where the guest cannot be run: not root,
# no network namespaces, no /dev/net/tun for the tap.
[[ $(id -u) == 0 ]] || { echo "softhca_rxe: SKIP: needs root (network namespaces, a tap, QEMU's network)"; exit 77; }
[[ -c /dev/net/tun ]] || { echo "softhca_rxe: SKIP: no /dev/net/tun for the guest's tap"; exit 77; }
unshare -n true 2>/dev/null || { echo "softhca_rxe: SKIP: cannot make network namespaces"; exit 77; }

build=${SOFTHCA_BUILD:-$RXE_REPO/build}
lib=$(find "$build" -name libibverbs.so.1 -path '*/lib/*' 2>/dev/null | head -1)
softhca=$build/bin/softhca
[[ -n $lib && -x $softhca ]] || { echo "softhca_rxe: no softhca build in $build (bash scripts/build.sh build)"; exit 1; }
libdir=$(dirname "$lib")
tlimit=${RXE_TRY_TIMEOUT:-20}

for pkg in tcpdump python3-scapy; do
  [[ $(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null) == "install ok installed" ]] ||
    { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$pkg" >&2 || exit 1; }
done

programs=(rc uc ud sbw wbw rbw abw wlat slat wbwR rping ucmatose udaddy mckey copy)
all=()
for p in "${programs[@]}"; do for f in 4 6; do for side in hs gs; do all+=("$p$f-$side"); done; done; done
tries=("$@")
((${#tries[@]})) || tries=("${all[@]}")

rxe_prepare || exit 1
rxe_start || exit 1     # EXIT trap: rxe_stop
# A copy of the build's libraries and tool: the build tree may be relinked
# while the tries run (the counters then come from two different builds).
snap=$RXE_STATE/softhca
rm -rf "$snap" && mkdir -p "$snap/bin" && cp -a "$libdir" "$snap/lib" && cp "$softhca" "$snap/bin/" || exit 1
echo "softhca: $libdir ($(date -r "$lib" '+%F %T'), $(git -C "$RXE_REPO" log -1 --format='HEAD %h %s' 2>/dev/null)), copied to $snap"
libdir=$snap/lib softhca=$snap/bin/softhca
jobs_pids=()
trap 'for p in "${jobs_pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null; done; rxe_stop' EXIT

# softhca_env RT: the environment of a softhca process with runtime dir RT.
softhca_env() { echo "SOFTHCA_RUNTIME_DIR=$1 LD_LIBRARY_PATH=$libdir SOFTHCA_LOG=info"; }

# One runtime directory for every softhca process, as on one host: the
# processes of a network namespace share UDP port 4791 (SO_REUSEPORT) and
# hand each other packets through it.
rt=$RXE_STATE/rt; mkdir -p "$rt"
# shellcheck disable=SC2046
hdev=$(rxe_host env $(softhca_env "$rt") "$softhca" devices 2>&1)
gdev=$(rxe_run -t 20 'ibv_devinfo -v -d rxe0')
hgid4=$(awk -v a="::ffff:$RXE_HOST_IP4" '$1 == "gid" && $3 == a { print $2; exit }' <<<"$hdev")
hgid6=$(awk -v a="$RXE_HOST_IP6" '$1 == "gid" && $3 == a { print $2; exit }' <<<"$hdev")
ggid() { grep -E "GID\[ *[0-9]+\]:[[:space:]]+$1, RoCE v2" <<<"$gdev" | sed -E 's/.*GID\[ *([0-9]+)\].*/\1/' | head -1; }
ggid4=$(ggid "::ffff:$RXE_GUEST_IP4") ggid6=$(ggid "$RXE_GUEST_IP6")
echo "GIDs: softhca (host) IPv4 ${hgid4:-?} IPv6 ${hgid6:-?}; rxe (guest) IPv4 ${ggid4:-?} IPv6 ${ggid6:-?}"
[[ -n $hgid4 && -n $hgid6 && -n $ggid4 && -n $ggid6 ]] || { echo "$hdev"; echo "$gdev" | grep GID; exit 1; }
# IPv4 multicast (mckey) leaves through the tap on both sides: neither has
# a default route. (IPv6's ff00::/8 is routed on every interface.)
rxe_host ip route add 224.0.0.0/4 dev "$RXE_TAP" || exit 1
rxe_run -t 20 'ip route add 224.0.0.0/4 dev eth0' >/dev/null || exit 1

# counters: one "NAME VALUE" per line: rxe's port counters in the guest and
# UDP counters of the guest's kernel (g_*), or UDP counters of the host
# side's kernel (h_*).
guest_counters() {
  rxe_run -t 20 'rdma statistic show link rxe0/1 | tr " " "\n" | awk "NF" | sed -n "/^rxe0\/1$/,\$p" | tail -n +2 | paste -d" " - -;
    nstat -asz "Udp*" | awk "!/^#/ { print \$1, \$2 }"' | sed 's/^/g_/'
}
host_counters() {
  rxe_host nstat -asz 'Udp*' 'Ip6*' 'IpExt*' | awk '!/^#/ { print "h_" $1, $2 }'
  rxe_host env SOFTHCA_RUNTIME_DIR="$rt" "$softhca" stat -a --port | awk 'NR > 1 && NF == 2 { print "s_" $1, $2 }'
}
# diff BEFORE AFTER: the counters that changed.
counters_diff() {
  awk 'NR == FNR { b[$1] = $2; next } $2 != b[$1] { printf "%s +%d  ", $1, $2 - b[$1] }' <(echo "$1") <(echo "$2")
}

# wait_host_listen PORT: the host side listens on TCP PORT (bounded).
wait_host_listen() {
  local i
  for ((i = 0; i < 200; i++)); do
    rxe_host ss -Hltn "sport = :$1" | grep -q . && return 0
    sleep 0.05
  done
  return 1
}
guest_listen_cmd() { echo "timeout 15 bash -c 'until ss -Hltn \"sport = :$1\" | grep -q .; do sleep 0.05; done'"; }

# peer_limitation TRY GUEST_OUT HOST_OUT: a try that fails for a reason of
# the peer's own, not softhca's, prints the reason; only on the exact error
# that shows it, so that any other failure of the try still fails.
peer_limitation() {
  case $1 in
    # The kernel's rdma_cm returns ENOTSUPP (524) when rxe joins an IPv6
    # multicast group (its join never reaches softhca: no packet is sent).
    mckey6-*) grep -q "failure joining: Unknown error 524" <<<"$2" && echo "rxe cannot join IPv6 multicast groups: ENOTSUPP" ;;
    # perftest 4.5's rdma_cm mode looks the server up as IPv4 only.
    wbwR6-*) grep -q "Address family for hostname not supported" <<<"$2$3" &&
               echo "perftest -R resolves IPv4 addresses only" ;;
    *) false ;;
  esac
}

passed=0 failed=0 skipped=0 n=0
for t in "${tries[@]}"; do
  n=$((n + 1))
  name=${t%-*} side=${t##*-}
  fam=${name: -1} prog=${name%?}
  [[ $fam == [46] && ($side == hs || $side == gs) && " ${programs[*]} " == *" $prog "* ]] ||
    { echo "unknown try $t (${all[*]})"; exit 2; }
  if [[ $fam == 6 ]]; then
    hg=$hgid6 gg=$ggid6 ha=$RXE_HOST_IP6 ga=$RXE_GUEST_IP6 group=ff0e::1:2:3
  else
    hg=$hgid4 gg=$ggid4 ha=$RXE_HOST_IP4 ga=$RXE_GUEST_IP4 group=239.1.2.3
  fi
  port=$((18600 + n))
  # The tries a peer's own limit fails (peer_limitation) end at its timeout:
  # a shorter one for them.
  limit=$tlimit
  case $t in mckey6-*|wbwR6-*) limit=8 ;; esac
  # Each program: its server's and client's arguments, what the client's
  # output must show, how the server shows it is ready (tcp: it listens on
  # TCP $port; cm: an rdma_cm listener; log RE: a line of its output), and
  # the option naming the device and GID on the rxe side.
  dev="-d rxe0" ready=tcp cli_tail="@SERVER@" cmd=""
  case $prog in
    rc) cmd="ibv_rc_pingpong -g @GID@ -p $port -n 50 -c" expect="50 iters in" ;;
    uc) cmd="ibv_uc_pingpong -g @GID@ -p $port -n 50" expect="50 iters in" ;;
    ud) cmd="ibv_ud_pingpong -g @GID@ -p $port -n 50 -s 512" expect="50 iters in" ;;
    sbw) cmd="ib_send_bw -x @GID@ -p $port -s 65536 -n 200 -F" expect="^ *65536 +200 " ;;
    wbw) cmd="ib_write_bw -x @GID@ -p $port -s 65536 -n 200 -F" expect="^ *65536 +200 " ;;
    # -o 16: perftest's client asks for the server's outstanding reads as its
    # own max_rd_atomic; rxe offers 128, softhca (like a ConnectX) allows 16
    # and refuses more at RTS, as rxe and mlx5 refuse more than their own.
    rbw) cmd="ib_read_bw -x @GID@ -p $port -s 65536 -n 200 -F -o 16" expect="^ *65536 +200 " ;;
    abw) cmd="ib_atomic_bw -x @GID@ -p $port -n 200 -F -o 16" expect="^ *8 +200 " ;;
    wlat) cmd="ib_write_lat -x @GID@ -p $port -n 200 -F" expect="^ *2 +200 " ;;
    slat) cmd="ib_send_lat -x @GID@ -p $port -n 200 -F" expect="^ *2 +200 " ;;
    wbwR) cmd="ib_write_bw -R -p $port -s 65536 -n 200 -F$([[ $fam == 6 ]] && echo " --ipv6")" \
            expect="^ *65536 +200 " ready=cm ;;
  esac
  srv=${cmd:-} cli="${cmd:-} $cli_tail"
  case $prog in
    rping) srv="rping -s -C 10 -v -V -p $port -a @ADDR@" cli="rping -c -C 10 -v -V -p $port -a @ADDR@" ;;
    ucmatose) srv="ucmatose -p $port -C 10 -b @ADDR@" cli="ucmatose -p $port -C 10 -s @ADDR@" ;;
    udaddy) srv="udaddy -C 10 -b @ADDR@" cli="udaddy -C 10 -s @ADDR@" ;;  # its port is fixed (7174)
    mckey) srv="mckey -m $group -C 10 -b @ADDR@" cli="mckey -m $group -C 10 -b @OWN@ -s" ready="log joined dgid" ;;
    copy) srv="@RDMA_COPY@ --port $port --server --bind @ADDR@ --output @OUT@"
          cli="@RDMA_COPY@ --port $port @COPY_FILE@ @ADDR@" ready="log listening on" ;;
  esac
  case $prog in
    rping|ucmatose|udaddy) expect=$([[ $prog == rping ]] && echo "ping data" || echo "return status 0") ready=cm dev="" ;;
    mckey) expect="return status 0" dev="" ;;
    copy) expect="." dev="" ;;
  esac
  # The verbs programs' out-of-band exchange is TCP over IPv4 whatever the
  # GIDs; ib_write_bw -R and the rdma_cm programs address the server in the family.
  case $prog in rc|uc|ud|sbw|wbw|rbw|abw|wlat|slat) oob4=1 ;; *) oob4=0 ;; esac
  side_cmd() {  # side_cmd SIDE ROLE: the command line for softhca (host) or rxe (guest)
    local c own peer gid out
    if [[ $1 == host ]]; then own=$ha peer=$ga gid=$hg out=$RXE_STATE/copy.out.$t; else own=$ga peer=$ha gid=$gg out=/tmp; fi
    c=$([[ $2 == server ]] && echo "$srv" || echo "$cli")
    c=${c//@GID@/$gid}
    c=${c//@OWN@/$own}
    if [[ $2 == server ]]; then c=${c//@ADDR@/$own}; else c=${c//@ADDR@/$peer}; fi
    if ((oob4)); then c=${c//@SERVER@/$([[ $1 == host ]] && echo "$RXE_GUEST_IP4" || echo "$RXE_HOST_IP4")}
    else c=${c//@SERVER@/$peer}; fi
    c=${c//@OUT@/$out}
    # The guest sees the host's root but not its /tmp (its own tmpfs), where
    # a checkout may be: rdma_copy and the file to copy go through the share.
    if [[ $1 == host ]]; then c=${c//@RDMA_COPY@/$build/bin/rdma_copy}; c=${c//@COPY_FILE@/$share/copy.bin}
    else c=${c//@RDMA_COPY@//run/rxe/share/rdma_copy}; c=${c//@COPY_FILE@//run/rxe/share/copy.bin}; fi
    [[ $1 == guest && -n $dev && $c != *rdma_copy* ]] && c="${c%% *} $dev ${c#* }"
    # rdma_copy's RUNPATH names softhca's libraries; the guest runs rdma-core's.
    [[ $1 == guest && $c == *rdma_copy* ]] && c="env LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu $c"
    echo "stdbuf -oL -eL $c"
  }
  share=$(rxe_sharedir)
  if [[ $prog == copy && ! -s $share/copy.bin ]]; then
    cp "$build/bin/rdma_copy" "$share/rdma_copy" && head -c $((3 * 1024 * 1024 + 1234)) /dev/urandom >"$share/copy.bin" || exit 1
  fi
  hcmd_s=$(side_cmd host server) gcmd_c=$(side_cmd guest client)
  gcmd_s=$(side_cmd guest server) hcmd_c=$(side_cmd host client)
  mkdir -p "$RXE_STATE/copy.out.$t"
  pcap=$RXE_STATE/$t.pcap hout=$RXE_STATE/$t.host.out
  echo "=== $t: $prog over IPv$fam, server on $([[ $side == hs ]] && echo "softhca (host), client on rxe" || echo "rxe (guest), client on softhca")"
  setsid ip netns exec "$RXE_NS" tcpdump -i "$RXE_TAP" -nn -U --immediate-mode -Z root -w "$pcap" udp port 4791 \
    >/dev/null 2>"$RXE_STATE/$t.tcpdump.err" &
  cap=$!
  jobs_pids+=("$cap")
  for ((i = 0; i < 200; i++)); do grep -q "listening on" "$RXE_STATE/$t.tcpdump.err" && break; sleep 0.05; done
  gbefore=$(guest_counters) hbefore=$(host_counters)
  t0=$(date +%s%N)
  # shellcheck disable=SC2046,SC2086
  if [[ $side == hs ]]; then
    setsid ip netns exec "$RXE_NS" env $(softhca_env "$rt") timeout "$limit" $hcmd_s >"$hout" 2>&1 &
    hp=$!
    jobs_pids+=("$hp")
    case $ready in
      tcp) wait_host_listen "$port" || echo "  (the host server does not listen on $port)" ;;
      *) re=$([[ $ready == cm ]] && echo "cm: listening on" || echo "${ready#log }")
         for ((i = 0; i < 300; i++)); do grep -q -- "$re" "$hout" && break; kill -0 "$hp" 2>/dev/null || break; sleep 0.05; done ;;
    esac
    # A diagnostic snapshot of the host side's UDP sockets 1 s in (printed
    # if the try fails); it gates nothing.
    (sleep 1; rxe_host ss -uanpe >"$RXE_STATE/$t.sockets" 2>&1) &
    gout=$(rxe_run -t $((tlimit + 15)) "timeout $limit $gcmd_c"); grc=$?
    wait $!
    wait "$hp"; hrc=$?
    cout=$gout
  else
    sid=$(rxe_spawn -t $((tlimit + 15)) "timeout $limit $gcmd_s")
    case $ready in
      # An rdma_cm listener opens no TCP port: the kernel lists its cm_id.
      cm) rxe_run -t 20 "timeout 15 bash -c 'until rdma res show cm_id | grep -q \"state LISTEN\"; do sleep 0.05; done'" >/dev/null ||
            echo "  (the guest's $prog does not listen)" ;;
      tcp) rxe_run -t 20 "$(guest_listen_cmd "$port")" >/dev/null || echo "  (the guest server does not listen on $port)" ;;
      *) rxe_waitfor "$sid" "${ready#log }" 20 || echo "  (the guest's $prog never said: ${ready#log })" ;;
    esac
    # A diagnostic snapshot of the host side's UDP sockets 1 s into the
    # client's run (printed if the try fails); it gates nothing.
    (sleep 1; rxe_host ss -uanpe >"$RXE_STATE/$t.sockets" 2>&1) &
    ip netns exec "$RXE_NS" env $(softhca_env "$rt") timeout "$limit" $hcmd_c >"$hout" 2>&1
    hrc=$?
    wait $!
    gout=$(rxe_wait "$sid"); grc=$?
    cout=$(cat "$hout")
  fi
  ms=$((($(date +%s%N) - t0) / 1000000))
  # Both programs have exited, so every packet they exchanged has passed the
  # tap, where tcpdump (--immediate-mode) takes it. The capture only fails a
  # try on a bad packet it holds, never on one it lacks.
  kill -INT "$cap" 2>/dev/null; wait "$cap" 2>/dev/null
  gafter=$(guest_counters) hafter=$(host_counters)
  wire=$(/usr/bin/python3 "$RXE_TESTS_DIR/pcap_summary.py" "$pcap" "softhca=$RXE_HOST_IP4" "rxe=$RXE_GUEST_IP4" \
    "softhca=$RXE_HOST_IP6" "rxe=$RXE_GUEST_IP6" 2>&1 | tr '\n' '|')
  # tshark's RoCE dissector on the same capture, whoever sent the packet:
  # each one to or from port 4791 must decode with a BTH opcode, and none
  # may be malformed in its RoCE headers. Not counted: what Wireshark's
  # guesses at the payload (its heuristics after the InfiniBand layer: a
  # 2-byte WRITE taken for CRTP) find malformed, and the zero UDP checksum
  # of RoCEv2 over IPv6, which it calls illegal and RFC 6936 allows.
  malformed=$( { tshark -r "$pcap" -Y 'udp.port == 4791 && !infiniband.bth.opcode' 2>/dev/null
                 tshark -r "$pcap" -Y _ws.malformed -T fields -e frame.protocols 2>/dev/null | grep -v 'infiniband:.'
                 tshark -r "$pcap" -Y '_ws.expert.severity == error && !_ws.malformed' -T fields -e _ws.expert.message \
                   2>/dev/null | tr ',' '\n' | grep -v '^Illegal checksum value (0)$'; } | grep -c .)
  if [[ $wire == *icrc_BAD* || $malformed != 0 ]]; then
    result=FAIL failed=$((failed + 1))
    echo "  the capture has packets with a wrong ICRC or that tshark finds malformed ($malformed)"
  elif [[ $hrc == 0 && $grc == 0 ]] && grep -Eq -- "$expect" <<<"$cout"; then
    result=PASS passed=$((passed + 1))
  elif why=$(peer_limitation "$t" "$gout" "$(cat "$hout")"); then
    result="SKIP ($why)" skipped=$((skipped + 1))
  else
    result=FAIL failed=$((failed + 1))
  fi
  echo "$result $t in $ms ms: softhca (host) exit $hrc, rxe (guest) exit $grc"
  [[ $result == FAIL && -s $RXE_STATE/$t.sockets ]] && sed 's/^/  socket: /' "$RXE_STATE/$t.sockets"
  echo "  softhca: $(grep -vE '^ *(local|remote) address|ping data' "$hout" | tail -4 | tr '\n' '|')"
  echo "  rxe:     $(grep -vE '^ *(local|remote) address|ping data' <<<"$gout" | tail -4 | tr '\n' '|')"
  echo "  counters changed: $(counters_diff "$gbefore" "$gafter")$(counters_diff "$hbefore" "$hafter")"
  echo "  wire: $wire"
done
if ((failed)); then
  echo "--- guest dmesg (tail)"
  rxe_dmesg | grep -v 'speed is unknown' | tail -15
fi
echo "softhca_rxe: $passed passed, $failed failed, $skipped skipped for the peer's own limits (of ${#tries[@]}); boot to ready $(awk -F= '/RXE_BOOT_MS/ { print $2 }' "$RXE_STATE/env") ms"
((failed == 0))
