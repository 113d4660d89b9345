#!/usr/bin/env bash
# harness.sh: run unmodified RDMA programs on softhca, alone or as a
# server/client pair, each under a time limit, and judge the outcome.
#
# Pair mode (the pingpongs, perftest):
#   harness.sh --name NAME --timeout SECS --libdir DIR --port PORT \
#              --server 'CMD ARGS' --client 'CMD ARGS' \
#              [--expect-server RE]... [--expect-client RE]... [--expect RE]... [--reject RE]...
#   1. checks that nothing listens on TCP PORT yet (waits a little for a
#      previous test's server to go away, then fails);
#   2. starts the server in the background, in a session of its own, with
#      LD_LIBRARY_PATH=DIR prepended;
#   3. polls `ss` until 127.0.0.1:PORT (or any address) is listening, in a
#      loop of 50 ms waits bounded by --ready-timeout; stops early and fails if
#      the server exits first. The listening socket is the readiness signal:
#      the pingpongs and perftest exchange QP data over that TCP connection,
#      so a client that connects any earlier is refused and gives up;
#   4. runs the client; waits for both, each bounded by --timeout;
#   5. when the client fails, gives the server --grace seconds, then kills
#      the server's process group (it is ours: we started it with setsid);
#   6. prints both outputs, each line prefixed with [NAME server] or
#      [NAME client], and one PASS/FAIL line; exits 0 on PASS, 1 on FAIL.
#
# Single mode (ibv_devices, ibv_devinfo, ibv_asyncwatch):
#   harness.sh --name NAME --timeout SECS [--libdir DIR] --run 'CMD ARGS' \
#              [--expect RE]... [--reject RE]... [--run-for SECS]
#   --run-for SECS is for programs that never exit by themselves
#   (ibv_asyncwatch loops in ibv_get_async_event): the program must still be
#   running after SECS; the harness then terminates it (SIGTERM) and that
#   counts as success. Exiting earlier is a failure.
#
# A run FAILS when a program exits non-zero (124: timed out), when an
# --expect/--expect-server/--expect-client regex (grep -E) does not match the
# program's output (stdout and stderr together), when a --reject regex
# matches any output, or when any output has a line that shows the wrong
# library was loaded or the ABI does not match: "symbol lookup error",
# "no version information available", "version `X' not found", or a
# sanitizer report.
#
# Time limits: each program gets --timeout seconds from its start. The harness
# waits for it without polling (wait -n against a sleep); at the limit it
# first attaches gdb, when installed, to every program still running and
# prints the stacks of all their threads ([NAME ROLE bt] lines; --no-backtrace
# or SOFTHCA_HARNESS_BACKTRACE=0 to skip), then sends SIGTERM to the program's
# process group and SIGKILL --grace seconds later. Every program also runs
# under timeout(1) with 30 s more, the backstop should the harness be killed.
#
# Commands are shell words (quoting allowed) of one simple command; each is
# run as `setsid timeout -k GRACE SECS+30 stdbuf -oL -eL bash -c 'exec CMD'` so
# that output survives a kill (stdbuf line-buffers C stdio; --no-stdbuf
# disables it, e.g. for sanitizer-built programs, whose runtime must be loaded
# first). Only processes this harness started are ever signalled, by PID/PGID.
set -u -o pipefail

me=harness
usage() {
  sed -n '2,/^set -u/{/^set -u/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
  cat <<'EOF'
Options:
  --name NAME            test name used in prefixes and the verdict (default: harness)
  --timeout SECS         limit for each program (default 60)
  --libdir DIR           prepend DIR to LD_LIBRARY_PATH for every program
  --port PORT            TCP port the server listens on (pair mode; default 18515)
  --server CMD, --client CMD   the pair
  --run CMD              single-program mode
  --run-for SECS         single mode: the program must still run after SECS
  --udp                  pair mode: --port is a UDP port; the server is ready
                         once a UDP socket is bound to it (udpong)
  --server-persists      pair mode, for servers that never exit (cmtime): once
                         the client has passed, the server must still be running;
                         the harness then stops it, and that counts as success
  --expect RE            regex that must match every program's output
  --expect-server RE, --expect-client RE   regex for one side only
  --reject RE            regex that must not match any output
  --ready-timeout SECS   bound for the listen poll (default: --timeout)
  --grace SECS           wait for the server after a client failure, and
                         SIGTERM-to-SIGKILL delay (default 5)
  --keep DIR             keep the raw logs as DIR/NAME.{server,client,run}.log
  --no-stdbuf            do not force line-buffered stdio
  --no-backtrace         at a time limit, do not attach gdb to the programs
                         still running (also SOFTHCA_HARNESS_BACKTRACE=0)
  -h, --help             this text
EOF
}

die_usage() { echo "$me: $*" >&2; echo "$me: run with --help for usage" >&2; exit 2; }

name=harness timeout=60 libdir="" port=18515 server="" client="" run="" run_for=""
ready_timeout="" grace=5 keep="" use_stdbuf=1 want_backtraces=${SOFTHCA_HARNESS_BACKTRACE:-1}
expect_all=() expect_server=() expect_client=() reject=()

# ---- begin --ready-regex (rdma_cm servers; added with librdmacm, issue 3) ----
# rdma_cm servers (rping -s, ucmatose, rdma_server, perftest -R) open no TCP
# port. With --ready-regex RE the server counts as ready once a line of its
# output (stdout+stderr) matches RE — e.g. softhca's "cm: listening on" line,
# logged with SOFTHCA_LOG=info once the listener is registered — instead of
# once TCP --port listens. Parsed here, before the main option loop.
ready_regex=""
server_persists=0
udp=0
_args=()
while (($#)); do
  case $1 in
    --ready-regex) (($# >= 2)) || { echo "$me: --ready-regex needs a value" >&2; exit 2; }
                   ready_regex=$2; shift 2 ;;
    --ready-regex=*) ready_regex=${1#*=}; shift ;;
    --server-persists) server_persists=1; shift ;;
    --udp) udp=1; shift ;;
    *) _args+=("$1"); shift ;;
  esac
done
set -- ${_args[@]+"${_args[@]}"}
unset _args
# ---- end --ready-regex ----

while (($#)); do
  opt=$1
  case $opt in
    -h|--help) usage; exit 0 ;;
    --no-stdbuf) use_stdbuf=0; shift; continue ;;
    --no-backtrace) want_backtraces=0; shift; continue ;;
    --*=*) set -- "${opt%%=*}" "${opt#*=}" "${@:2}"; continue ;;
  esac
  (($# >= 2)) || die_usage "option $opt needs a value"
  val=$2
  case $opt in
    --name) name=$val ;;
    --timeout) timeout=$val ;;
    --libdir) libdir=$val ;;
    --port) port=$val ;;
    --server) server=$val ;;
    --client) client=$val ;;
    --run) run=$val ;;
    --run-for) run_for=$val ;;
    --expect) expect_all+=("$val") ;;
    --expect-server) expect_server+=("$val") ;;
    --expect-client) expect_client+=("$val") ;;
    --reject) reject+=("$val") ;;
    --ready-timeout) ready_timeout=$val ;;
    --grace) grace=$val ;;
    --keep) keep=$val ;;
    *) die_usage "unknown option $opt" ;;
  esac
  shift 2
done

is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }
{ is_uint "$timeout" && ((timeout > 0)); } || die_usage "--timeout must be a positive integer"
is_uint "$grace" || die_usage "--grace must be a non-negative integer"
{ is_uint "$port" && ((port > 0 && port < 65536)); } || die_usage "--port must be a TCP port"
[[ -z $run_for ]] || is_uint "$run_for" || die_usage "--run-for must be an integer"
ready_timeout=${ready_timeout:-$timeout}
is_uint "$ready_timeout" || die_usage "--ready-timeout must be an integer"
if [[ -n $run ]]; then
  [[ -z $server && -z $client ]] || die_usage "--run excludes --server/--client"
  mode=single
else
  [[ -n $server && -n $client ]] || die_usage "need --server and --client, or --run"
  [[ -z $run_for ]] || die_usage "--run-for is for --run only"
  mode=pair
fi
if [[ -n $libdir ]]; then
  if [[ ! -d $libdir ]]; then
    echo "$me: $name: FAIL: --libdir $libdir does not exist (was the library built?)"
    exit 1
  fi
  libdir=$(cd "$libdir" && pwd)
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/softhca-harness.XXXXXX") || exit 1
declare -A pids=()      # role -> pid (= pgid: each program runs in its own session)
declare -A stop_at=()   # role -> time (ms) at which the harness stops it
backtraces_taken=0
sleeper=""              # the sleep(1) that bounds the current wait
failures=()
fail() { failures+=("$*"); }

now_ms() { local t=${EPOCHREALTIME/./}; echo $((t / 1000)); }
t_start=$(now_ms)

# poll SECS CMD...: run CMD every 50 ms until it succeeds (return 0) or SECS
# have passed (return 1). Readiness and exit waits are bounded this way.
poll() {
  local deadline=$(($(now_ms) + $1 * 1000))
  shift
  while true; do
    "$@" && return 0
    (($(now_ms) < deadline)) || return 1
    sleep 0.05
  done
}
# shellcheck disable=SC2317  # called through poll
not() { ! "$@"; }

# Is PID a live process (not a zombie)?
alive() {
  local stat
  { read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 1
  stat=${stat##*) }
  [[ ${stat%% *} != Z ]]
}

# Terminate the process group we created for a role, then make sure it is gone.
kill_role() {
  local role=$1 pid=${pids[$1]:-}
  [[ -n $pid ]] || return 0
  if alive "$pid"; then
    echo "$me: $name: stopping $role (pid $pid)" >&2
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
    poll "$grace" not alive "$pid"
    if alive "$pid"; then
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null
    fi
  fi
  # Members of the group that outlived its leader (the leader is timeout(1)).
  kill -KILL -- "-$pid" 2>/dev/null
  return 0
}

# The traps run only in the harness itself: a child that bash forked for a
# background command and that is signalled before it execs its program (the
# sleep in finish(), say) still has them, and must not clean up our files.
# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
  [[ $BASHPID == "$$" ]] || return 0
  local role
  for role in "${!pids[@]}"; do kill_role "$role"; done
  [[ -n $sleeper ]] && kill -KILL "$sleeper" 2>/dev/null
  if [[ -n $keep ]]; then
    mkdir -p "$keep" && for role in server client run; do
      [[ -f $tmp/$role.log ]] && cp "$tmp/$role.log" "$keep/$name.$role.log"
    done
  fi
  rm -rf "$tmp"
}
# verdict: print PASS or FAIL with every reason, and exit 0 or 1.
verdict() {
  local elapsed=$(($(now_ms) - t_start)) f secs_text
  printf -v secs_text '%d.%03ds' $((elapsed / 1000)) $((elapsed % 1000))
  if ((${#failures[@]} == 0)); then
    echo "$me: $name: PASS ($secs_text)"
    exit 0
  fi
  echo "$me: $name: FAIL ($secs_text)"
  for f in "${failures[@]}"; do echo "$me: $name:   - $f"; done
  exit 1
}

# shellcheck disable=SC2317  # invoked by the signal traps
on_signal() {
  [[ $BASHPID == "$$" ]] || exit 143
  fail "interrupted by a signal"
  show server
  show client
  show run
  verdict
}

trap cleanup EXIT
trap on_signal INT TERM HUP

# start ROLE SECS CMD: run CMD in the background in its own session.
start() {
  local role=$1 secs=$2 cmd=$3 first
  local -a env=() buf=()
  read -r first _ <<<"$cmd"
  if ! command -v -- "$first" >/dev/null 2>&1; then
    echo "$me: $role program not found: $first (run scripts/install-deps.sh?)" >"$tmp/$role.log"
    return 1
  fi
  [[ -n $libdir ]] && env=(env "LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
  ((use_stdbuf)) && buf=(stdbuf -oL -eL)
  echo "$me: $name: $role: ${libdir:+LD_LIBRARY_PATH=$libdir }$cmd (limit ${secs}s)"
  # The harness stops the program at its deadline (finish); timeout(1) is the
  # backstop should the harness itself be killed.
  setsid "${env[@]}" timeout -k "$grace" $((secs + 30)) "${buf[@]}" bash -c "exec $cmd" \
    </dev/null >"$tmp/$role.log" 2>&1 &
  pids[$role]=$!
  stop_at[$role]=$(($(now_ms) + secs * 1000))
}

# finish ROLE [expected]: wait for ROLE until its deadline and record its exit
# status in rc_ROLE (124 when the deadline passed). At the deadline, unless the
# timeout is expected (--run-for), first record where every program hangs.
finish() {
  local role=$1 expected=${2:-} pid=${pids[$1]:-} rc left timed_out=0
  [[ -n $pid ]] || return 0
  if alive "$pid"; then
    left=$((stop_at[$role] - $(now_ms)))
    ((left > 0)) || left=0
    printf -v left '%d.%03d' $((left / 1000)) $((left % 1000))
    sleep "$left" >/dev/null 2>&1 &
    sleeper=$!
    wait -n "$pid" "$sleeper" 2>/dev/null  # whichever ends first; no polling
    kill -KILL "$sleeper" 2>/dev/null
    wait "$sleeper" 2>/dev/null
    sleeper=""
    if alive "$pid"; then
      timed_out=1
      [[ -n $expected ]] || backtraces
      kill_role "$role"
    fi
  fi
  wait "$pid" 2>/dev/null  # no "Killed" job notice: judge() reports it
  rc=$?
  ((timed_out)) && rc=124
  unset "pids[$role]"
  printf -v "rc_$role" %d "$rc"
}

# backtraces: once per run, attach gdb (when installed) to every program still
# running and save all its threads' stacks in ROLE.bt, shown with the output.
backtraces() {
  local role pid prog
  ((want_backtraces && !backtraces_taken)) || return 0
  backtraces_taken=1
  command -v gdb >/dev/null || return 0
  for role in "${!pids[@]}"; do
    pid=${pids[$role]}
    alive "$pid" || continue
    # The program is the child of timeout(1), the session leader we started.
    for prog in $(pgrep -P "$pid" 2>/dev/null); do
      {
        echo "---- still running at the time limit: pid $prog, stacks of all threads ----"
        timeout 30 gdb -p "$prog" -batch -nx -ex 'set pagination off' \
          -ex 'thread apply all bt' </dev/null 2>&1 | grep -E '^(Thread|#|warning: process|ptrace)'
      } >>"$tmp/$role.bt"
    done
  done
}

describe_rc() {
  case $1 in
    0) echo "exit 0" ;;
    124) echo "timed out (limit reached)" ;;
    137) echo "killed with SIGKILL (did not stop after SIGTERM)" ;;
    126) echo "not executable (rc 126)" ;;
    127) echo "not found or failed to exec (rc 127)" ;;
    *) if (($1 > 128 && $1 <= 128 + 64)); then
         echo "killed by signal $(($1 - 128)) (SIG$(kill -l $(($1 - 128)) 2>/dev/null))"
       else
         echo "exit $1"
       fi ;;
  esac
}

listening() {
  [[ -n $(ss -ltnH "sport = :$port" 2>/dev/null) ]]
}
# The server is listening, or has exited (then there is no point in waiting).
# shellcheck disable=SC2317  # called through poll
server_settled() { listening || ! alive "${pids[server]}"; }

# ---- begin --udp (datagram servers: udpong; added with datagram rsockets) ----
# --port names a UDP port: the server is ready once a UDP socket is bound to
# it, and the port must be free of UDP sockets before the server starts.
if ((udp)); then
  # shellcheck disable=SC2317  # called through poll
  listening() { [[ -n $(ss -lunH "sport = :$port" 2>/dev/null) ]]; }
fi
# ---- end --udp ----

# ---- begin --ready-regex (see the option's block above) ----
if [[ -n $ready_regex ]]; then
  # shellcheck disable=SC2317  # called through poll
  listening() { [[ -f $tmp/server.log ]] && grep -E -q -- "$ready_regex" "$tmp/server.log"; }
fi
# ---- end --ready-regex ----

bad_line_re="symbol lookup error|no version information available|version \`[^']*' not found|undefined symbol:|ERROR: AddressSanitizer|ERROR: LeakSanitizer|WARNING: ThreadSanitizer|runtime error:"

# judge ROLE RC ALLOWED_RC EXPECTS...: check one program's status and output.
judge() {
  local role=$1 rc=$2 ok_rc=$3 re log=$tmp/$1.log
  shift 3
  if [[ ! -f $log ]]; then fail "$role did not run"; return; fi
  if [[ $rc != "$ok_rc" ]]; then
    if [[ $ok_rc == 124 && $rc == 0 ]]; then
      fail "$role exited by itself (exit 0) before --run-for ${run_for}s"
    else
      fail "$role: $(describe_rc "$rc")"
    fi
  fi
  if grep -E -q -- "$bad_line_re" "$log"; then
    fail "$role: loader/ABI/sanitizer error: $(grep -E -m1 -- "$bad_line_re" "$log")"
  fi
  for re in "$@"; do
    grep -E -q -- "$re" "$log" || fail "$role: output does not match /$re/"
  done
  for re in "${reject[@]}"; do
    if grep -E -q -- "$re" "$log"; then
      fail "$role: output matches rejected /$re/: $(grep -E -m1 -- "$re" "$log")"
    fi
  done
}

show() {
  local role=$1
  [[ -f $tmp/$role.log ]] || return 0
  sed "s/^/[$name $role] /" "$tmp/$role.log"
  [[ -f $tmp/$role.bt ]] && sed "s/^/[$name $role bt] /" "$tmp/$role.bt"
  return 0
}

if ! command -v setsid >/dev/null || ! command -v timeout >/dev/null; then
  echo "$me: $name: FAIL: setsid and timeout (util-linux, coreutils) are required"
  exit 1
fi
((use_stdbuf)) && ! command -v stdbuf >/dev/null && use_stdbuf=0

if [[ $mode == single ]]; then
  secs=$timeout
  ok_rc=0
  if [[ -n $run_for ]]; then secs=$run_for; ok_rc=124; fi
  rc_run=""
  if start run "$secs" "$run"; then
    finish run ${run_for:+expected}
  else
    rc_run=127
  fi
  show run
  judge run "$rc_run" "$ok_rc" "${expect_all[@]}"
else
  if ! command -v ss >/dev/null; then
    echo "$me: $name: FAIL: ss (iproute2) is required for readiness polling"
    exit 1
  fi
  # 1. The port must be free, or the client would talk to a stranger.
  if ! poll 5 not listening; then
    if ((udp)); then
      echo "$me: $name: FAIL: UDP port $port is already in use: $(ss -lunpH "sport = :$port" | head -1)"
    else
      echo "$me: $name: FAIL: TCP port $port is already in use: $(ss -ltnpH "sport = :$port" | head -1)"
    fi
    exit 1
  fi
  rc_server="" rc_client=""
  # 2-3. Server, then bounded readiness polling.
  if start server "$timeout" "$server"; then
    poll "$ready_timeout" server_settled
    if listening && alive "${pids[server]}"; then
      echo "$me: $name: server listening on port $port after $(($(now_ms) - t_start)) ms"
      # 4. Client.
      if start client "$timeout" "$client"; then
        finish client
      else
        rc_client=127
      fi
      # 5. A failed client leaves the server waiting: give it --grace seconds.
      if [[ $rc_client != 0 ]]; then
        poll "$grace" not alive "${pids[server]}"
        kill_role server
        finish server
      elif ((server_persists)); then
        # A server that serves forever must still be there; stopping it is ours.
        if alive "${pids[server]}"; then
          kill_role server
          finish server expected
          rc_server=0
        else
          finish server
          fail "server exited ($(describe_rc "$rc_server")) although --server-persists"
          rc_server=0  # reported above
        fi
      else
        finish server
      fi
    elif alive "${pids[server]}"; then
      fail "server is not listening on port $port after ${ready_timeout}s"
      kill_role server
      finish server
    else
      finish server
      fail "server exited ($(describe_rc "$rc_server")) before listening on port $port"
      rc_server=0  # reported above; don't report it twice
    fi
  else
    rc_server=127
  fi
  # 6. Report.
  show server
  show client
  judge server "$rc_server" 0 "${expect_all[@]}" "${expect_server[@]}"
  if [[ -f $tmp/client.log ]]; then
    judge client "$rc_client" 0 "${expect_all[@]}" "${expect_client[@]}"
  fi
fi

verdict
