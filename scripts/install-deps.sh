#!/usr/bin/env bash
# Install the Debian 12 packages that softhca needs to build and test.
#
# Idempotent: when every package is already installed it does nothing and
# touches no network. Otherwise it runs `apt-get update` once and installs
# only the missing packages, without recommends. Uses sudo when not root.
set -euo pipefail

packages=(
  build-essential cmake g++
  libibverbs-dev librdmacm-dev          # headers we build against (rdma-core 44)
  ibverbs-utils rdmacm-utils perftest   # the unmodified peers of the system tests
  googletest libgtest-dev libbenchmark-dev libfmt-dev
  libisal-dev                           # crc32_gzip_refl for the RoCEv2 ICRC (src/wire)
  zlib1g-dev                            # crc32, the unit tests' reference for that ICRC
  libpcap-dev                           # the udp link's captures (SOFTHCA_PCAP)
  tshark                                # decodes those captures in system.pcap_capture
  tcpdump ethtool python3-scapy         # the wire's ICRCs, GSO segments' IDs included (two_hosts.wire_icrc.*)
  nftables                              # loss on the hosts' own input, not softhca's (two_hosts.*.loss5)
  ucx-utils                             # comparison peer for bench/peers; ucx_info/ucx_perftest system tests
  openmpi-bin libopenmpi-dev            # Open MPI's ucx pml on softhca (system.mpi.*; built only if MPI is found)
  python3 python3-pyverbs
  iproute2 procps                       # ss (readiness polling), ps/kill
  iperf3                                # a socket program over rsockets (librspreload; system.rsocket.iperf3)
  gdb                                   # stacks of a timed-out peer in the harness
  qemu-system-x86 busybox-static socat  # the kernel's Soft-RoCE (rxe) in a guest as a peer (tests/rxe)
  pkg-config                            # install.find_package_and_pkg_config builds with softhca.pc
  dpkg-dev                              # dpkg-shlibdeps: the .deb's Depends (cpack -G DEB)
)

missing=()
for pkg in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  if [[ $status != "install ok installed" ]]; then
    missing+=("$pkg")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages already installed"
  exit 0
fi

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  if ! command -v sudo >/dev/null; then
    echo "install-deps: not root and sudo is not available; install as root: ${missing[*]}" >&2
    exit 1
  fi
  sudo=(sudo)
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -q
"${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
