#!/usr/bin/env bash
# ns_rsh.sh: Open MPI's remote shell (--mca plm_rsh_agent) for hosts that
# are network namespaces of this machine, so that mpirun starts its remote
# daemon (orted) without ssh.
#
#   ns_rsh.sh HOST COMMAND...
#
# Open MPI calls the agent as it calls ssh: the host name, then the command
# line of the daemon as words for a POSIX shell. SOFTHCA_NS_HOSTS maps host
# names to the namespace and runtime directory of each host:
# "NAME=NETNS:RUNDIR NAME=NETNS:RUNDIR ...". The command runs in NETNS, in
# a mount namespace of its own with an empty /dev/shm and a UTS namespace
# whose host name is NAME (the daemon reports it back to mpirun, which
# must see two different nodes), with SOFTHCA_RUNTIME_DIR=RUNDIR, inside
# `softhca run --devices` (SOFTHCA_TOOL) so that UCX in the ranks the
# daemon starts sees softhca0. It is started by mpirun, which waits for it
# and signals it; no process of its own outlives it (exec all the way).
set -u -o pipefail

host=${1:?usage: ns_rsh.sh HOST COMMAND...}
shift
tool=${SOFTHCA_TOOL:?ns_rsh.sh: SOFTHCA_TOOL unset}
entry=""
for e in ${SOFTHCA_NS_HOSTS:?ns_rsh.sh: SOFTHCA_NS_HOSTS unset}; do
  [[ ${e%%=*} == "$host" ]] && entry=${e#*=}
done
[[ -n $entry ]] || { echo "ns_rsh.sh: unknown host $host (SOFTHCA_NS_HOSTS: $SOFTHCA_NS_HOSTS)" >&2; exit 255; }
netns=${entry%%:*} rundir=${entry#*:}
# What ssh would hand to the remote login shell: the words joined by spaces.
exec ip netns exec "$netns" unshare -m -u --propagation private \
  sh -c 'mount -t tmpfs -o mode=1777 tmpfs /dev/shm && hostname "$1" && shift &&
         exec env SOFTHCA_RUNTIME_DIR="$1" "$2" run --devices -- sh -c "$3"' \
  ns_rsh "$host" "$rundir" "$tool" "$*"
