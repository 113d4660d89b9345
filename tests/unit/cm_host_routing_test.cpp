// Routing CM MADs from other hosts to the process of this host they concern:
// requests by listener (service ID + IP header), the rest by the comm ID
// they name as ours; and the envelope a relayed MAD travels in.
#include "cm/host_routing.hpp"

#include <gtest/gtest.h>
#include <netinet/in.h>

namespace softhca::cm {
namespace {

constexpr uint16_t kPsTcp = 0x0106;
constexpr uint16_t kPsUdp = 0x0111;

Gid v4(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
  Gid g{};
  g[10] = g[11] = 0xff;
  g[12] = a;
  g[13] = b;
  g[14] = c;
  g[15] = d;
  return g;
}

template <std::size_t N>
void put_ip_header(std::array<uint8_t, N>& private_data, uint8_t version, const Gid& src, const Gid& dst) {
  IpHeader hdr;
  hdr.ip_version = version;
  hdr.src_port = 40000;
  hdr.src = src;
  hdr.dst = dst;
  encode_ip_header(hdr, std::span<uint8_t, kIpHeaderSize>(private_data.data(), kIpHeaderSize));
}

TEST(CommIds, CarryTheirOwnersHandle) {
  for (uint32_t owner : {1u, 2u, 300u, kMaxCmProcs}) {
    for (uint32_t counter : {0u, 1u, kCommIdCounterMask, kCommIdCounterMask + 5}) {
      const uint32_t id = make_comm_id(owner, counter);
      EXPECT_NE(id, 0u);
      EXPECT_EQ(comm_id_owner(id), owner);
      EXPECT_EQ(id & kCommIdCounterMask, counter & kCommIdCounterMask);
    }
  }
  EXPECT_EQ(comm_id_owner(make_comm_id(3, 7)), 3u);
  EXPECT_NE(make_comm_id(3, 7), make_comm_id(4, 7));
}

TEST(MadRoutes, ARequestGoesToTheListenerOfItsServiceAndAddress) {
  ReqMsg req;
  req.service_id = service_id(kPsTcp, 7471);
  put_ip_header(req.private_data, 4, v4(198, 18, 0, 2), v4(198, 18, 0, 1));
  const MadRoute r = route_of(Mad{1, CmMessage(req)});
  ASSERT_EQ(r.by, MadRoute::By::kListener);
  EXPECT_EQ(r.listener.ps, kPsTcp);
  EXPECT_EQ(r.listener.port, 7471);
  EXPECT_EQ(r.listener.family, AF_INET);
  EXPECT_FALSE(r.listener.wildcard);
  EXPECT_EQ(r.listener.addr, v4(198, 18, 0, 1));
}

TEST(MadRoutes, ASidrRequestOverIpv6GoesToItsListener) {
  SidrReqMsg req;
  req.service_id = service_id(kPsUdp, 7000);
  Gid src{}, dst{};
  src[0] = dst[0] = 0xfd;
  src[15] = 2;
  dst[15] = 1;
  put_ip_header(req.private_data, 6, src, dst);
  const MadRoute r = route_of(Mad{1, CmMessage(req)});
  ASSERT_EQ(r.by, MadRoute::By::kListener);
  EXPECT_EQ(r.listener.ps, kPsUdp);
  EXPECT_EQ(r.listener.family, AF_INET6);
  EXPECT_EQ(r.listener.addr, dst);
}

TEST(MadRoutes, RequestsWithoutAnIpHeaderOrIpServiceGoNowhere) {
  ReqMsg native;  // an IB service ID, not rdma_cm's IP port spaces
  native.service_id = 0x1000000000000001ULL;
  put_ip_header(native.private_data, 4, v4(1, 2, 3, 4), v4(5, 6, 7, 8));
  EXPECT_EQ(route_of(Mad{1, CmMessage(native)}).by, MadRoute::By::kNowhere);
  ReqMsg bad_header;
  bad_header.service_id = service_id(kPsTcp, 1);
  bad_header.private_data[0] = 0x55;  // cma version must be 0
  EXPECT_EQ(route_of(Mad{1, CmMessage(bad_header)}).by, MadRoute::By::kNowhere);
}

TEST(MadRoutes, EveryOtherMessageGoesByTheCommIdItNamesAsOurs) {
  const uint32_t ours = make_comm_id(5, 42);
  const uint32_t theirs = make_comm_id(9, 1);
  RepMsg rep;
  rep.local_comm_id = theirs;
  rep.remote_comm_id = ours;
  RejMsg rej;
  rej.local_comm_id = theirs;
  rej.remote_comm_id = ours;
  RtuMsg rtu;
  rtu.local_comm_id = theirs;
  rtu.remote_comm_id = ours;
  DreqMsg dreq;
  dreq.local_comm_id = theirs;
  dreq.remote_comm_id = ours;
  DrepMsg drep;
  drep.local_comm_id = theirs;
  drep.remote_comm_id = ours;
  MraMsg mra;
  mra.local_comm_id = theirs;
  mra.remote_comm_id = ours;
  SidrRepMsg sidr_rep;
  sidr_rep.request_id = ours;
  for (const CmMessage& m : {CmMessage(rep), CmMessage(rej), CmMessage(rtu), CmMessage(dreq), CmMessage(drep),
                             CmMessage(mra), CmMessage(sidr_rep)}) {
    const MadRoute r = route_of(Mad{7, m});
    EXPECT_EQ(r.by, MadRoute::By::kCommId) << message_name(m);
    EXPECT_EQ(r.comm_id, ours) << message_name(m);
  }
}

TEST(MadRoutes, ACommIdOfNoProcessGoesNowhere) {
  RejMsg rej;  // e.g. a REJ to a REQ whose sender put no id of ours
  rej.remote_comm_id = 0x1234;  // owner bits 0
  EXPECT_EQ(route_of(Mad{1, CmMessage(rej)}).by, MadRoute::By::kNowhere);
}

TEST(RelayedMads, RoundTripAndAreToldFromBareMads) {
  RelayedMad r;
  r.remote = v4(198, 18, 0, 2);
  r.local = v4(198, 18, 0, 1);
  for (size_t i = 0; i < r.mad.size(); ++i) r.mad[i] = static_cast<uint8_t>(i);
  const auto bytes = encode_relayed(r);
  ASSERT_EQ(bytes.size(), kRelayedMadSize);
  const auto back = decode_relayed(bytes);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->remote, r.remote);
  EXPECT_EQ(back->local, r.local);
  EXPECT_EQ(back->mad, r.mad);
  // A bare MAD, a truncated envelope and a wrong tag are not envelopes.
  EXPECT_FALSE(decode_relayed(std::span<const uint8_t>(r.mad)).has_value());
  EXPECT_FALSE(decode_relayed(std::span<const uint8_t>(bytes).first(bytes.size() - 1)).has_value());
  auto wrong = bytes;
  wrong[0] = 'X';
  EXPECT_FALSE(decode_relayed(wrong).has_value());
}

}  // namespace
}  // namespace softhca::cm
