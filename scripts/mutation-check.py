#!/usr/bin/env python3
"""scripts/mutation-check.py: do the tests notice a broken rule?

    scripts/mutation-check.py [--list] [--build DIR] [NAME...]

Plants small deliberate bugs in the key, retry, flush, queue, fence and CM
rules and in what the udp link takes from the network (source address,
P_Key, selective keeping, random keys and QPNs), one at a time, rebuilds, and runs the unit, abi and
loopback tests. A mutation that the suite does not catch (every test still
passes) is a hole in the tests: the script names it and exits 1. Each source
file is restored after its mutation, also on Ctrl-C.

  --list       print the mutations and exit
  --build DIR  build directory (default build-mutation/, Release)
  NAME...      run only these mutations (default: all)

About a minute per mutation on two cores: run it by hand after changing a
rule or its tests, not in CI.
"""
import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (name, file, exact text, replacement): the text must occur exactly once.
MUTATIONS = [
    # The key checks every path asks (transport/memory_key.hpp).
    ("key-range-one-past", "src/transport/memory_key.hpp",
     "addr + length <= mr.iova + mr.length;", "addr + length <= mr.iova + mr.length + 1;"),
    ("key-range-before-start", "src/transport/memory_key.hpp",
     "addr >= mr.iova && addr + length >= addr", "addr + 1 >= mr.iova && addr + length >= addr"),
    ("key-access-flags-ignored", "src/transport/memory_key.hpp",
     "(mr.access & access) == access && addr >= mr.iova", "addr >= mr.iova"),
    ("key-other-pd", "src/transport/memory_key.hpp",
     "return mr.pd_id == pd_id && (mr.access & access)", "return (mr.access & access)"),
    ("local-key-may-be-a-window", "src/transport/memory_key.hpp",
     "return mr.kind == KeyKind::kRegion && key_allows(", "return key_allows("),
    ("window2-of-another-qp", "src/transport/memory_key.hpp",
     "if (mr.kind == KeyKind::kWindow2 && mr.qpn != qpn) return false;", ""),
    ("rnr-gives-up-one-early", "src/transport/retry_policy.hpp",
     "if (rnr_left == 0) return RetryVerdict::kGiveUp;", "if (rnr_left <= 1) return RetryVerdict::kGiveUp;"),
    ("transport-retry-one-early", "src/transport/retry_policy.hpp",
     "if (retry_left == 0) return RetryVerdict::kGiveUp;", "if (retry_left <= 1) return RetryVerdict::kGiveUp;"),
    ("flush-reports-success", "src/engine/qp/queue_pair.cpp",
     "finish_send_locked(*sq_slot(sq_tail_.load(std::memory_order_relaxed)), IBV_WC_WR_FLUSH_ERR);",
     "finish_send_locked(*sq_slot(sq_tail_.load(std::memory_order_relaxed)), IBV_WC_REM_ABORT_ERR);"),
    ("receive-flush-skipped", "src/engine/qp/queue_pair.cpp",
     "  while (rq_->take(wqe, nullptr)) {", "  while (false && rq_->take(wqe, nullptr)) {"),
    ("send-queue-one-too-deep", "src/engine/qp/queue_pair.cpp",
     ">= init_.max_send_wr) {", "> init_.max_send_wr) {"),
    ("backlog-wrong-reason", "src/cm/service_passive.cpp",
     "? RejReason::kNoResources", "? RejReason::kTimeout"),
    ("dereg-without-fence", "src/engine/memory_region.cpp",
     "  node.registry().fence_accesses(node.proc());\n  if (shared_) host::MemoryBacking::process().unshare(*shared_);",
     "  if (shared_) host::MemoryBacking::process().unshare(*shared_);"),
    ("stale-qpn-accepted", "src/link/shm/shm_link.cpp",
     "} else if (target_.incarnation != peer_incarnation_) {",
     "} else if (false && target_.incarnation != peer_incarnation_) {"),
    ("cq-one-slot-short", "src/engine/queue_sizes.cpp",
     "const uint32_t slots = std::bit_ceil(cqe + 1);", "const uint32_t slots = std::bit_ceil(cqe);"),
    # What the udp link takes from the network (issue #40).
    ("source-address-unchecked", "src/link/udp/udp_link.cpp",
     "if (!transport::from_peer(from.src, from.dst,", "if (false && !transport::from_peer(from.src, from.dst,"),
    ("destination-address-unchecked", "src/transport/admission.hpp",
     "std::memcmp(dst.data(), own, 16) == 0", "std::memcmp(dst.data(), own, 0) == 0"),
    ("pkey-unchecked", "src/link/udp/udp_link.cpp",
     "if (!transport::pkey_matches(", "if (false && !transport::pkey_matches("),
    ("pkey-limited-members-match", "src/transport/admission.hpp",
     "((packet | entry) & kPkeyFullMember) != 0", "true"),
    ("selective-from-any-psn", "src/transport/responder_flow.cpp",
     "if (d == 0 && config_.selective", "if (config_.selective"),
    ("key-byte-fixed", "src/host/host_registry.cpp",
     "const uint32_t tag = static_cast<uint32_t>(random >> 40) % 0xFF + 1;", "const uint32_t tag = 1;"),
    ("qpn-page-fixed", "src/host/host_registry.cpp",
     "const uint32_t page = static_cast<uint32_t>(random >> 32) % kQpnPages;", "const uint32_t page = 0;"),
]


def run(cmd, **kw):
    return subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--list", action="store_true", help="print the mutations and exit")
    parser.add_argument("--build", default="build-mutation", help="build directory (default build-mutation/)")
    parser.add_argument("names", nargs="*", help="mutations to run (default: all)")
    args = parser.parse_args()
    if args.list:
        for name, path, _, _ in MUTATIONS:
            print(f"{name:30} {path}")
        return 0
    unknown = set(args.names) - {m[0] for m in MUTATIONS}
    if unknown:
        print(f"mutation-check: unknown mutation(s): {', '.join(sorted(unknown))} (see --list)", file=sys.stderr)
        return 2
    jobs = os.environ.get("SOFTHCA_JOBS", str(os.cpu_count() or 2))
    test_jobs = os.environ.get("SOFTHCA_TEST_JOBS", "2")
    print(f"mutation-check: building {args.build}", flush=True)
    if run(["bash", "scripts/build.sh", args.build, "-DCMAKE_BUILD_TYPE=Release"]).returncode != 0:
        print("mutation-check: the unmutated build fails", file=sys.stderr)
        return 1
    # A suite that fails without any mutation would "catch" every one of them.
    print("mutation-check: the unmutated suite first", flush=True)
    baseline = run(["ctest", "--test-dir", args.build, "-L", "unit|abi|loopback", "-j", test_jobs])
    if baseline.returncode != 0:
        print(baseline.stdout[-3000:])
        print("mutation-check: the tests fail without any mutation; fix them first", file=sys.stderr)
        return 1
    caught, survived = [], []
    for name, path, text, repl in MUTATIONS:
        if args.names and name not in args.names:
            continue
        full = os.path.join(ROOT, path)
        original = open(full).read()
        if original.count(text) != 1:
            print(f"mutation-check: {name}: expected its text once in {path}, found {original.count(text)}"
                  " (the code changed: update the mutation)", file=sys.stderr)
            return 2
        try:
            open(full, "w").write(original.replace(text, repl))
            print(f"mutation {name:30} ", end="", flush=True)
            if run(["cmake", "--build", args.build, "-j", jobs]).returncode != 0:
                print("does not compile (fix the mutation)")
                return 2
            tests = run(["ctest", "--test-dir", args.build, "-L", "unit|abi|loopback", "-j", test_jobs])
            failing = [line.split(" - ", 1)[1].split(" (")[0].split("  #")[0] for line in tests.stdout.splitlines()
                       if " - " in line and line.strip()[:1].isdigit() and "(" in line]
            if tests.returncode == 0:
                print("SURVIVED: no test failed")
                survived.append(name)
            else:
                print(f"caught by {len(failing)} test(s), e.g. {failing[0] if failing else '?'}")
                caught.append(name)
        finally:
            open(full, "w").write(original)
    run(["cmake", "--build", args.build, "-j", jobs])  # back to the unmutated code
    print(f"mutation-check: {len(caught)} caught, {len(survived)} survived")
    for name in survived:
        print(f"  survived: {name}")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
