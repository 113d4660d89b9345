#!/usr/bin/env bash
# system.mpi.ping_allreduce.<tls>: Open MPI's ucx pml on softhca (issue 13).
#
# usage: mpi_ucx.sh HARNESS SOFTHCA_TOOL MPIRUN PROGRAM TLS
#
# Runs `mpirun -np 2 PROGRAM` (tests/system/mpi/ping_allreduce.c: a
# byte-checked ping-pong over 8 sizes and a checked MPI_Allreduce) inside
# `softhca run --devices`, through harness.sh (bounded, its own processes
# only), with the ucx pml forced (--mca pml ucx: MPI_Init fails if UCX
# cannot start) and the byte transfer layers that could bypass it excluded
# (vader, tcp, openib), UCX limited to TLS (rc_v or ud_v) on softhca0:1.
# That the traffic went through softhca is checked twice: Open MPI's ucx
# layer names the transport it found on softhca0 (pml_ucx_verbose 2: "rc_verbs/
# softhca0:1: matched transport list"), and `softhca stat --port`, in a
# runtime directory of this test alone, counts at least one SEND per message.
set -uo pipefail

harness=${1:?usage: mpi_ucx.sh HARNESS SOFTHCA_TOOL MPIRUN PROGRAM TLS}
tool=${2:?}
mpirun=${3:?}
program=${4:?}
tls=${5:?}
name=mpi.ping_allreduce.$tls
case $tls in
  rc_v) transport=rc_verbs ;;
  ud_v) transport=ud_verbs ;;
  *) echo "mpi_ucx.sh: TLS must be rc_v or ud_v"; exit 2 ;;
esac
messages=160  # 8 sizes x 10 rounds x ping and pong

tmp=$(mktemp -d "${TMPDIR:-/tmp}/softhca-mpi.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
# A runtime directory of our own: its port counters count this run alone.
export SOFTHCA_RUNTIME_DIR=$tmp/run

bash "$harness" --name "$name" --timeout 90 \
  --run "env UCX_TLS=$tls UCX_NET_DEVICES=softhca0:1 $tool run --devices -- $mpirun --allow-run-as-root --oversubscribe -np 2 --mca pml ucx --mca btl ^vader,tcp,openib --mca pml_ucx_verbose 2 -x UCX_TLS -x UCX_NET_DEVICES $program" \
  --expect "^ping_allreduce: ranks 2, 8 sizes, $messages messages, [0-9]+ bytes checked, allreduce ok$" \
  --expect "$transport/softhca0:1: matched transport list" \
  --reject "softhca run: warning" --reject "UCX  ERROR"
rc=$?

"$tool" stat --port >"$tmp/stat" 2>&1
sed "s/^/[$name stat] /" "$tmp/stat"
sends=$(awk '$1 == "rdma_sends" { print $2 }' "$tmp/stat")
if [[ ${sends:-0} -ge $messages ]]; then
  echo "mpi_ucx.sh: $name: softhca counted $sends SENDs for $messages messages"
else
  echo "mpi_ucx.sh: $name: FAIL: softhca counted ${sends:-no} SENDs, expected at least $messages"
  rc=1
fi
exit "$rc"
