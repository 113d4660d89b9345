#!/usr/bin/env bash
# capture_every_opcode.sh BINDIR: runs the loopback data and UD tests over
# the udp link with SOFTHCA_PCAP set, then checks the capture: every frame's
# ICRC and headers with capture_check (softhca's parser), every frame decodes
# in tshark as InfiniBand with no malformed field or warning, and every
# opcode the tests make appears. Exits 77 (skipped) without tshark.
set -u -o pipefail
bindir=${1:?usage: capture_every_opcode.sh BINDIR}
command -v tshark >/dev/null || { echo "SKIP: tshark is not installed"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/softhca-capture.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
cap=$work/every-opcode.pcap
SOFTHCA_LINK=udp SOFTHCA_PCAP=$cap timeout 120 "$bindir/loopback_data_test" >"$work/data.log" 2>&1 ||
  { tail -20 "$work/data.log"; echo "FAIL: the data tests failed over the udp link"; exit 1; }
SOFTHCA_LINK=udp SOFTHCA_PCAP=$work/ud.pcap timeout 120 "$bindir/loopback_ud_test" >"$work/ud.log" 2>&1 ||
  { tail -20 "$work/ud.log"; echo "FAIL: the UD tests failed over the udp link"; exit 1; }
status=0
# RC SEND first/middle/last(imm)/only(imm), WRITE first/middle/last(imm)/
# only(imm), READ request and responses, ACK, atomic ACK, CAS, FAA; UC
# SEND and WRITE; UD SEND only (with immediate).
"$bindir/capture_check" "$cap" 0x00 0x01 0x02 0x03 0x04 0x05 0x06 0x07 0x08 0x09 0x0a 0x0b 0x0c 0x0d 0x0e 0x0f 0x10 \
  0x11 0x12 0x13 0x14 0x20 0x24 0x2a || status=1
"$bindir/capture_check" "$work/ud.pcap" 0x64 0x65 || status=1
for f in "$cap" "$work/ud.pcap"; do
  # The payload heuristics (RPC-over-RDMA, Mellanox EoIB) take short test
  # payloads for their protocols and call them malformed.
  WIRESHARK_CONFIG_DIR=$work tshark -r "$f" -n --disable-heuristic rpcrdma_infiniband --disable-heuristic mellanox_eoib \
    -T fields -E separator=/t -e frame.number -e frame.protocols -e _ws.malformed -e _ws.expert.severity \
    >"$work/tshark.txt" 2>"$work/tshark.err" || { cat "$work/tshark.err"; status=1; }
  frames=$(wc -l <"$work/tshark.txt")
  not_ib=$(awk -F'\t' '$2 !~ /:infiniband/' "$work/tshark.txt" | wc -l)
  malformed=$(awk -F'\t' '$3 != "" || ($4 != "" && $4 >= 6291456)' "$work/tshark.txt" | wc -l)
  echo "tshark: $f: $frames frames, $not_ib not InfiniBand, $malformed malformed or with warnings"
  ((frames > 0 && not_ib == 0 && malformed == 0)) || status=1
done
((status == 0)) && echo PASS || echo FAIL
exit "$status"
