#!/usr/bin/env bash
# Checks that every SOFTHCA_* setting the code reads is in the one table
# (src/common/settings.hpp) and that `softhca info` shows it as the libraries
# would read it.
#
#   settings_test.sh SOFTHCA_TOOL SOURCE_DIR
#
# Checked:
#   - every SOFTHCA_ name the sources of src/, abi/ and tools/ read from the
#     environment is listed by `softhca info -c`. A name counts as read when
#     it appears in a getenv call, or as a whole string literal ("SOFTHCA_X",
#     which is how the settings table names its rows and how a direct getenv
#     would name it);
#   - README.md's Settings table has a row for every setting listed;
#   - no code but src/common/settings.cpp calls getenv with a SOFTHCA_ name
#     (settings.cpp itself passes the table's names, never a literal);
#   - `softhca info -c` shows "(default)" for an unset setting, the value of
#     one set in the environment, and flags a value the libraries ignore;
#     -c and --config print the same; a bad option is a usage error (2);
#   - `softhca info` reports the runtime directory of SOFTHCA_RUNTIME_DIR
#     without creating it, as usable once it exists, and fails (1) when it
#     cannot be used.
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 SOFTHCA_TOOL SOURCE_DIR" >&2
  exit 2
fi
tool=$1
src=$2
status=0
fail() {
  echo "FAIL: $*" >&2
  status=1
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The tool runs with none of the caller's SOFTHCA_ variables, so that
# "(default)" does not depend on who runs the test.
clean=(env)
while IFS= read -r name; do
  clean+=(-u "$name")
done < <(compgen -e | grep '^SOFTHCA_' || true)
info() { "${clean[@]}" "$@" "$tool" info "${info_args[@]}"; }

# ---- every name read is listed -----------------------------------------------
sources=$(find "$src/src" "$src/abi" "$src/tools" -type f \( -name '*.cpp' -o -name '*.hpp' -o -name '*.h' \))
read_names=$( (
  # getenv("SOFTHCA_X"), secure_getenv("SOFTHCA_X"), also across a line break.
  grep -hozP 'getenv\s*\(\s*"\KSOFTHCA_[A-Z0-9_]+(?=")' $sources | tr '\0' '\n'
  grep -ohE '"SOFTHCA_[A-Z0-9_]+"' $sources | tr -d '"'
) | sort -u)
if ! grep -qx SOFTHCA_LOG <<<"$read_names"; then
  fail "found no SOFTHCA_LOG in the sources under $src: the scan is broken"
fi

info_args=(-c)
listed=$(info)
for name in $read_names; do
  if ! grep -qE "^$name +\(default\) " <<<"$listed"; then
    fail "$name is read by the code but 'softhca info -c' does not list it (add it to src/common/settings.hpp)"
  fi
done

# The README's table lists what the tool lists.
for name in $(grep -oE '^SOFTHCA_[A-Z0-9_]+' <<<"$listed"); do
  grep -qE "^\| \`$name\` \|" "$src/README.md" || fail "$name is not in README.md's Settings table"
done

# Files that call getenv with a SOFTHCA_ literal (across line breaks too).
direct=$(grep -lzP 'getenv\s*\(\s*"SOFTHCA_' $sources | grep -v '/src/common/settings\.cpp$' || true)
if [[ -n $direct ]]; then
  fail "these read SOFTHCA_ settings around src/common/settings (use setting_text or setting_number):"$'\n'"$direct"
fi

# ---- values from the environment -------------------------------------------
listed=$(info SOFTHCA_CM_MAX_RETRIES=7 SOFTHCA_LOG_FILE="$work/log")
grep -qE '^SOFTHCA_CM_MAX_RETRIES +7 +15 +0\.\.15$' <<<"$listed" ||
  fail "SOFTHCA_CM_MAX_RETRIES=7 is not shown as value 7, default 15:"$'\n'"$listed"
grep -qE "^SOFTHCA_LOG_FILE +$work/log +stderr +a path\$" <<<"$listed" ||
  fail "SOFTHCA_LOG_FILE is not shown with its value:"$'\n'"$listed"
grep -qE '^SOFTHCA_LOG +\(default\) +warn ' <<<"$listed" ||
  fail "SOFTHCA_LOG (unset) is not shown as (default):"$'\n'"$listed"
[[ ! -e $work/log ]] || fail "softhca info -c created the log file"

# A value the libraries ignore is shown with the reason, right below its setting.
listed=$(info SOFTHCA_CM_MAX_RETRIES=16)
grep -A1 -E '^SOFTHCA_CM_MAX_RETRIES +16 ' <<<"$listed" | grep -qF 'ignored (want 0..15)' ||
  fail "SOFTHCA_CM_MAX_RETRIES=16 is not flagged as ignored:"$'\n'"$listed"

info_args=(--config)
[[ $(info SOFTHCA_LOG=debug) == "$(info_args=(-c) && info SOFTHCA_LOG=debug)" ]] ||
  fail "--config and -c print different things"

# ---- usage errors -------------------------------------------------------------
for bad in -x --conf extra; do
  set +e
  err=$("${clean[@]}" "$tool" info "$bad" 2>&1 >/dev/null)
  rc=$?
  set -e
  [[ $rc -eq 2 ]] || fail "softhca info $bad exited $rc, not 2"
  grep -qF "'$bad'" <<<"$err" || fail "softhca info $bad: the message does not name it: $err"
done
"${clean[@]}" "$tool" help info | grep -q '^usage: softhca info' || fail "softhca help info prints no usage"

# ---- softhca info: the runtime directory --------------------------------------
info_args=()
rt=$work/runtime
out=$(info SOFTHCA_RUNTIME_DIR="$rt") || fail "softhca info failed with a creatable SOFTHCA_RUNTIME_DIR:"$'\n'"$out"
grep -qxF "runtime directory  $rt (not there yet; created at first use)" <<<"$out" ||
  fail "softhca info does not report $rt as to be created:"$'\n'"$out"
[[ ! -e $rt ]] || fail "softhca info created $rt"
grep -qxF "settings           SOFTHCA_RUNTIME_DIR $rt" <<<"$out" ||
  fail "softhca info does not list SOFTHCA_RUNTIME_DIR as set:"$'\n'"$out"

mkdir -m 0700 "$rt"
out=$(info SOFTHCA_RUNTIME_DIR="$rt") || fail "softhca info failed with a usable SOFTHCA_RUNTIME_DIR"
grep -qxF "runtime directory  $rt (usable)" <<<"$out" || fail "$rt is not reported usable:"$'\n'"$out"

set +e
out=$(info SOFTHCA_RUNTIME_DIR=/dev/null)
rc=$?
set -e
[[ $rc -eq 1 ]] || fail "softhca info exited $rc with SOFTHCA_RUNTIME_DIR=/dev/null, not 1"
grep -qxF "runtime directory  /dev/null (unusable: is not a directory)" <<<"$out" ||
  fail "/dev/null is not reported unusable:"$'\n'"$out"

if [[ $status -eq 0 ]]; then
  echo "PASS: $(wc -w <<<"$read_names") settings read by the code, all listed by softhca info -c"
fi
exit $status
