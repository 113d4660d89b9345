#!/usr/bin/env bash
# cm_capture.sh: rping between two hosts (two_hosts.sh) with the server's
# udp link writing a capture (SOFTHCA_PCAP), then judged by tshark's own
# InfiniBand dissector, not by softhca: the connect, the data and the
# disconnect decode; every CM message (REQ, REP, RTU, DREQ, DREP, and MRA
# if any) is a MAD of the CM class (0x07) to QP1 from QP1 with the GSI
# Q_Key 0x80010000; and nothing in the capture is malformed.
#
#   cm_capture.sh TWO_HOSTS_SH LIBDIR
# Exits 77 (skipped) where two_hosts.sh cannot make namespaces or tshark is missing.
set -u -o pipefail
two_hosts=${1:?usage: cm_capture.sh TWO_HOSTS_SH LIBDIR}
libdir=${2:?usage: cm_capture.sh TWO_HOSTS_SH LIBDIR}
command -v tshark >/dev/null || { echo "SKIP: no tshark"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/softhca-cm-capture.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
pcap=$work/server.pcap

bash "$two_hosts" --name two_hosts.cm.capture --timeout 30 --libdir "$libdir" --port 18515 \
  --ready-log "cm: listening on" --env SOFTHCA_LOG=info \
  --server "env SOFTHCA_PCAP=$pcap rping -s -a @SERVER@ -C 5 -v" \
  --client "rping -c -a @SERVER@ -C 5 -v" --expect "^ping data: rdma-ping-4: "
rc=$?
((rc == 0)) || exit $rc

fail=0
ts() { tshark -r "$pcap" "$@" 2>/dev/null; }
cm=$(ts -Y "infiniband.bth.destqp == 1" -T fields -e _ws.col.Info -e infiniband.deth.q_key \
        -e infiniband.deth.srcqp -e infiniband.mad.mgmtclass)
echo "$cm" | sed 's/^/[capture] /'
for msg in ConnectRequest ConnectReply ReadyToUse DisconnectRequest DisconnectReply; do
  grep -q "CM: $msg" <<<"$cm" || { echo "FAIL: no CM $msg in the capture"; fail=1; }
done
bad=$(awk -F'\t' '$2 != "0x0000000080010000" || $3 != "0x00000001" || $4 != "0x07"' <<<"$cm")
[[ -z $bad ]] || { echo "FAIL: QP1 packets that are not GSI CM MADs:"; echo "$bad"; fail=1; }
# The path MTU the REQ offers is the veth's (1500 bytes: IBV_MTU_1024, 3).
mtus=$(ts -Y "infiniband.cm.req.pppmtu" -T fields -e infiniband.cm.req.pppmtu | sort -u | tr '\n' ' ')
[[ $mtus == "0x03 " || $mtus == "3 " ]] || { echo "FAIL: the REQ's path MTU is '$mtus', not IBV_MTU_1024 (3)"; fail=1; }
data=$(ts -Y "infiniband.bth.destqp != 1" | wc -l)
((data > 0)) || { echo "FAIL: no data packets between the connect and the disconnect"; fail=1; }
malformed=$(ts -Y "_ws.malformed || _ws.expert.severity >= error" | wc -l)
((malformed == 0)) || { echo "FAIL: $malformed malformed or erroneous packets"; ts -Y "_ws.malformed || _ws.expert.severity >= error" | head; fail=1; }
total=$(ts | wc -l)
echo "[capture] $total packets, $(wc -l <<<"$cm") CM MADs, $data data packets, $malformed malformed"
((fail == 0)) && echo "[capture] PASS" || echo "[capture] FAIL"
exit $fail
