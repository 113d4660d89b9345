#!/usr/bin/env python3
"""hostile_probe.py: a hostile host on the Ethernet of an RC connection
(tests/system/hostile_host.sh), in the manner of the ReDMArk paper: it knows
what sniffing the connection's set-up would tell (the server's QPN, the PSN
its QP expects next, an rkey and an address) and forges RoCEv2 packets with
scapy, each with a correct ICRC (scapy.contrib.roce computes it over the
packet's real IPv4 and UDP headers as it builds the BTH):

  0. positive control, on the separate control QP pair: two RDMA WRITEs with
     the client's address forged as source, P_Key 0xFFFF (full member) and
     0x7FFF (limited member); these must land (the server checks), which
     shows that the packets below are well-formed and are dropped only for
     where they come from, where they go or their P_Key;
  1. an RDMA WRITE Only at the expected PSN, from our own address;
  2. RDMA READ Requests of the whole MR from our own address, at the
     expected PSN and the one after (where 1 would have moved it): no READ
     response may come back to us;
  3. the WRITE of 1 with the client's address forged but BTH P_Key 0x1234;
  3b. the WRITE with the client's address forged and P_Key 0xFFFF, but to
     another address of the server's host than the connection's;
  4. RDMA WRITEs from our own address at PSN+1 .. PSN+GAP, marked for
     softhca's selective recovery (wire::Bth::reserved7 bit 0x01): a
     responder that kept them would run them once the client fills the gap;
  5. GARBLED packets for the server's QPN from our own address (a seeded
     mix of random opcodes and headers, random P_Keys, bad ICRCs, truncated
     and random bytes).
Every packet that 1-5 aims at the MR carries an ASCII tag ("ATTACK1!", ...;
attack 4's "A4" and its PSN's distance from PSN in hex) so that the peers
can name what landed. A sniffer on our interface lists every RoCEv2
packet that comes to our address, from before the first packet until the
driver writes a line on our stdin (the peers are done); the driver's own
judge is the kernel's UDP counters of this host.

  hostile_probe.py --iface IF --own ADDR --server ADDR --server-alt ADDR --client ADDR
                   --qpn N --psn N --rkey N --addr N --ctl-qpn N --ctl-psn N --ctl-rkey N --ctl-addr N
                   --ready FIFO [--gap N] [--garbled N] [--seed N] [--wait SECS]

Numbers may be written in hex (0x...). Prints what it sent and saw, ending
with one line "hostile_probe: summary key=value ..." (from_own_address: the
well-formed packets of 1, 2 and 4; wrong_destination; foreign_pkey;
garbled, and garbled_well_formed: those of them that are RC opcodes with
the right P_Key and ICRC, whatever their headers; control; replies: RoCEv2
packets that reached us; read_responses).
Exits 0 when no RoCEv2 packet came back to us, 1 when some did (a READ
response, an ACK or a NAK: the server's QP took a packet from us), 2 on bad
usage or when the packets could not be sent."""
import argparse
import random
import struct
import sys
import select
import threading

from scapy.config import conf
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether, getmacbyip
from scapy.packet import Raw
from scapy.sendrecv import AsyncSniffer, sendp

ROCE_PORT = 4791
SELECTIVE = 0x01  # transport/selective.hpp kSelective, in the BTH byte of AckReq
WRITE_ONLY = 0x0A
READ_REQUEST = 0x0C
READ_RESPONSES = range(0x0D, 0x11)
PSN_MASK = 0xFFFFFF
# The offsets of the attacked MR that each attack aims at (the client
# writes [0, 64) itself).
OFFSET_ATTACK1 = 1024
OFFSET_ATTACK3 = 2048
OFFSET_ATTACK3B = 2112
OFFSET_ATTACK4 = 64  # .. 1024, 64 bytes a PSN
OFFSET_ATTACK5 = 3072  # .. 4096


def tagged(tag, n=64):
    """tag (8 ASCII bytes) repeated over n bytes."""
    return (tag * (n // len(tag) + 1))[:n]


def reth(va, rkey, length):
    return struct.pack("!QII", va, rkey, length)


class Forger:
    """Builds RoCEv2 frames to the server's host; scapy fills the ICRC."""

    def __init__(self, args, rng):
        self.args = args
        self.rng = rng
        self.macs = {}

    def resolve(self):
        for ip in (self.args.server, self.args.server_alt):
            mac = getmacbyip(ip)
            if mac is None:
                raise RuntimeError(f"no ARP answer from {ip}")
            self.macs[ip] = mac

    def frame(self, src, dst, body, bad_icrc=False, **bth):
        """body: the bytes after the BTH (extended headers and payload);
        bth: the BTH's fields. The IPv4 ID is 0 with DF set, as a RoCE
        sender's; the UDP checksum is 0 (RoCEv2 may leave it out)."""
        ip = IP(src=src, dst=dst, id=0, flags="DF", ttl=64)
        udp = UDP(sport=self.rng.randrange(49152, 65536), dport=ROCE_PORT, chksum=0)
        pkt = ip / udp / BTH(**bth) / Raw(body)
        if bad_icrc:
            wire = bytearray(bytes(pkt))
            wire[-1] ^= 0x5A
            pkt = IP(bytes(wire))
        return Ether(dst=self.macs[dst]) / pkt

    def raw_frame(self, dst, payload):
        """A UDP datagram to port 4791 whose payload is `payload` as is."""
        ip = IP(src=self.args.own, dst=dst, id=0, flags="DF")
        udp = UDP(sport=self.rng.randrange(49152, 65536), dport=ROCE_PORT, chksum=0)
        return Ether(dst=self.macs[dst]) / ip / udp / Raw(payload)


def write_only(forger, src, dst, qpn, psn, rkey, va, payload, pkey=0xFFFF, resv7=0):
    return forger.frame(src, dst, reth(va, rkey, len(payload)) + payload, opcode=WRITE_ONLY, pkey=pkey,
                        dqpn=qpn, ackreq=1, resv7=resv7, psn=psn & PSN_MASK)


def garbled(forger, a, rng):
    """One packet of attack 5 and whether it is well-formed by construction."""
    kind = rng.random()
    psn = (a.psn + rng.randrange(-8, 600)) & PSN_MASK
    va = a.addr + OFFSET_ATTACK5 + 8 * rng.randrange(0, 120)
    if kind < 0.15:
        return forger.raw_frame(a.server, rng.randbytes(rng.randrange(0, 16))), False
    if kind < 0.30:
        return forger.raw_frame(a.server, rng.randbytes(rng.randrange(16, 200))), False
    if kind < 0.45:
        payload = tagged(b"ATTACK5!", 4 * rng.randrange(1, 16))
        return forger.frame(a.own, a.server, reth(va, a.rkey, len(payload)) + payload, bad_icrc=True,
                            opcode=WRITE_ONLY, dqpn=a.qpn, ackreq=1, psn=psn), False
    # A BTH of a random RC opcode (or any byte), random flags and reserved
    # bits, now and then a random P_Key, and headers that may or may not
    # fit the opcode.
    opcode = rng.randrange(0x00, 0x15) if rng.random() < 0.85 else rng.randrange(0, 256)
    pkey = 0xFFFF if rng.random() < 0.8 else rng.randrange(0, 0x10000)
    payload = tagged(b"ATTACK5!", 4 * rng.randrange(0, 16))
    if opcode in (0x06, 0x0A, 0x0B, 0x0C):
        body = reth(va, a.rkey if rng.random() < 0.8 else rng.getrandbits(32), len(payload) or 64)
        if opcode == 0x0B:
            body += rng.randbytes(4)
        body += payload if opcode != 0x0C else b""
    elif opcode in (0x13, 0x14):
        body = struct.pack("!QIQQ", va, a.rkey, rng.getrandbits(64), rng.getrandbits(64))
    elif opcode in (0x0D, 0x0F, 0x10, 0x11, 0x12):
        body = rng.randbytes(4) + (payload if opcode != 0x11 else b"") + (rng.randbytes(8) if opcode == 0x12 else b"")
    else:
        body = rng.randbytes(rng.randrange(0, 4)) + payload
    well_formed = opcode < 0x15 and pkey == 0xFFFF
    return forger.frame(a.own, a.server, body, opcode=opcode, solicited=rng.getrandbits(1),
                        migreq=rng.getrandbits(1), padcount=rng.getrandbits(2), pkey=pkey, dqpn=a.qpn,
                        ackreq=rng.getrandbits(1), resv7=rng.getrandbits(7), psn=psn), well_formed


def number(text):
    return int(text, 0)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name in ("--iface", "--own", "--server", "--server-alt", "--client"):
        p.add_argument(name, required=True)
    for name in ("--qpn", "--psn", "--rkey", "--addr", "--ctl-qpn", "--ctl-psn", "--ctl-rkey", "--ctl-addr"):
        p.add_argument(name, required=True, type=number)
    p.add_argument("--gap", type=int, default=300)
    p.add_argument("--garbled", type=int, default=300)
    p.add_argument("--seed", type=int, default=4791)
    p.add_argument("--ready", required=True, help="where to write a line once every packet is sent (a FIFO)")
    p.add_argument("--wait", type=float, default=60, help="seconds to wait for the stop line on stdin")
    a = p.parse_args()
    if not 0 < a.gap < 512:
        print("hostile_probe: --gap must be within selective recovery's window (1..511)", file=sys.stderr)
        return 2
    conf.verb = 0
    conf.iface = a.iface
    rng = random.Random(a.seed)
    forger = Forger(a, rng)

    replies = []
    started = threading.Event()
    sniffer = AsyncSniffer(iface=a.iface, store=False, started_callback=started.set,
                           lfilter=lambda f: IP in f and UDP in f and f[IP].dst == a.own and
                           ROCE_PORT in (f[UDP].sport, f[UDP].dport),
                           prn=replies.append)
    sniffer.start()
    if not started.wait(5):
        print("hostile_probe: the sniffer did not start", file=sys.stderr)
        return 2
    try:
        forger.resolve()
    except RuntimeError as e:
        print(f"hostile_probe: {e}", file=sys.stderr)
        sniffer.stop()
        return 2

    counts = dict(from_own_address=0, wrong_destination=0, foreign_pkey=0, garbled=0, garbled_well_formed=0,
                  control=0)

    def send(label, frames):
        sendp(frames, iface=a.iface, verbose=False)
        print(f"hostile_probe: {label}: {len(frames)} packet{'s' if len(frames) != 1 else ''}")

    # 0. The positive control: the client's address forged, the control QP.
    send("0. control WRITEs as the client (P_Key 0xFFFF, 0x7FFF) to the control QP", [
        write_only(forger, a.client, a.server, a.ctl_qpn, a.ctl_psn, a.ctl_rkey, a.ctl_addr, tagged(b"CTRLFFFF")),
        write_only(forger, a.client, a.server, a.ctl_qpn, a.ctl_psn + 1, a.ctl_rkey, a.ctl_addr + 64,
                   tagged(b"CTRL7FFF"), pkey=0x7FFF)])
    counts["control"] += 2
    # 1. From our own address.
    send("1. WRITE from our own address", [
        write_only(forger, a.own, a.server, a.qpn, a.psn, a.rkey, a.addr + OFFSET_ATTACK1, tagged(b"ATTACK1!"))])
    counts["from_own_address"] += 1
    # 2. A READ of the whole MR from our own address.
    send("2. READ Requests of 4096 bytes at PSN and PSN+1 from our own address", [
        forger.frame(a.own, a.server, reth(a.addr, a.rkey, 4096), opcode=READ_REQUEST, dqpn=a.qpn, ackreq=1,
                     psn=(a.psn + k) & PSN_MASK) for k in (0, 1)])
    counts["from_own_address"] += 2
    # 3. The client's address, a foreign partition.
    send("3. WRITE as the client with P_Key 0x1234", [
        write_only(forger, a.client, a.server, a.qpn, a.psn, a.rkey, a.addr + OFFSET_ATTACK3, tagged(b"ATTACK3!"),
                   pkey=0x1234)])
    counts["foreign_pkey"] += 1
    # 3b. The client's address, to the server's host's other address.
    send(f"3b. WRITE as the client to {a.server_alt}, not the connection's {a.server}", [
        write_only(forger, a.client, a.server_alt, a.qpn, a.psn, a.rkey, a.addr + OFFSET_ATTACK3B,
                   tagged(b"ATTACK3B"))])
    counts["wrong_destination"] += 1
    # 4. Past the expected PSN, marked selective, from our own address.
    frames = []
    for k in range(1, a.gap + 1):
        offset = OFFSET_ATTACK4 + 64 * ((k - 1) % 15)
        frames.append(write_only(forger, a.own, a.server, a.qpn, a.psn + k, a.rkey, a.addr + offset,
                                 tagged(b"A4%06x" % k), resv7=SELECTIVE))
    send(f"4. WRITEs at PSN+1 .. PSN+{a.gap}, marked selective, from our own address", frames)
    counts["from_own_address"] += a.gap
    # 5. Garbage for the server's QPN.
    frames = []
    for _ in range(a.garbled):
        frame, well_formed = garbled(forger, a, rng)
        frames.append(frame)
        counts["garbled_well_formed"] += well_formed
    send(f"5. garbled packets for QP {a.qpn:#08x} from our own address (seed {a.seed})", frames)
    counts["garbled"] += a.garbled

    # Sent: the driver lets the peers finish (the client's WRITE and READ
    # complete only after the server has handled everything we sent, and
    # answered it if it did), then says stop on our stdin.
    with open(a.ready, "w") as ready:
        ready.write("sent\n")
    if not select.select([sys.stdin], [], [], a.wait)[0]:
        print(f"hostile_probe: no stop from the driver in {a.wait} s", file=sys.stderr)
        sniffer.stop()
        return 2
    sniffer.stop()
    read_responses = sum(1 for f in replies if BTH in f and f[BTH].opcode in READ_RESPONSES)
    status = 0
    if read_responses:
        print(f"hostile_probe: FAIL: {read_responses} READ response packets came to us")
        status = 1
    if replies:
        print(f"hostile_probe: FAIL: {len(replies)} RoCEv2 packets came back to us; the server's QP answered "
              "packets that are not its peer's")
        for f in replies[:8]:
            what = f"opcode {f[BTH].opcode:#04x} PSN {f[BTH].psn:#08x} QP {f[BTH].dqpn:#08x}" if BTH in f else "?"
            print(f"hostile_probe:   from {f[IP].src}: {what}")
        status = 1
    else:
        print("hostile_probe: nothing came back to us")
    counts.update(replies=len(replies), read_responses=read_responses)
    print("hostile_probe: summary " + " ".join(f"{k}={v}" for k, v in counts.items()))
    return status


if __name__ == "__main__":
    sys.exit(main())
