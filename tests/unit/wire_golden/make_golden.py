#!/usr/bin/python3
"""Golden RoCEv2 packets for the src/wire unit tests, built with scapy.

Rerun after changing a case (Debian's scapy, python3-scapy, lives in the
system Python, hence /usr/bin/python3):

    apt-get install -y python3-scapy          # tshark too, for --tshark
    /usr/bin/python3 tests/unit/wire_golden/make_golden.py [--tshark]

It rewrites golden_packets.hpp next to this script; commit both. CI only
compiles the header, so it needs neither scapy nor tshark.

Where the bytes come from, so that the tests compare our codec with a source
that is not our codec:
  - IP, UDP (lengths, IPv4 header checksum, UDP checksum), the BTH and the
    AETH: scapy (scapy.layers.inet, scapy.contrib.roce).
  - The ICRC of IPv4 packets: scapy's BTH.compute_icrc.
  - scapy 2.5's RoCE layer has no RETH, AtomicETH, AtomicAckETH, ImmDt, IETH
    or DETH, and no names for SEND_*_WITH_INVALIDATE (0x16/0x17) or ATOMIC
    WRITE (0x1D). Those headers are packed BY HAND below from the IBTA field
    tables (vol. 1, 9.3: big-endian, reserved bits zero) and go to scapy as
    raw bytes after the BTH/AETH; scapy still frames and checksums them.
  - scapy 2.5 computes no ICRC over IPv6 (it writes 0 and warns). The IPv6
    ICRC is computed BY HAND here (icrc_by_hand, from annex A17's masking
    rules); the same function must reproduce scapy's value on every IPv4
    packet, or the script stops.
  - --tshark decodes every packet with tshark and checks each header field
    against the case, an independent check of the hand-packed headers.
    (Wireshark 4.0 shows the ICRC but does not verify it.)
"""

import argparse
import os
import struct
import subprocess
import sys
import tempfile
import warnings
import zlib

warnings.filterwarnings("ignore")
from scapy.all import Ether, IP, IPv6, UDP, Raw, conf, wrpcap  # noqa: E402
from scapy.contrib.roce import BTH, AETH  # noqa: E402

conf.verb = 0

# The flows. FLOW_V4 is what softhca's udp link sends (DF, IP ID 0, TTL 64).
# FLOW_V4_MARKED and FLOW_V6 put values in the fields the ICRC masks (TOS/ECN,
# TTL, traffic class, flow label), so a codec that forgets a mask fails.
FLOW_V4 = dict(v6=False, src="198.18.0.1", dst="198.18.0.2", sport=49152, tclass=0, hop=64, flow_label=0)
FLOW_V4_MARKED = dict(v6=False, src="198.18.0.2", dst="198.18.0.1", sport=50001, tclass=0x03, hop=17, flow_label=0)
FLOW_V6 = dict(v6=True, src="2001:db8::1", dst="2001:db8::2", sport=61234, tclass=0x20, hop=64, flow_label=0x12345)

ROCE_PORT = 4791


def pattern(n, seed=0):
    return bytes((seed + 7 * i) & 0xFF for i in range(n))


# Extended headers packed by hand (scapy has none of these but the AETH).
def deth(qkey, src_qpn):
    return struct.pack(">IB", qkey, 0) + src_qpn.to_bytes(3, "big")


def reth(va, rkey, dma_length):
    return struct.pack(">QII", va, rkey, dma_length)


def atomic_eth(va, rkey, swap_add, compare):
    return struct.pack(">QIQQ", va, rkey, swap_add, compare)


def atomic_ack_eth(original):
    return struct.pack(">Q", original)


def immdt(imm):
    return struct.pack(">I", imm)


def ieth(rkey):
    return struct.pack(">I", rkey)


def case(name, flow, opcode, payload=b"", dqpn=0x000011, psn=1, ackreq=False, solicited=False, migreq=False,
         pkey=0xFFFF, fecn=False, becn=False, **ext):
    return dict(name=name, flow=flow, opcode=opcode, payload=payload, dqpn=dqpn, psn=psn, ackreq=ackreq,
                solicited=solicited, migreq=migreq, pkey=pkey, fecn=fecn, becn=becn, ext=ext)


CASES = [
    case("rc_send_only", FLOW_V4, 0x04, pattern(16), ackreq=True),
    case("rc_send_only_empty", FLOW_V4, 0x04, b"", psn=2, ackreq=True),
    # 13 bytes need 3 pad bytes; FECN/BECN set: the ICRC must not cover them.
    case("rc_send_only_pad3_fecn_becn", FLOW_V4, 0x04, pattern(13, 1), psn=3, solicited=True, fecn=True, becn=True),
    case("rc_send_first_psn_max", FLOW_V4, 0x00, pattern(64, 2), psn=0xFFFFFF),
    case("rc_send_last_imm_psn_wrap", FLOW_V4, 0x03, pattern(7, 3), psn=0, ackreq=True, immdt=0xDEADBEEF),
    case("rc_rdma_write_only", FLOW_V4, 0x0A, pattern(24, 4), dqpn=0xABCDEF, psn=0x123456, ackreq=True,
         reth=(0x00007F1234567000, 0x1234ABCD, 24)),
    case("rc_rdma_write_only_imm_pad", FLOW_V4, 0x0B, pattern(5, 5), psn=0x10, ackreq=True, solicited=True,
         reth=(0xFFFFFFFFFFFFFFF8, 0xFEDCBA98, 5), immdt=0x01020304),
    case("rc_rdma_read_request", FLOW_V4, 0x0C, psn=0x20, ackreq=True, reth=(0x0000000000400000, 0x00C0FFEE, 65536)),
    case("rc_read_response_only", FLOW_V4_MARKED, 0x10, pattern(24, 6), dqpn=0x000022, psn=0x20,
         aeth=(0x1F, 0x000005)),
    case("rc_read_response_middle", FLOW_V4_MARKED, 0x0E, pattern(32, 7), dqpn=0x000022, psn=0x21),
    case("rc_ack", FLOW_V4_MARKED, 0x11, dqpn=0x000022, psn=0x123456, aeth=(0x1F, 0x000102)),
    case("rc_ack_credits", FLOW_V4_MARKED, 0x11, dqpn=0x000022, psn=0x7, aeth=(0x0A, 0xFFFFFF)),
    case("rc_rnr_nak", FLOW_V4_MARKED, 0x11, dqpn=0x000022, psn=0x30, aeth=(0x20 | 14, 0x000007)),
    case("rc_nak_psn_sequence", FLOW_V4_MARKED, 0x11, dqpn=0x000022, psn=0x31, aeth=(0x60, 0x000007)),
    case("rc_nak_remote_access", FLOW_V4_MARKED, 0x11, dqpn=0x000022, psn=0x32, aeth=(0x62, 0x000008)),
    case("rc_compare_swap", FLOW_V4, 0x13, psn=0x40, ackreq=True,
         atomic_eth=(0x00007F0000001000, 0x0BADCAFE, 0x1111111111111111, 0x2222222222222222)),
    case("rc_fetch_add", FLOW_V4, 0x14, psn=0x41, ackreq=True,
         atomic_eth=(0x00007F0000001008, 0x0BADCAFE, 1, 0)),
    case("rc_atomic_ack", FLOW_V4_MARKED, 0x12, dqpn=0x000022, psn=0x40,
         aeth=(0x1F, 0x000009), atomic_ack_eth=0x0123456789ABCDEF),
    case("rc_send_only_invalidate", FLOW_V4, 0x17, pattern(8, 8), psn=0x50, ackreq=True, ieth=0x00ABCD01),
    case("rc_atomic_write", FLOW_V4, 0x1D, pattern(8, 9), psn=0x51, ackreq=True,
         reth=(0x00007F0000002000, 0x0BADCAFE, 8)),
    case("uc_rdma_write_first_pkey", FLOW_V4, 0x26, pattern(256, 10), dqpn=0x000033, psn=0x00FFFE, pkey=0x8001,
         reth=(0x0000000010000000, 0x00000101, 1000)),
    case("ud_send_only", FLOW_V4, 0x64, pattern(20, 11), dqpn=0x000044, psn=0x000100, deth=(0x11111111, 0x000456)),
    case("ud_send_only_imm_pad", FLOW_V4, 0x65, pattern(3, 12), dqpn=0x000044, psn=0x000101, solicited=True,
         deth=(0x80010000, 0xFFFFFF), immdt=0xCAFEF00D),
    case("rc_send_only_v6", FLOW_V6, 0x04, pattern(16, 13), psn=0x000200, ackreq=True),
    case("rc_rdma_write_only_imm_v6", FLOW_V6, 0x0B, pattern(9, 14), psn=0x000201, ackreq=True, migreq=True,
         reth=(0x00007F1234560000, 0x00001234, 9), immdt=0x00000001),
    case("rc_nak_remote_op_v6", FLOW_V6, 0x11, dqpn=0x000022, psn=0x000202, becn=True, aeth=(0x63, 0x000010)),
    case("rc_atomic_ack_v6", FLOW_V6, 0x12, dqpn=0x000022, psn=0xFFFFFF, aeth=(0x1F, 0x000011),
         atomic_ack_eth=0xFFFFFFFFFFFFFFFF),
    case("ud_send_only_imm_v6", FLOW_V6, 0x65, pattern(30, 15), dqpn=0x000101, psn=0x000300,
         deth=(0x00000111, 0x000002), immdt=0x7FFFFFFF),
]

# The wire order of the extended headers after the BTH (the AETH is scapy's).
EXT_ORDER = ["deth", "reth", "atomic_eth", "aeth", "atomic_ack_eth", "immdt", "ieth"]
PACKERS = dict(deth=deth, reth=reth, atomic_eth=atomic_eth, atomic_ack_eth=atomic_ack_eth, immdt=immdt, ieth=ieth)


def icrc_by_hand(ip_packet):
    """The ICRC of annex A17, written from the spec, not from scapy: CRC-32
    over 8 bytes of 0xFF (the LRH RoCEv2 lacks), the IP header with TOS/TTL/
    checksum (IPv4) or traffic class/flow label/hop limit (IPv6) set to ones,
    the UDP header with its checksum set to ones, the BTH with byte 4 set to
    ones, and the rest up to the ICRC. Returns the CRC as a number; it goes on
    the wire least significant byte first."""
    p = bytearray(ip_packet)
    if p[0] >> 4 == 4:
        ip_len = (p[0] & 0x0F) * 4
        assert ip_len == 20
        p[1] = 0xFF
        p[8] = 0xFF
        p[10:12] = b"\xff\xff"
    else:
        ip_len = 40
        p[0] |= 0x0F
        p[1:4] = b"\xff\xff\xff"
        p[7] = 0xFF
    p[ip_len + 6:ip_len + 8] = b"\xff\xff"
    p[ip_len + 8 + 4] = 0xFF
    return zlib.crc32(b"\xff" * 8 + bytes(p[:-4])) & 0xFFFFFFFF


def build(c, icrc_field=None):
    f = c["flow"]
    if f["v6"]:
        ip = IPv6(src=f["src"], dst=f["dst"], tc=f["tclass"], fl=f["flow_label"], hlim=f["hop"])
    else:
        ip = IP(src=f["src"], dst=f["dst"], tos=f["tclass"], ttl=f["hop"], id=0, flags="DF")
    pad = (4 - len(c["payload"]) % 4) % 4
    bth = BTH(opcode=c["opcode"], solicited=int(c["solicited"]), migreq=int(c["migreq"]), padcount=pad, version=0,
              pkey=c["pkey"], fecn=int(c["fecn"]), becn=int(c["becn"]), dqpn=c["dqpn"], ackreq=int(c["ackreq"]),
              psn=c["psn"], icrc=icrc_field)
    pkt = ip / UDP(sport=f["sport"], dport=ROCE_PORT) / bth
    ext = c["ext"]
    before_aeth = b"".join(pack_ext(n, ext[n]) for n in EXT_ORDER[:3] if n in ext)
    after_aeth = b"".join(pack_ext(n, ext[n]) for n in EXT_ORDER[4:] if n in ext)
    rest = after_aeth + c["payload"] + b"\x00" * pad
    if "aeth" in ext:
        assert not before_aeth
        syndrome, msn = ext["aeth"]
        pkt = pkt / AETH(syndrome=syndrome, msn=msn)
    else:
        rest = before_aeth + rest
    if rest:
        pkt = pkt / Raw(rest)
    return pkt


def pack_ext(name, value):
    return PACKERS[name](*value) if isinstance(value, tuple) else PACKERS[name](value)


def make_packet(c):
    if c["flow"]["v6"]:
        # scapy writes ICRC 0 over IPv6: compute it by hand, then build again
        # so that scapy's UDP checksum covers the real ICRC bytes.
        icrc = icrc_by_hand(bytes(build(c, icrc_field=0)))
        raw = bytes(build(c, icrc_field=int.from_bytes(icrc.to_bytes(4, "little"), "big")))
        source = "by hand (annex A17), scapy has no IPv6 ICRC"
    else:
        raw = bytes(build(c))
        icrc = int.from_bytes(raw[-4:], "little")
        mine = icrc_by_hand(raw)
        if mine != icrc:
            sys.exit(f"{c['name']}: scapy ICRC {icrc:08x}, by hand {mine:08x}: fix icrc_by_hand first")
        source = "scapy compute_icrc"
    assert int.from_bytes(raw[-4:], "little") == icrc
    return raw, icrc, source


def cxx_bytes(data, indent="    "):
    lines = []
    for i in range(0, len(data), 16):
        lines.append(indent + ", ".join(f"0x{b:02x}" for b in data[i:i + 16]) + ",")
    return "\n".join(lines)


def gid_bytes(addr, v6):
    import ipaddress
    if v6:
        return ipaddress.IPv6Address(addr).packed
    return b"\x00" * 10 + b"\xff\xff" + ipaddress.IPv4Address(addr).packed


def cxx_fields(c):
    ext = c["ext"]
    pad = (4 - len(c["payload"]) % 4) % 4
    out = [f".opcode = 0x{c['opcode']:02x}", f".solicited = {str(c['solicited']).lower()}",
           f".migreq = {str(c['migreq']).lower()}", f".pad_count = {pad}", f".pkey = 0x{c['pkey']:04x}",
           f".fecn = {str(c['fecn']).lower()}", f".becn = {str(c['becn']).lower()}",
           f".dest_qpn = 0x{c['dqpn']:06x}", f".ack_req = {str(c['ackreq']).lower()}", f".psn = 0x{c['psn']:06x}"]
    if "deth" in ext:
        q, s = ext["deth"]
        out += [".has_deth = true", f".deth_qkey = 0x{q:08x}", f".deth_src_qpn = 0x{s:06x}"]
    if "reth" in ext:
        va, rkey, ln = ext["reth"]
        out += [".has_reth = true", f".reth_va = 0x{va:016x}", f".reth_rkey = 0x{rkey:08x}",
                f".reth_dma_length = {ln}"]
    if "atomic_eth" in ext:
        va, rkey, sa, cmp = ext["atomic_eth"]
        out += [".has_atomic_eth = true", f".atomic_va = 0x{va:016x}", f".atomic_rkey = 0x{rkey:08x}",
                f".atomic_swap_add = 0x{sa:016x}", f".atomic_compare = 0x{cmp:016x}"]
    if "aeth" in ext:
        syn, msn = ext["aeth"]
        out += [".has_aeth = true", f".aeth_syndrome = 0x{syn:02x}", f".aeth_msn = 0x{msn:06x}"]
    if "atomic_ack_eth" in ext:
        out += [".has_atomic_ack_eth = true", f".atomic_ack_original = 0x{ext['atomic_ack_eth']:016x}"]
    if "immdt" in ext:
        out += [".has_immdt = true", f".imm = 0x{ext['immdt']:08x}"]
    if "ieth" in ext:
        out += [".has_ieth = true", f".ieth_rkey = 0x{ext['ieth']:08x}"]
    lines, line = [], ""
    for item in out:
        if line and len(line) + len(item) > 96:
            lines.append(line)
            line = ""
        line += item + ", "
    lines.append(line)
    return "\n      ".join(x.rstrip() for x in lines).rstrip(",")


HEADER_TOP = """\
// GENERATED by tests/unit/wire_golden/make_golden.py from scapy's RoCE layer;
// do not edit. Rerun the script (its docstring says how) and commit both.
//
// Each packet is a whole IP packet (IPv4 or IPv6, UDP to port 4791, BTH,
// extended headers, payload, pad, ICRC) with the field values it was built
// from. The structs are plain on purpose: this header does not depend on the
// codec it tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace softhca::wire::golden {

struct Flow {
  bool ipv6;
  uint8_t src_gid[16];  // IPv4 as ::ffff:a.b.c.d
  uint8_t dst_gid[16];
  uint16_t src_port;
  uint16_t dst_port;
  uint8_t traffic_class;
  uint8_t hop_limit;
  uint32_t flow_label;
};

struct Fields {
  uint8_t opcode = 0;
  bool solicited = false;
  bool migreq = false;
  uint8_t pad_count = 0;
  uint16_t pkey = 0;
  bool fecn = false;
  bool becn = false;
  uint32_t dest_qpn = 0;
  bool ack_req = false;
  uint32_t psn = 0;
  bool has_deth = false;
  uint32_t deth_qkey = 0;
  uint32_t deth_src_qpn = 0;
  bool has_reth = false;
  uint64_t reth_va = 0;
  uint32_t reth_rkey = 0;
  uint32_t reth_dma_length = 0;
  bool has_atomic_eth = false;
  uint64_t atomic_va = 0;
  uint32_t atomic_rkey = 0;
  uint64_t atomic_swap_add = 0;
  uint64_t atomic_compare = 0;
  bool has_aeth = false;
  uint8_t aeth_syndrome = 0;
  uint32_t aeth_msn = 0;
  bool has_atomic_ack_eth = false;
  uint64_t atomic_ack_original = 0;
  bool has_immdt = false;
  uint32_t imm = 0;
  bool has_ieth = false;
  uint32_t ieth_rkey = 0;
};

struct Packet {
  std::string_view name;
  Flow flow;
  Fields fields;
  std::span<const uint8_t> payload;
  std::span<const uint8_t> ip_packet;  // ICRC included
  uint32_t icrc;                       // as a number; on the wire LSB first
  std::string_view icrc_source;
};

"""


def render(packets):
    parts = [HEADER_TOP]
    for c, raw, icrc, source in packets:
        n = c["name"]
        parts.append(f"inline constexpr uint8_t k_{n}_payload[] = {{\n{cxx_bytes(c['payload']) or '    0x00,'}\n}};\n")
        parts.append(f"inline constexpr uint8_t k_{n}_ip[] = {{\n{cxx_bytes(raw)}\n}};\n")
    parts.append("\ninline constexpr Packet kPackets[] = {\n")
    for c, raw, icrc, source in packets:
        n = c["name"]
        f = c["flow"]
        src = ", ".join(f"0x{b:02x}" for b in gid_bytes(f["src"], f["v6"]))
        dst = ", ".join(f"0x{b:02x}" for b in gid_bytes(f["dst"], f["v6"]))
        payload = f"std::span<const uint8_t>(k_{n}_payload, {len(c['payload'])})"
        parts.append(
            f"    {{\"{n}\",\n"
            f"     {{{str(f['v6']).lower()}, {{{src}}},\n      {{{dst}}},\n"
            f"      {f['sport']}, {ROCE_PORT}, 0x{f['tclass']:02x}, {f['hop']}, 0x{f['flow_label']:05x}}},\n"
            f"     {{{cxx_fields(c)}}},\n"
            f"     {payload},\n     k_{n}_ip,\n     0x{icrc:08x},\n     \"{source}\"}},\n")
    parts.append("};\n\n}  // namespace softhca::wire::golden\n")
    return "".join(parts)


# tshark field -> how to get the expected value from a case.
def tshark_expectations(c):
    # Wireshark 4.0 does not know ATOMIC WRITE (0x1D): only its BTH decodes.
    ext = {} if c["opcode"] == 0x1D else c["ext"]
    exp = {"infiniband.bth.opcode": c["opcode"], "infiniband.bth.destqp": c["dqpn"], "infiniband.bth.psn": c["psn"],
           "infiniband.bth.p_key": c["pkey"], "infiniband.bth.padcnt": (4 - len(c["payload"]) % 4) % 4,
           "infiniband.bth.se": int(c["solicited"]), "infiniband.bth.m": int(c["migreq"]),
           "infiniband.bth.a": int(c["ackreq"])}
    if "deth" in ext:
        exp["infiniband.deth.q_key"] = ext["deth"][0]
        exp["infiniband.deth.srcqp"] = ext["deth"][1]
    if "reth" in ext:
        exp["infiniband.reth.va"], exp["infiniband.reth.r_key"], exp["infiniband.reth.dmalen"] = ext["reth"]
    if "atomic_eth" in ext:
        exp["infiniband.atomiceth.swapdt"] = ext["atomic_eth"][2]
        exp["infiniband.atomiceth.cmpdt"] = ext["atomic_eth"][3]
    if "aeth" in ext:
        exp["infiniband.aeth.syndrome"], exp["infiniband.aeth.msn"] = ext["aeth"]
    if "atomic_ack_eth" in ext:
        exp["infiniband.atomicacketh.origremdt"] = ext["atomic_ack_eth"]
    if "immdt" in ext:
        exp["infiniband.immdt"] = immdt(ext["immdt"]).hex()
    if "ieth" in ext:
        exp["infiniband.ieth"] = ieth(ext["ieth"]).hex()
    return exp


def parse_tshark_value(v):
    # A field that Wireshark adds twice comes back as "a,a".
    v = v.split(",")[0].strip()
    if v in ("True", "False"):
        return int(v == "True")
    if ":" in v and all(len(x) == 2 for x in v.split(":")):
        return v.replace(":", "")
    try:
        return int(v, 0)
    except ValueError:
        return v


def check_with_tshark(packets):
    with tempfile.TemporaryDirectory() as tmp:
        pcap = os.path.join(tmp, "golden.pcap")
        frames = [Ether(dst="02:00:00:00:00:02", src="02:00:00:00:00:01") / (IPv6(raw) if c["flow"]["v6"] else IP(raw))
                  for c, raw, _, _ in packets]
        wrpcap(pcap, frames)
        failures = 0
        for index, (c, raw, icrc, _) in enumerate(packets, start=1):
            exp = tshark_expectations(c)
            fields = list(exp) + ["infiniband.invariant.crc", "_ws.malformed", "_ws.expert"]
            cmd = ["tshark", "-r", pcap, "-Y", f"frame.number == {index}", "--disable-protocol", "rpcordma",
                   "-T", "fields", "-E", "separator=|"] + sum((["-e", f] for f in fields), [])
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.rstrip("\n").split("|")
            got = dict(zip(fields, out))
            for field, want in exp.items():
                if parse_tshark_value(got[field]) != want:
                    print(f"tshark: {c['name']}: {field} = {got[field]!r}, want {want!r}", file=sys.stderr)
                    failures += 1
            # Wireshark shows the ICRC as the wire bytes read big-endian.
            shown = parse_tshark_value(got["infiniband.invariant.crc"])
            if c["opcode"] != 0x1D and shown != int.from_bytes(icrc.to_bytes(4, "little"), "big"):
                print(f"tshark: {c['name']}: ICRC shown {shown!r}", file=sys.stderr)
                failures += 1
            if got["_ws.malformed"] or got["_ws.expert"]:
                print(f"tshark: {c['name']}: malformed/expert: {got['_ws.malformed']} {got['_ws.expert']}",
                      file=sys.stderr)
                failures += 1
        if failures:
            sys.exit(f"tshark disagreed {failures} times")
        print(f"tshark: {len(packets)} packets decoded as built", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tshark", action="store_true", help="also decode every packet with tshark and compare")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden_packets.hpp"))
    args = ap.parse_args()
    packets = [(c,) + make_packet(c) for c in CASES]
    names = [c["name"] for c in CASES]
    assert len(names) == len(set(names))
    if args.tshark:
        check_with_tshark(packets)
    with open(args.out, "w") as f:
        f.write(render(packets))
    print(f"wrote {len(packets)} packets to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
