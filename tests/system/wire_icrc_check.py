#!/usr/bin/env python3
"""wire_icrc_check.py PCAP [--min-gso-segments N]: checks the ICRC of every
RoCEv2 (UDP port 4791) IPv4 packet of a capture taken on the wire (tcpdump
on a veth, so the IPv4 headers are the kernel's real ones, IDs included)
with scapy's own ICRC computation (scapy.contrib.roce BTH.compute_icrc),
which shares no code with softhca.

Also counts the packets whose IPv4 ID is not 0 (the segments of GSO sends
after each send's first) and, for each, whether the ICRC over the same
header with ID 0 would have matched instead: that is what softhca put there
before issue #9's fix, so those packets are the ones the fix is about.
--min-gso-segments N fails the check when fewer than N packets have a
nonzero ID (the run did not exercise GSO at all). Exits 0 when every ICRC
matches, 1 otherwise, 2 on bad usage."""
import sys

from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.utils import PcapReader


def icrc_of(pkt):
    """scapy's ICRC of pkt's BTH over its IP and UDP headers, as an int in
    the wire's byte order (least significant byte first)."""
    return int.from_bytes(pkt[BTH].compute_icrc(None), "big")


def main(argv):
    if len(argv) not in (2, 4) or (len(argv) == 4 and argv[2] != "--min-gso-segments"):
        print(__doc__, file=sys.stderr)
        return 2
    min_gso = int(argv[3]) if len(argv) == 4 else 0
    checked = bad = nonzero_id = old_would_fail = max_id = other = 0
    for n, pkt in enumerate(PcapReader(argv[1]), start=1):
        if IP not in pkt or UDP not in pkt or pkt[UDP].dport != 4791:
            other += 1
            continue
        if BTH not in pkt:
            print(f"frame {n}: no BTH")
            bad += 1
            continue
        wire = int.from_bytes(bytes(pkt[UDP].payload)[-4:], "big")
        checked += 1
        if icrc_of(pkt) != wire:
            bad += 1
            if bad <= 10:
                print(f"frame {n}: ICRC {wire:08x} on the wire, {icrc_of(pkt):08x} over its real header "
                      f"(IP ID {pkt[IP].id}, opcode 0x{pkt[BTH].opcode:02x}, PSN {pkt[BTH].psn})")
        if pkt[IP].id != 0:
            nonzero_id += 1
            max_id = max(max_id, pkt[IP].id)
            as_id0 = pkt.copy()
            as_id0[IP].id = 0
            as_id0 = as_id0.__class__(bytes(as_id0))
            if icrc_of(as_id0) != wire:
                old_would_fail += 1
    print(f"wire_icrc_check: {checked} RoCEv2 IPv4 packets, {bad} with a wrong ICRC; "
          f"{nonzero_id} with a nonzero IP ID (largest {max_id}), of which {old_would_fail} carry an ICRC "
          f"that an ID-0 header image would not give; {other} other frames")
    if nonzero_id < min_gso:
        print(f"wire_icrc_check: fewer than {min_gso} packets with a nonzero IP ID: GSO was not exercised")
        return 1
    return 0 if bad == 0 and checked > 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
