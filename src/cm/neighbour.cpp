// rtnetlink requests and replies for the next hop of a route and its
// neighbour entry. Messages are read with memcpy: a reply buffer carries no
// alignment promise for the structs inside it.
#include "cm/neighbour.hpp"

#include <linux/neighbour.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>

#include <algorithm>
#include <cstring>

namespace softhca::cm::neighbour {
namespace {

constexpr std::size_t align4(std::size_t n) { return (n + 3) & ~std::size_t{3}; }
constexpr std::size_t kHeader = align4(sizeof(nlmsghdr));  // NLMSG_HDRLEN, unsigned

std::size_t address_size(uint8_t family) { return family == AF_INET ? 4 : 16; }
const uint8_t* address_bytes(const IpAddress& ip) { return ip.addr.data() + (ip.family == AF_INET ? 12 : 0); }

IpAddress address_from(uint8_t family, std::span<const uint8_t> bytes) {
  IpAddress ip;
  ip.family = family;
  if (family == AF_INET) {
    ip.addr[10] = ip.addr[11] = 0xff;
    std::memcpy(ip.addr.data() + 12, bytes.data(), 4);
  } else {
    std::memcpy(ip.addr.data(), bytes.data(), 16);
  }
  return ip;
}

// Appends one attribute (padded) to a message under construction.
void put_attr(std::vector<uint8_t>& out, uint16_t type, const void* value, std::size_t len) {
  rtattr a{};
  a.rta_len = static_cast<unsigned short>(sizeof a + len);
  a.rta_type = type;
  const std::size_t at = out.size();
  out.resize(at + align4(sizeof a + len), 0);
  std::memcpy(out.data() + at, &a, sizeof a);
  std::memcpy(out.data() + at + sizeof a, value, len);
}

// A request: the netlink header, the family header `body`, and the address
// attribute; the length is set by finish().
template <typename Body>
std::vector<uint8_t> request(uint16_t type, uint32_t seq, const Body& body, uint16_t attr, const IpAddress& ip) {
  std::vector<uint8_t> out(kHeader + align4(sizeof body), 0);
  nlmsghdr h{};
  h.nlmsg_type = type;
  h.nlmsg_flags = NLM_F_REQUEST;
  h.nlmsg_seq = seq;
  std::memcpy(out.data(), &h, sizeof h);
  std::memcpy(out.data() + kHeader, &body, sizeof body);
  put_attr(out, attr, address_bytes(ip), address_size(ip.family));
  return out;
}

std::vector<uint8_t> finish(std::vector<uint8_t> out) {
  const auto len = static_cast<uint32_t>(out.size());
  std::memcpy(out.data(), &len, sizeof len);  // nlmsg_len comes first
  return out;
}

// The message of `reply` that answers `seq`: its type and payload. An
// NLMSG_ERROR answer becomes its error (an acknowledgement without data, a
// bad_message).
struct Answer {
  uint16_t type = 0;
  std::span<const uint8_t> payload;
};
Result<Answer> find_answer(std::span<const uint8_t> reply, uint32_t seq) {
  while (reply.size() >= kHeader) {
    nlmsghdr h;
    std::memcpy(&h, reply.data(), sizeof h);
    if (h.nlmsg_len < kHeader || h.nlmsg_len > reply.size()) break;
    const auto payload = reply.subspan(kHeader, h.nlmsg_len - kHeader);
    if (h.nlmsg_seq == seq) {
      if (h.nlmsg_type != NLMSG_ERROR) return Answer{h.nlmsg_type, payload};
      int32_t error = 0;
      if (payload.size() < sizeof error) break;
      std::memcpy(&error, payload.data(), sizeof error);
      return fail(error < 0 ? static_cast<std::errc>(-error) : std::errc::bad_message);
    }
    reply = reply.subspan(std::min<std::size_t>(align4(h.nlmsg_len), reply.size()));
  }
  return fail(std::errc::bad_message);
}

// Calls f(type, value) for each attribute after a family header of `header` bytes.
template <typename F>
bool for_each_attr(std::span<const uint8_t> payload, std::size_t header, F&& f) {
  if (payload.size() < header) return false;
  auto rest = payload.subspan(align4(header) <= payload.size() ? align4(header) : payload.size());
  while (rest.size() >= sizeof(rtattr)) {
    rtattr a;
    std::memcpy(&a, rest.data(), sizeof a);
    if (a.rta_len < sizeof(rtattr) || a.rta_len > rest.size()) return false;
    f(a.rta_type, rest.subspan(sizeof(rtattr), a.rta_len - sizeof(rtattr)));
    rest = rest.subspan(std::min<std::size_t>(align4(a.rta_len), rest.size()));
  }
  return true;
}

}  // namespace

Verdict judge(uint16_t nud_state) {
  constexpr uint16_t kValid = NUD_REACHABLE | NUD_STALE | NUD_DELAY | NUD_PROBE | NUD_PERMANENT | NUD_NOARP;
  if ((nud_state & kValid) != 0) return Verdict::kValid;
  if ((nud_state & NUD_INCOMPLETE) != 0) return Verdict::kResolving;
  return Verdict::kIdle;
}

std::vector<uint8_t> route_request(const IpAddress& dst, uint32_t seq) {
  rtmsg r{};
  r.rtm_family = dst.family;
  r.rtm_dst_len = static_cast<unsigned char>(address_size(dst.family) * 8);
  auto out = request(RTM_GETROUTE, seq, r, RTA_DST, dst);
  // A scoped (link-local) IPv6 address is only routed on its interface.
  if (dst.family == AF_INET6 && dst.scope_id != 0) {
    const uint32_t oif = dst.scope_id;
    put_attr(out, RTA_OIF, &oif, sizeof oif);
  }
  return finish(std::move(out));
}

Result<NextHop> parse_route_reply(std::span<const uint8_t> reply, uint32_t seq, const IpAddress& dst) {
  auto answer = find_answer(reply, seq);
  if (!answer) return fail(answer.error());
  if (answer->type != RTM_NEWROUTE || answer->payload.size() < sizeof(rtmsg)) return fail(std::errc::bad_message);
  rtmsg r;
  std::memcpy(&r, answer->payload.data(), sizeof r);
  NextHop hop;
  hop.addr = dst;
  hop.addr.port = 0;
  hop.local = r.rtm_type == RTN_LOCAL;
  const std::size_t alen = address_size(dst.family);
  const bool ok = for_each_attr(answer->payload, sizeof r, [&](uint16_t type, std::span<const uint8_t> value) {
    if (type == RTA_OIF && value.size() >= sizeof(uint32_t)) {
      uint32_t oif = 0;
      std::memcpy(&oif, value.data(), sizeof oif);
      hop.ifindex = static_cast<int>(oif);
    } else if (type == RTA_GATEWAY && value.size() == alen) {
      hop.addr = address_from(dst.family, value);
    } else if (type == RTA_VIA && value.size() >= sizeof(rtvia)) {
      // A gateway of the other family (IPv4 routed via an IPv6 next hop):
      // its own neighbour entry is the one to wait for.
      uint16_t family = 0;
      std::memcpy(&family, value.data(), sizeof family);
      const auto bytes = value.subspan(sizeof family);
      if ((family == AF_INET || family == AF_INET6) && bytes.size() == address_size(static_cast<uint8_t>(family)))
        hop.addr = address_from(static_cast<uint8_t>(family), bytes);
    }
  });
  if (!ok || (hop.ifindex == 0 && !hop.local)) return fail(std::errc::bad_message);
  return hop;
}

std::vector<uint8_t> neighbour_request(const NextHop& hop, uint32_t seq) {
  ndmsg n{};
  n.ndm_family = hop.addr.family;
  n.ndm_ifindex = hop.ifindex;
  return finish(request(RTM_GETNEIGH, seq, n, NDA_DST, hop.addr));
}

Result<uint16_t> parse_neighbour_reply(std::span<const uint8_t> reply, uint32_t seq) {
  auto answer = find_answer(reply, seq);
  if (!answer) {
    if (answer.error() == std::errc::no_such_file_or_directory) return uint16_t{NUD_NONE};
    return fail(answer.error());
  }
  if (answer->type != RTM_NEWNEIGH || answer->payload.size() < sizeof(ndmsg)) return fail(std::errc::bad_message);
  ndmsg n;
  std::memcpy(&n, answer->payload.data(), sizeof n);
  return n.ndm_state;
}

}  // namespace softhca::cm::neighbour
