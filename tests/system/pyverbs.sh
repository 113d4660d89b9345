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
shift
src=/usr/share/doc/rdma-core/tests
[[ -d $src ]] || { echo "pyverbs.sh: $src missing (apt-get install python3-pyverbs)"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/softhca-pyverbs.XXXXXX")
trap 'rm -rf "$work"' EXIT
cp -r "$src" "$work/tests"
gunzip -f "$work"/tests/*.gz
cd "$work"
# Debian's python3 (pyverbs is built for it), not a python from PATH.
status=0
LD_LIBRARY_PATH=$libdir timeout 600 /usr/bin/python3 tests/run_tests.py -v "$@" >"$work/log" 2>&1 || status=$?
grep -E '\.\.\. (ERROR|FAIL)|^(ERROR|FAIL):' "$work/log" || true
tail -n 3 "$work/log"
summary=$(grep -E '^Ran [0-9]+ tests' "$work/log" || true)
if [[ $status -ne 0 || -z $summary ]] || ! tail -n 1 "$work/log" | grep -q '^OK'; then
  echo "pyverbs.sh: the suite did not pass (exit $status); full log follows" >&2
  cat "$work/log" >&2
  exit 1
fi
echo "pyverbs.sh: $summary, $(grep -cE '\.\.\. ok$' "$work/log") passed, all others skipped"
