#!/usr/bin/python3
"""pcap_summary.py PCAP [LABEL=ADDR ...]: what crossed the wire between
softhca and rxe, per direction, for the failure reports of softhca_rxe.sh.

For each RoCEv2 packet (UDP port 4791, IPv4 or IPv6) of a capture taken on
the guest's tap: the sender, the BTH opcodes, how many IPv4 IDs are not 0,
how many UDP checksums are 0, whether the ICRC matches one computed here
over the packet's real headers (IBTA Annex A17's masks, IPv4 and IPv6;
shares no code with softhca or rxe; for IPv4 it agrees with scapy's
BTH.compute_icrc, which does not do IPv6), and RC packets sent again (same
destination QP, PSN and opcode: retransmissions) with how long after the
first. LABEL=ADDR names senders (host=198.18.1.1).
Checksums are as the tap saw them: the host's own sends may carry an
unfinished (offloaded) UDP checksum there, so only "0" is telling.
Run with the system python (/usr/bin/python3, which has python3-scapy)."""
import collections
import statistics
import sys
import zlib

from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.utils import PcapReader

OPCODES = {0x04: "SEND_ONLY", 0x00: "SEND_FIRST", 0x01: "SEND_MIDDLE", 0x02: "SEND_LAST",
           0x05: "SEND_ONLY_IMM", 0x0a: "WRITE_ONLY", 0x11: "ACK", 0x0c: "READ_REQ",
           0x10: "READ_RESP_ONLY", 0x64: "UD_SEND_ONLY", 0x65: "UD_SEND_ONLY_IMM"}


def icrc_ok(pkt):
    """Whether the ICRC at the end of pkt's UDP payload is right: CRC-32
    over 8 bytes of 1s (the LRH of IB), the IP header with its variant
    fields set to 1s (IPv4 TOS, TTL, checksum; IPv6 traffic class, flow
    label, hop limit), the UDP header with checksum 1s, the BTH with its
    resv8a byte 1s, and the rest up to the ICRC, sent least significant
    byte first."""
    if IP in pkt:
        h = bytearray(bytes(pkt[IP])[:pkt[IP].ihl * 4])
        h[1] = 0xff
        h[8] = 0xff
        h[10:12] = b"\xff\xff"
    else:
        h = bytearray(bytes(pkt[IPv6])[:40])
        h[0] |= 0x0f
        h[1:4] = b"\xff\xff\xff"
        h[7] = 0xff
    u = bytearray(bytes(pkt[UDP]))
    u[6:8] = b"\xff\xff"
    u[12] = 0xff
    return zlib.crc32(b"\xff" * 8 + bytes(h) + bytes(u[:-4])) == int.from_bytes(u[-4:], "little")


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    names = dict(reversed(a.split("=", 1)) for a in argv[2:])
    stats = collections.OrderedDict()
    first_seen = {}
    resent = collections.defaultdict(list)
    for pkt in PcapReader(argv[1]):
        if UDP not in pkt or pkt[UDP].dport != 4791:
            continue
        ip = pkt[IP] if IP in pkt else pkt[IPv6]
        key = f"{names.get(ip.src, ip.src)} -> {names.get(ip.dst, ip.dst)} ({'IPv4' if IP in pkt else 'IPv6'})"
        s = stats.setdefault(key, collections.Counter())
        s["packets"] += 1
        if IP in pkt and pkt[IP].id != 0:
            s["ip_id_nonzero"] += 1
        if pkt[UDP].chksum == 0:
            s["udp_csum_zero"] += 1
        if BTH not in pkt:
            s["no_bth"] += 1
            continue
        op = pkt[BTH].opcode
        s["op " + OPCODES.get(op, f"0x{op:02x}")] += 1
        s["icrc_ok" if icrc_ok(pkt) else "icrc_BAD"] += 1
        # RC (opcodes 0x00-0x1f) data only: ACKs repeat their PSN
        # legitimately (coalescing), UD's PSN means nothing to the receiver.
        if op < 0x20 and op != 0x11:
            seen = (key, pkt[BTH].dqpn, pkt[BTH].psn, op)
            if seen in first_seen:
                resent[key].append(float(pkt.time - first_seen[seen]) * 1000)
            else:
                first_seen[seen] = pkt.time
    if not stats:
        print("no RoCEv2 packets")
    for key, s in stats.items():
        line = f"{key}: " + ", ".join(f"{k} {v}" for k, v in s.items())
        if resent[key]:
            d = resent[key]
            line += (f", sent again {len(d)} (after {min(d):.1f}/{statistics.median(d):.1f}/{max(d):.1f} ms"
                     " min/median/max)")
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
