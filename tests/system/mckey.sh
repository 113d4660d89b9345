#!/usr/bin/env bash
# mckey.sh HARNESS LIBDIR PORT NAME GROUP BIND [RECEIVER_QPS [SENDER_OPTION]]:
# rdma-core's mckey on softhca, a receiver (with RECEIVER_QPS joined QPs,
# default 1) and a sender (with SENDER_OPTION, e.g. -l) joined to GROUP from
# local address BIND, inside a network namespace created here that holds only
# lo (up, with the IPv4 multicast route on it), so that nothing can ever leave
# for a real network. softhca delivers the
# datagrams itself; the namespace only gives rdma_resolve_addr a route.
# Exits 77 (ctest SKIP_RETURN_CODE) when no namespace can be made: that needs
# root, or unprivileged user namespaces (`unshare --map-current-user`).
set -u -o pipefail
harness=$1 libdir=$2 port=$3 name=$4 group=$5 bind=$6 receivers=${7:-1} sender_option=${8:-}

if [[ ${MCKEY_IN_NETNS:-} != 1 ]]; then
  if [[ $(id -u) == 0 ]]; then
    ns=(unshare -n)
  else
    # A user namespace of our own, mapping us to ourselves (softhca's
    # per-user files stay ours) with the capabilities kept for `ip`.
    ns=(unshare -n --map-current-user --keep-caps)
  fi
  if ! "${ns[@]}" true 2>/dev/null; then
    echo "SKIP: mckey needs a network namespace of its own (root, or unprivileged user namespaces for unshare --map-current-user)"
    exit 77
  fi
  exec "${ns[@]}" env MCKEY_IN_NETNS=1 bash "${BASH_SOURCE[0]}" "$@"
fi

# In the new namespace: only lo exists.
ip link set lo up || exit 1
ip route add 224.0.0.0/4 dev lo || exit 1
if ip -o link show | grep -qv ': lo:'; then
  echo "mckey.sh: the namespace holds more than lo; refusing to run" >&2
  exit 1
fi

# The receiver announces its join only after posting its receives, and the
# sender waits 3 s after its own join before sending (mckey's pause for the
# SM), so readiness on "joined dgid" is enough; each receiver QP must then
# complete all 10 receives or mckey waits until the time limit.
exec bash "$harness" --name "$name" --timeout 30 --ready-timeout 20 --libdir "$libdir" --port "$port" \
  --ready-regex "mckey: joined dgid" \
  --server "mckey -m $group -b $bind -c $receivers -C 10" \
  --client "mckey -m $group -b $bind -s $sender_option -C 10" \
  --expect "mckey: joined dgid: " --expect "data transfers complete" --expect "return status 0" \
  --expect-server "receiving data transfers" --expect-client "initiating data transfers" \
  --reject "failure|failed|unable|mckey: event:"
