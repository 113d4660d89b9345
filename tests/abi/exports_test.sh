#!/usr/bin/env bash
# Checks that our libibverbs.so.1 (or librdmacm.so.1) exports the same
# versioned interface as the rdma-core 44 one installed on the system.
#
#   exports_test.sh OUR_LIB SYSTEM_LIB
#
# Compared:
#   - SONAME: the system library's (libibverbs.so.1, librdmacm.so.1);
#   - version nodes (.gnu.version_d): every node of the system library must be
#     defined by ours, with the same parent; ours defines no extra node;
#   - exported symbols: the set of "name@@NODE" (default version) / "name@NODE"
#     (non-default) with the symbol type, and the size for data objects (a
#     program may copy-relocate them).
#
# Deliberately not required (filtered from the system side): the 33
# non-default "name@IBVERBS_1.0" compat variants, which take the pre-2006 1.0
# structs and no peer binds, and "ibv_register_driver@IBVERBS_1.1", the
# non-default stub of the pre-v34 provider registration. Should ours ever
# define some of them, they must at least be ones the system library has.
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 OUR_LIBIBVERBS SYSTEM_LIBIBVERBS" >&2
  exit 2
fi
ours=$1
system=$2
for lib in "$ours" "$system"; do
  if [[ ! -r $lib ]]; then
    echo "FAIL: cannot read $lib" >&2
    exit 1
  fi
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0

# One line per defined dynamic symbol, e.g.
#   ibv_alloc_pd@@IBVERBS_1.1 FUNC
#   verbs_allow_disassociate_destroy@@IBVERBS_PRIVATE_34 OBJECT size=1
# The ABS OBJECT entries that only name a version node are left out (nodes are
# compared separately), as are unversioned symbols, which the version script
# must not leave behind (reported below).
exports() {
  LC_ALL=C readelf --dyn-syms -W "$1" | awk '
    $1 ~ /^[0-9]+:$/ && $7 != "UND" && ($5 == "GLOBAL" || $5 == "WEAK") {
      name = $8
      if ($7 == "ABS" && name !~ /@/) next
      line = name " " $4
      if ($4 == "OBJECT" || $4 == "TLS") line = line " size=" $3
      print line
    }' | LC_ALL=C sort -u
}

# "NODE PARENT" per version definition (PARENT "-" for none), base entry excluded.
version_nodes() {
  LC_ALL=C readelf -V -W "$1" | awk '
    /^Version definition section/ { in_def = 1; next }
    /^Version (needs|symbols) section/ { in_def = 0 }
    !in_def { next }
    /Flags: BASE/ { next }
    / Name: / { if (node != "") print node, parent; node = $NF; parent = "-"; next }
    /Parent 1: / { parent = $NF }
    END { if (node != "") print node, parent }' | LC_ALL=C sort -u
}

# --- SONAME -------------------------------------------------------------------
soname_of() { LC_ALL=C readelf -d -W "$1" | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p'; }
# The system library's (libibverbs.so.1, or librdmacm.so.1 for that library's test).
want_soname=$(soname_of "$system")
soname=$(soname_of "$ours")
if [[ -z $want_soname || $soname != "$want_soname" ]]; then
  echo "FAIL: SONAME of $ours is '${soname}', expected '${want_soname:-libibverbs.so.1}'"
  failed=1
fi

# --- version nodes ------------------------------------------------------------
version_nodes "$system" >"$work/system.nodes"
version_nodes "$ours" >"$work/ours.nodes"
if [[ ! -s $work/system.nodes ]]; then
  echo "FAIL: no version definitions found in $system (is it the rdma-core library?)"
  failed=1
fi
if ! diff -u "$work/system.nodes" "$work/ours.nodes" >"$work/nodes.diff"; then
  echo "FAIL: version nodes differ ('-' system only, '+' ours only; format: NODE PARENT):"
  grep -E '^[-+][^-+]' "$work/nodes.diff" || true
  failed=1
fi

# --- exported symbols -----------------------------------------------------------
exports "$system" >"$work/system.all"
exports "$ours" >"$work/ours.all"

# The compat-only class: non-default @IBVERBS_1.0, and ibv_register_driver@IBVERBS_1.1.
compat_re='^[^@ ]+@IBVERBS_1\.0 |^ibv_register_driver@IBVERBS_1\.1 '
grep -Ev "$compat_re" "$work/system.all" >"$work/system.cmp" || true
grep -Ev "$compat_re" "$work/ours.all" >"$work/ours.cmp" || true
grep -E "$compat_re" "$work/system.all" >"$work/system.compat" || true
grep -E "$compat_re" "$work/ours.all" >"$work/ours.compat" || true

if ! diff -u "$work/system.cmp" "$work/ours.cmp" >"$work/syms.diff"; then
  echo "FAIL: exported symbols differ ('-' only in system library, '+' only in ours):"
  grep -E '^[-+][^-+]' "$work/syms.diff" || true
  failed=1
fi
extra_compat=$(LC_ALL=C comm -13 "$work/system.compat" "$work/ours.compat")
if [[ -n $extra_compat ]]; then
  echo "FAIL: compat (non-default) symbols in ours that the system library does not have:"
  printf '%s\n' "$extra_compat"
  failed=1
fi
unversioned=$(grep -v '@' "$work/ours.all" || true)
if [[ -n $unversioned ]]; then
  echo "FAIL: unversioned exports in ours (missing from the version script?):"
  printf '%s\n' "$unversioned"
  failed=1
fi

if [[ $failed -ne 0 ]]; then
  exit 1
fi
echo "OK: $(wc -l <"$work/ours.cmp") versioned exports, $(wc -l <"$work/ours.nodes") version nodes match" \
  "($(wc -l <"$work/system.compat") compat-only system symbols ignored, $(wc -l <"$work/ours.compat") provided)"
