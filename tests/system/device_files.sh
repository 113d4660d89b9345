#!/usr/bin/env bash
# system.softhca_device_files: the device files of `softhca run` and
# `softhca shell` (tools/softhca/device_files.hpp, issue 13).
#
# usage: device_files.sh SOFTHCA_TOOL
#
# Checks, as root (a mount namespace) and, where setpriv can drop to nobody
# and nobody can reach the tool, unprivileged (a user namespace as well):
#   - inside: /dev/infiniband/uverbs0 and rdma_cm are character devices open
#     for reading and writing; every other entry of /dev and /sys/class is
#     still there, /dev/shm is the host's very file system (softhca's runtime
#     directory); /sys/class/infiniband/softhca0 holds what ibv_devinfo -v
#     reports (GUIDs, firmware, port state, link layer, every GID and its
#     type), the GID net devices, device/numa_node and local_cpus, and is read-only;
#   - outside, while a program runs inside and after it has ended: /dev,
#     /dev/infiniband, /sys/class, /sys/class/infiniband and the mounts on /dev
#     and /sys are exactly as before;
#   - where namespaces cannot be made (an unmapped user namespace): one
#     warning line and the program runs; --devices makes that exit 1;
#     --no-devices neither warns nor provides;
#   - softhca shell -c runs in the same setting.
# Every process is bounded by timeout(1); the one kept running while the host
# is inspected is stopped by its own PID.
set -uo pipefail

me=device_files
failures=0
pass() { echo "$me: ok: $*"; }
fail() { echo "$me: FAIL: $*"; failures=$((failures + 1)); }
check() {  # check DESCRIPTION CMD...
  local what=$1
  shift
  if "$@"; then pass "$what"; else fail "$what"; fi
}

# names DIR [EXCLUDED...]: the names of DIR's entries, sorted, less EXCLUDED.
names() {
  local dir=$1 name
  shift
  find "$dir" -mindepth 1 -maxdepth 1 -printf '%f\n' | while IFS= read -r name; do
    for excluded in "$@"; do [[ $name == "$excluded" ]] && continue 2; done
    echo "$name"
  done | sort
}

# ---- inside: run by `softhca run -- bash device_files.sh --inside EXPECTED_DIR` ----
if [[ ${1:-} == --inside ]]; then
  expected=$2
  bad=0
  in_fail() { echo "$me: inside: FAIL: $*"; bad=1; }
  for dev in uverbs0 rdma_cm; do
    f=/dev/infiniband/$dev
    if [[ -c $f && -r $f && -w $f ]] && : <>"$f"; then
      echo "$me: inside: $f is a character device, opened read-write"
    else
      in_fail "$f is not a character device open for read and write: $(ls -l "$f" 2>&1)"
    fi
  done
  # Everything else of /dev and /sys/class is still there.
  if ! difference=$(diff "$expected/dev.list" <(names /dev infiniband)); then
    in_fail "/dev differs from the host's: $(head -5 <<<"$difference")"
  fi
  if ! difference=$(diff "$expected/class.list" <(names /sys/class infiniband infiniband_verbs)); then
    in_fail "/sys/class differs from the host's: $(head -5 <<<"$difference")"
  fi
  [[ $(stat -c %d:%i /dev/shm) == "$(cat "$expected/shm.id")" ]] ||
    in_fail "/dev/shm is not the host's file system"
  [[ -e /dev/null && -d /dev/pts && -e /sys/class/net/lo ]] || in_fail "/dev/null, /dev/pts or /sys/class/net/lo missing"

  # The tree against what ibv_devinfo -v reports through our libibverbs.
  sys=/sys/class/infiniband/softhca0
  info=$(ibv_devinfo -v -d softhca0) || in_fail "ibv_devinfo failed"
  field() { sed -n "s/^[[:space:]]*$1:[[:space:]]*//p" <<<"$info" | head -1; }
  same() {  # same FILE VALUE
    local got
    got=$(cat "$sys/$1" 2>&1)
    if [[ $got == "$2" ]]; then echo "$me: inside: $1 = $got"; else in_fail "$1 is '$got', ibv_devinfo says '$2'"; fi
  }
  same node_guid "$(field node_guid)"
  same sys_image_guid "$(field sys_image_guid)"
  same fw_ver "$(field fw_ver)"
  same node_type "1: CA"
  [[ $(field state) == "PORT_ACTIVE (4)" ]] && same ports/1/state "4: ACTIVE"
  same ports/1/link_layer "$(field link_layer)"
  gids=0 localhost=
  while read -r index addr type; do
    exploded=$(python3 -c 'import ipaddress,sys; print(ipaddress.ip_address(sys.argv[1]).exploded)' "$addr")
    same "ports/1/gids/$index" "$exploded"
    case $type in
      "RoCE v2") same "ports/1/gid_attrs/types/$index" "RoCE v2" ;;
      *) same "ports/1/gid_attrs/types/$index" "IB/RoCE v1" ;;
    esac
    [[ -s $sys/ports/1/gid_attrs/ndevs/$index ]] || in_fail "no net device for GID $index"
    [[ $exploded == 0000:0000:0000:0000:0000:ffff:7f00:0001 ]] && localhost=$index
    gids=$((gids + 1))
  done < <(sed -n 's/^[[:space:]]*GID\[[[:space:]]*\([0-9]*\)\]:[[:space:]]*\([^,]*\), \(.*\)$/\1 \2 \3/p' <<<"$info")
  ((gids > 0)) || in_fail "ibv_devinfo -v listed no GID"
  # 127.0.0.1 is always in the table (after the interfaces' addresses), on lo.
  [[ -n ${localhost:-} ]] || in_fail "no ::ffff:127.0.0.1 among the GIDs"
  same "ports/1/gid_attrs/ndevs/${localhost:-0}" lo
  same device/numa_node -1
  grep -Eqx '[0-9a-f]+(,[0-9a-f]{8})*' "$sys/device/local_cpus" || in_fail "device/local_cpus: $(cat "$sys/device/local_cpus")"
  same "../../infiniband_verbs/uverbs0/ibdev" softhca0
  if touch "$sys/written" 2>/dev/null; then in_fail "the sysfs tree is writable"; fi
  ((bad == 0)) && echo "$me: inside: all checks passed ($gids GIDs)"
  exit "$bad"
fi

# ---- outside ------------------------------------------------------------------------
tool=${1:?usage: device_files.sh SOFTHCA_TOOL}
[[ -x $tool ]] || { echo "$me: FAIL: $tool is not executable"; exit 1; }
script=$(readlink -f "$0")
tmp=$(mktemp -d "${TMPDIR:-/tmp}/softhca-device-files.XXXXXX") || exit 1
chmod 755 "$tmp"
held=""  # the PID of the program kept running inside, stopped by cleanup
cleanup() {
  [[ -n $held ]] && kill -KILL "$held" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

# What the host shows of /dev and /sys, to compare before, during and after.
host_view() {
  echo "== /dev"; names /dev
  echo "== /dev/infiniband"; ls -lA /dev/infiniband 2>&1
  echo "== /sys/class"; names /sys/class
  echo "== /sys/class/infiniband"; ls -A /sys/class/infiniband 2>&1
  echo "== /sys/class/infiniband_verbs"; ls -A /sys/class/infiniband_verbs 2>&1
  echo "== mounts"; awk '$5 ~ "^/(dev|sys)(/|$)" { print $5, $9 }' /proc/self/mountinfo | sort
}
host_view >"$tmp/before"
names /dev infiniband >"$tmp/dev.list"
names /sys/class infiniband infiniband_verbs >"$tmp/class.list"
stat -c %d:%i /dev/shm >"$tmp/shm.id"

# inside AS_USER_PREFIX...: the checks inside `softhca run`, as root or as
# another user (setpriv ...), with softhca's files in a runtime directory of ours.
inside() {
  local label=$1
  shift
  "$@" timeout 60 "$tool" run -v --devices -- bash "$script" --inside "$tmp" >"$tmp/$label.log" 2>&1
  local rc=$?
  sed "s/^/[$label] /" "$tmp/$label.log"
  check "$label: inside checks (exit $rc)" test "$rc" -eq 0
}

# 1. As ourselves: as root a mount namespace alone, otherwise a user namespace too.
inside self env SOFTHCA_RUNTIME_DIR="$tmp/run-self"
if [[ $(id -u) == 0 ]]; then
  check "root: a private mount namespace (no user namespace)" grep -q "softhca run: private mount namespace:" "$tmp/self.log"
else
  check "$(id -un): private user and mount namespaces" \
    grep -q "softhca run: private user and mount namespaces:" "$tmp/self.log"
fi

# 2. Unprivileged: a user namespace maps us to ourselves.
if [[ $(id -u) == 0 ]] && command -v setpriv >/dev/null &&
   setpriv --reuid=65534 --regid=65534 --clear-groups test -x "$tool" -a -r "$script" 2>/dev/null; then
  mkdir -m 700 "$tmp/run-nobody" && chown 65534:65534 "$tmp/run-nobody"
  inside nobody env SOFTHCA_RUNTIME_DIR="$tmp/run-nobody" \
    setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all
  check "nobody: private user and mount namespaces" \
    grep -q "softhca run: private user and mount namespaces:" "$tmp/nobody.log"
elif [[ $(id -u) != 0 ]]; then
  pass "unprivileged already: the run above was the user-namespace case"
else
  echo "$me: note: nobody cannot reach $tool; the unprivileged case is not checked"
fi

# 3. While a program runs inside, the host sees nothing new.
setsid timeout 60 "$tool" run -- bash -c "test -c /dev/infiniband/uverbs0 && echo ready >'$tmp/ready'; exec sleep 60" \
  </dev/null >"$tmp/held.log" 2>&1 &
held=$!
for ((i = 0; i < 200; i++)); do  # up to 10 s, in 50 ms steps
  [[ -s $tmp/ready ]] && break
  kill -0 "$held" 2>/dev/null || break
  sleep 0.05
done
check "a program inside is up with its device files" test -s "$tmp/ready"
host_view >"$tmp/during"
check "host view unchanged while it runs" diff "$tmp/before" "$tmp/during"
kill -TERM "$held" 2>/dev/null
wait "$held" 2>/dev/null
held=""

# 4. Namespaces impossible: in a user namespace where our uid is not mapped
# we hold no capability and may not create a nested user namespace.
if unshare --user true 2>/dev/null; then
  timeout 30 unshare --user "$tool" run -- sh -c 'echo ran; test -e /dev/infiniband/uverbs0 || echo no-device' \
    >"$tmp/unmapped.log" 2>&1
  rc=$?
  sed 's/^/[unmapped] /' "$tmp/unmapped.log"
  out=$(<"$tmp/unmapped.log")
  check "unmapped: the program ran (exit $rc)" test "$rc" -eq 0
  check "unmapped: exactly one warning line" test "$(grep -c 'warning: ' <<<"$out")" -eq 1
  check "unmapped: the warning says why and what" \
    grep -Eq '^softhca run: warning: no private /dev/infiniband and /sys/class/infiniband \(.+\); stacks that probe them \(UCX, Open MPI\) will not see softhca0; running anyway$' <<<"$out"
  check "unmapped: no device files" grep -qx no-device <<<"$out"
  out=$(timeout 30 unshare --user "$tool" run --devices -- echo ran 2>&1)
  rc=$?
  check "unmapped: --devices fails with exit 1 ($rc)" test "$rc" -eq 1
  check "unmapped: --devices did not run the program" test "$(grep -c '^ran$' <<<"$out")" -eq 0
  check "unmapped: --devices says why" grep -q "softhca run: cannot provide the device files: " <<<"$out"
else
  echo "$me: note: unshare --user is not possible here; the warning case is not checked"
fi

# 5. --no-devices: LD_LIBRARY_PATH alone, no namespace, no warning.
out=$(timeout 30 "$tool" run --no-devices -- sh -c 'readlink /proc/self/ns/mnt' 2>&1)
check "--no-devices: the host's mount namespace, no warning" test "$out" == "$(readlink /proc/self/ns/mnt)"

# 6. softhca shell -c: the same setting.
# shellcheck disable=SC2016  # expanded by the shell inside
out=$(SHELL=/bin/bash timeout 30 "$tool" shell -c \
  'test -c /dev/infiniband/uverbs0 && cat /sys/class/infiniband/softhca0/ports/1/state && echo "$LD_LIBRARY_PATH"' 2>&1)
check "shell -c: device files and state ($out)" grep -qx "4: ACTIVE" <<<"$out"
check "shell -c: LD_LIBRARY_PATH has softhca's lib directory" grep -q "/lib" <<<"$out"
out=$(timeout 30 "$tool" shell -c 'exit 7' 2>&1)
rc=$?
check "shell -c: the shell's exit status ($rc)" test "$rc" -eq 7

# 7. And afterwards the host is as before.
host_view >"$tmp/after"
check "host view unchanged afterwards" diff "$tmp/before" "$tmp/after"

if ((failures > 0)); then
  echo "$me: FAIL ($failures checks failed)"
  exit 1
fi
echo "$me: PASS"
