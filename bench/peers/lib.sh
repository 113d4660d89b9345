# bench/peers/lib.sh: shell helpers the peer benchmarks source.

# wait_listen PORT PID: until a TCP socket listens on PORT (the perftest or
# ucx_perftest server is up), or PID died; bounded to 10 s.
wait_listen() {
  local i
  for ((i = 0; i < 200; i++)); do
    ss -ltnH "sport = :$1" | grep -q . && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}
