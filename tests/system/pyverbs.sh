#!/usr/bin/env bash
# rdma-core's own Python test suite (python3-pyverbs ships it as documentation)
# against softhca: every test must pass or skip; errors and failures fail.
#
#   tests/system/pyverbs.sh LIBDIR [unittest names...]
#
# The suite runs client and server in one process, so it exercises two
# contexts of one device, the one-process shm path and the extended verbs.
set -euo pipefail
libdir=${1:?usage: pyverbs.sh LIBDIR [tests...]}
libdir=$(cd "$libdir" && pwd)  # the suite runs from a scratch directory
shift
src=/usr/share/doc/rdma-core/tests
[[ -d $src ]] || { echo "pyverbs.sh: $src missing (apt-get install python3-pyverbs)"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/softhca-pyverbs.XXXXXX")
trap 'rm -rf "$work"' EXIT
cp -r "$src" "$work/tests"
gunzip -f "$work"/tests/*.gz
cd "$work"

# rdma-core's RDMACMBaseTest takes its IP address from the first name listed
# in /sys/class/infiniband/<dev>/device/net/ (then asks `ip -j addr show` for
# that interface's first address); without it every test_rdmacm test skips.
# softhca has no kernel device, so the suite runs in a private mount namespace
# in which /sys/class is a tmpfs holding bind mounts of every real class
# directory plus a fake infiniband/softhca0/device/net/<if> naming the
# interface that carries 127.0.0.1. The namespace, and with it every mount,
# goes away with the last process in it; the host's /sys is never touched.
# Root does this directly, other users through a user namespace; if neither
# works the suite runs as before and the rdmacm tests skip.
sysclass_setup='
set -eu
orig=$1; netif=$2; shift 2
mount --bind /sys/class "$orig"             # the real classes, kept reachable
mount -t tmpfs -o mode=0755,size=1m softhca-sysclass /sys/class
for e in "$orig"/*; do
  n=${e##*/}
  [ "$n" = infiniband ] && continue          # a real one: ours replaces it
  if [ -L "$e" ]; then cp -P "$e" "/sys/class/$n"
  else mkdir "/sys/class/$n"; mount --bind "$e" "/sys/class/$n"; fi
done
mkdir -p "/sys/class/infiniband/softhca0/device/net/$netif"
umount "$orig"
exec "$@"
'
netif=$(ip -o -4 addr show to 127.0.0.1 2>/dev/null | awk '{print $2; exit}') || true
netif=${netif:-lo}
mkdir "$work/sysclass"
if [[ $EUID -eq 0 ]]; then
  ns=(unshare --mount --propagation private)
  back=()
else
  # Mount as root of a user namespace, then run the suite in a nested one
  # that maps the caller's ids back: softhca keys its shared state by uid.
  ns=(unshare --map-root-user --mount --propagation private)
  back=(unshare --map-user="$(id -u)" --map-group="$(id -g)")
fi
if "${ns[@]}" sh -c "$sysclass_setup" sh "$work/sysclass" "$netif" "${back[@]}" \
     sh -c '[ -d /sys/class/infiniband/softhca0/device/net ] && [ -d /sys/class/net ]' 2>"$work/ns.err"; then
  echo "pyverbs.sh: private mount namespace: /sys/class/infiniband/softhca0/device/net/$netif"
  run=("${ns[@]}" sh -c "$sysclass_setup" sh "$work/sysclass" "$netif" "${back[@]}")
else
  echo "pyverbs.sh: no private mount namespace ($(tr '\n' ' ' <"$work/ns.err")); rdmacm tests will skip"
  run=()
fi

# The huge-page tests (ODP and parent domain with MAP_HUGETLB buffers) skip
# unless 2 MiB pages are reserved. As root, with none reserved, reserve 32
# (64 MiB) for the run and give them back after; a host that has some keeps
# its setting. SOFTHCA_PYVERBS_HUGEPAGES=0 leaves the host alone.
huge=/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages
if [[ $EUID -eq 0 && -w $huge && ${SOFTHCA_PYVERBS_HUGEPAGES:-32} -gt 0 && $(cat "$huge") -eq 0 ]]; then
  if echo "${SOFTHCA_PYVERBS_HUGEPAGES:-32}" >"$huge" 2>/dev/null; then
    trap 'echo 0 >"$huge"; rm -rf "$work"' EXIT
    echo "pyverbs.sh: reserved $(cat "$huge") huge pages of 2 MiB for the run"
  fi
fi

# softhca's own messages go to a file of their own: a warning from a test's
# child process (rdmacm peers are forked and leave with os._exit, so one may
# die holding a shared lock that the next user recovers) would otherwise land
# in the middle of unittest's "name ... ok" lines.
# Debian's python3 (pyverbs is built for it), not a python from PATH.
status=0
LD_LIBRARY_PATH=$libdir SOFTHCA_LOG_FILE=$work/softhca.log \
  timeout 600 "${run[@]}" /usr/bin/python3 tests/run_tests.py -v "$@" >"$work/log" 2>&1 || status=$?
grep -E '\.\.\. (ERROR|FAIL)|^(ERROR|FAIL):' "$work/log" || true
tail -n 3 "$work/log"
if [[ -s $work/softhca.log ]]; then
  echo "pyverbs.sh: softhca logged $(wc -l <"$work/softhca.log") line(s):"
  head -n 20 "$work/softhca.log"
fi
summary=$(grep -E '^Ran [0-9]+ tests' "$work/log" || true)
if [[ $status -ne 0 || -z $summary ]] || ! tail -n 1 "$work/log" | grep -q '^OK'; then
  echo "pyverbs.sh: the suite did not pass (exit $status); full log follows" >&2
  cat "$work/log" >&2
  exit 1
fi
# Every skip with its reason: what softhca (or this machine) does not offer yet.
grep -E '\.\.\. skipped' "$work/log" | sed 's/^/pyverbs.sh: skip: /' || true
echo "pyverbs.sh: $summary, $(grep -cE '\.\.\. ok$' "$work/log") passed, all others skipped"
