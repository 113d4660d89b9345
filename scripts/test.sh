#!/usr/bin/env bash
# scripts/test.sh: softhca's whole test suite, as CI runs it (.ci/run).
#
#   scripts/test.sh [--skip-deps] [--only release,asan,tsan]
#
#   1. installs the Debian packages it needs (scripts/install-deps.sh);
#   2. release: Release build in build/, ctest with every label
#      (unit, abi, loopback, system, ...);
#   3. asan:    ASan+UBSan build in build-asan/, ctest -L 'unit|loopback|abi';
#   4. tsan:    TSan build in build-tsan/,      ctest -L 'unit|loopback|abi'.
#   The system label (unmodified peers such as perftest, which are not
#   sanitizer-built) runs on the Release build only.
#
# Every step runs even if an earlier one failed (except a failed package
# install); a summary follows, and the exit status is 1 if any step failed.
# A step whose ctest fails at most 3 tests reruns those once: a test that
# passes then is reported FLAKY, with its failure's output, and does not fail
# the step.
# Environment: SOFTHCA_JOBS (build jobs, default nproc), SOFTHCA_TEST_JOBS
# (ctest -j, default 2; tests on fixed TCP ports hold a RESOURCE_LOCK).
set -u -o pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root" || exit 1

skip_deps=0
only=release,asan,tsan
while (($#)); do
  case $1 in
    --skip-deps) skip_deps=1 ;;
    --only) only=${2:?--only needs a list}; shift ;;
    --only=*) only=${1#--only=} ;;
    -h|--help) sed -n '2,/^set -u/{/^set -u/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "test.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

test_jobs=${SOFTHCA_TEST_JOBS:-2}
max_reruns=3      # a step with at most this many failed tests reruns them once
sanitizer_labels='unit|loopback|abi'
logs=$(mktemp -d "${TMPDIR:-/tmp}/softhca-test.XXXXXX") || exit 1
trap 'rm -rf "$logs"' EXIT

summary=()        # one line per step
failed_steps=0
tests_passed=0
tests_failed=0
t_all=$SECONDS

banner() { printf '\n======== %s ========\n' "$*"; }

# step NAME CMD...: run one step, record PASS/FAIL and its duration.
step() {
  local name=$1 t0=$SECONDS rc
  shift
  banner "$name"
  "$@"
  rc=$?
  if ((rc == 0)); then
    summary+=("PASS  $name ($((SECONDS - t0))s)")
  else
    summary+=("FAIL  $name (exit $rc, $((SECONDS - t0))s)")
    failed_steps=$((failed_steps + 1))
  fi
  return "$rc"
}

# run_ctest DIR NAME [CTEST_ARGS...]: ctest in DIR; adds its counts to the totals.
run_ctest() {
  local dir=$1 name=$2 log=$logs/$2.log rc line total failed
  shift 2
  "${ctest_wrapper[@]}" ctest --test-dir "$dir" --output-on-failure -j "$test_jobs" \
    --no-tests=ignore "$@" 2>&1 | tee "$log"
  rc=$?
  line=$(grep -E '^[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -1)
  if [[ -n $line ]]; then
    failed=$(sed -E 's/.* ([0-9]+) tests? failed.*/\1/' <<<"$line")
    total=$(sed -E 's/.* out of ([0-9]+).*/\1/' <<<"$line")
    tests_passed=$((tests_passed + total - failed))
    tests_failed=$((tests_failed + failed))
  else
    summary+=("WARN  $name: ran no tests${*:+ (ctest $*)}")
  fi
  record_failures "$name" "$log"
  if ((rc != 0)) && [[ -n $line ]] && ((failed > 0 && failed <= max_reruns)); then
    rerun_failed "$dir" "$name" "$@" && { rc=0; tests_failed=$((tests_failed - failed)); tests_passed=$((tests_passed + failed)); }
  fi
  return "$rc"
}

# rerun_failed DIR NAME [CTEST_ARGS...]: runs the tests that just failed once
# more, one at a time. A test that passes then is reported as FLAKY (with its
# first failure's output, kept by record_failures) and does not fail the
# step; one that fails twice does. A few failures only: many at once are not
# flakes.
rerun_failed() {
  local dir=$1 name=$2 log=$logs/$2.rerun.log
  shift 2
  banner "$name: the failed tests once more"
  "${ctest_wrapper[@]}" ctest --test-dir "$dir" --output-on-failure -j 1 --rerun-failed "$@" 2>&1 | tee "$log"
  if ((PIPESTATUS[0] == 0)); then
    summary+=("FLAKY $name: failed once, passed when rerun (see its output below; fix it)")
    return 0
  fi
  return 1
}

# record_failures NAME LOG: name each failed test in the summary and keep the
# end of its output, so that the last lines CI shows say what broke.
record_failures() {
  local name=$1 log=$2 test
  while read -r test; do
    summary+=("      $name failed: $test")
    {
      printf -- '--- %s: %s (last lines of its output)\n' "$name" "$test"
      # The test's status line, then its output up to the next status line.
      awk -v t="$test" '
        $0 ~ /^ *[0-9]+\/[0-9]+ Test +#[0-9]+: / { inside = (index($0, " " t " ") > 0) }
        /^[0-9]+% tests passed/ { inside = 0 }
        inside' "$log" | tail -n 20
    } >>"$logs/failures"
  done < <(sed -n '/^The following tests FAILED:/,/^$/{s/^[[:space:]]*[0-9]* - \([^ ]*\) .*/\1/p}' "$log")
}

# variant NAME BUILD_DIR CMAKE_ARGS -- CTEST_ARGS: build, then test unless the build failed.
variant() {
  local name=$1 dir=$2
  shift 2
  local -a cmake_args=() ctest_args=()
  while (($#)) && [[ $1 != -- ]]; do cmake_args+=("$1"); shift; done
  (($#)) && shift
  ctest_args=("$@")
  if step "$name: build ($dir)" bash scripts/build.sh "$dir" "${cmake_args[@]}"; then
    step "$name: ctest${ctest_args[*]:+ ${ctest_args[*]}}" run_ctest "$dir" "$name" "${ctest_args[@]}"
  else
    summary+=("FAIL  $name: ctest not run (build failed)")
    failed_steps=$((failed_steps + 1))
  fi
}

wants() { [[ ,$only, == *,$1,* ]]; }

if ((!skip_deps)); then
  if ! step "install dependencies" bash scripts/install-deps.sh; then
    printf '%s\n' "${summary[@]}"
    echo "test.sh: cannot continue without the packages"
    exit 1
  fi
fi

ctest_wrapper=()   # prefix for ctest: sanitizer options, setarch
# Sanitizer builds compile at -O1 with line tables only (-g1): reports keep
# their file:line stacks, and the ASan+UBSan build takes about half the time
# of -O2 -g (measured on one of the largest test files: 82 s -> 35 s).
sanitizer_flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG")
if wants release; then
  variant release build -DCMAKE_BUILD_TYPE=Release
fi

if wants asan; then
  ctest_wrapper=(env
    "ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:check_initialization_order=1:strict_init_order=1}"
    "UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}")
  variant asan build-asan "${sanitizer_flags[@]}" -DSOFTHCA_SANITIZE=address \
    -- -L "$sanitizer_labels"
fi

if wants tsan; then
  ctest_wrapper=(env "TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}")
  # GCC 12's TSan cannot map its shadow memory under the high ASLR entropy of
  # some kernels ("unexpected memory mapping"): run the tests with ASLR off.
  if setarch "$(uname -m)" -R true 2>/dev/null; then
    ctest_wrapper+=(setarch "$(uname -m)" -R)
  fi
  variant tsan build-tsan "${sanitizer_flags[@]}" -DSOFTHCA_SANITIZE=thread \
    -- -L "$sanitizer_labels"
fi

banner summary
printf '%s\n' "${summary[@]}"
if [[ -s $logs/failures ]]; then
  head -n 60 "$logs/failures"
fi
echo "total time: $((SECONDS - t_all))s"
echo "tests: $tests_passed passed, $tests_failed failed"
if ((failed_steps > 0)); then
  echo "test.sh: FAILED ($failed_steps step(s))"
  exit 1
fi
echo "test.sh: all steps passed"
