// rdma_getaddrinfo / rdma_freeaddrinfo: getaddrinfo(3) with rdma_cm's hints
// (port space, QP type, RAI_* flags) translated both ways, as librdmacm does.
// There is no ibacm here, so no route (ai_route) is ever filled in; errors are
// getaddrinfo's EAI_* codes, as with librdmacm.
#include <netdb.h>

#include <cstdlib>
#include <cstring>

#include "cm_handles.hpp"

namespace {

void to_addrinfo_hints(const rdma_addrinfo& rai, addrinfo& ai) {
  std::memset(&ai, 0, sizeof ai);
  if (rai.ai_flags & RAI_PASSIVE) ai.ai_flags = AI_PASSIVE;
  if (rai.ai_flags & RAI_NUMERICHOST) ai.ai_flags |= AI_NUMERICHOST;
  if (rai.ai_family != AF_IB) ai.ai_family = rai.ai_family;
  switch (rai.ai_qp_type) {
    case IBV_QPT_RC:
    case IBV_QPT_UC:
    case IBV_QPT_XRC_SEND:
    case IBV_QPT_XRC_RECV:
      ai.ai_socktype = SOCK_STREAM;
      break;
    case IBV_QPT_UD:
      ai.ai_socktype = SOCK_DGRAM;
      break;
    default:
      break;
  }
  switch (rai.ai_port_space) {
    case RDMA_PS_TCP:
      ai.ai_protocol = IPPROTO_TCP;
      break;
    case RDMA_PS_IPOIB:
    case RDMA_PS_UDP:
      ai.ai_protocol = IPPROTO_UDP;
      break;
    case RDMA_PS_IB:
      if (ai.ai_socktype == SOCK_STREAM) ai.ai_protocol = IPPROTO_TCP;
      else if (ai.ai_socktype == SOCK_DGRAM) ai.ai_protocol = IPPROTO_UDP;
      break;
    default:
      break;
  }
}

int copy_addr(sockaddr** dst, socklen_t* dst_len, const sockaddr* src, socklen_t len) {
  *dst = static_cast<sockaddr*>(std::malloc(len));
  if (*dst == nullptr) return EAI_MEMORY;
  std::memcpy(*dst, src, len);
  *dst_len = len;
  return 0;
}

int from_addrinfo(rdma_addrinfo& rai, const rdma_addrinfo& hints, const addrinfo& ai) {
  if (hints.ai_qp_type != 0) {
    rai.ai_qp_type = hints.ai_qp_type;
  } else if (ai.ai_socktype == SOCK_STREAM) {
    rai.ai_qp_type = IBV_QPT_RC;
  } else if (ai.ai_socktype == SOCK_DGRAM) {
    rai.ai_qp_type = IBV_QPT_UD;
  }
  if (hints.ai_port_space != 0) {
    rai.ai_port_space = hints.ai_port_space;
  } else if (ai.ai_protocol == IPPROTO_TCP) {
    rai.ai_port_space = RDMA_PS_TCP;
  } else if (ai.ai_protocol == IPPROTO_UDP) {
    rai.ai_port_space = RDMA_PS_UDP;
  }
  rai.ai_family = ai.ai_family;
  if (ai.ai_flags & AI_PASSIVE) {
    rai.ai_flags = RAI_PASSIVE;
    if (ai.ai_canonname != nullptr) rai.ai_src_canonname = strdup(ai.ai_canonname);
    return copy_addr(&rai.ai_src_addr, &rai.ai_src_len, ai.ai_addr, ai.ai_addrlen);
  }
  if (ai.ai_canonname != nullptr) rai.ai_dst_canonname = strdup(ai.ai_canonname);
  return copy_addr(&rai.ai_dst_addr, &rai.ai_dst_len, ai.ai_addr, ai.ai_addrlen);
}

}  // namespace

extern "C" {

int rdma_getaddrinfo(const char* node, const char* service, const rdma_addrinfo* hints, rdma_addrinfo** res) {
  static const rdma_addrinfo kNoHints{};
  if (res == nullptr || (node == nullptr && service == nullptr && hints == nullptr)) {
    errno = EINVAL;
    return -1;
  }
  auto* rai = static_cast<rdma_addrinfo*>(std::calloc(1, sizeof(rdma_addrinfo)));
  if (rai == nullptr) {
    errno = ENOMEM;
    return -1;
  }
  const rdma_addrinfo& h = hints != nullptr ? *hints : kNoHints;
  int ret = 0;
  if (node != nullptr || service != nullptr) {
    addrinfo ai_hints{};
    addrinfo* ai = nullptr;
    if (hints != nullptr) {
      to_addrinfo_hints(h, ai_hints);
      ret = getaddrinfo(node, service, &ai_hints, &ai);
    } else {
      ret = getaddrinfo(node, service, nullptr, &ai);
    }
    if (ret == 0) {
      // getaddrinfo does not echo AI_PASSIVE back; carry it over as librdmacm does.
      if (hints != nullptr && (h.ai_flags & RAI_PASSIVE)) ai->ai_flags |= AI_PASSIVE;
      ret = from_addrinfo(*rai, h, *ai);
      freeaddrinfo(ai);
    }
  } else {
    rai->ai_flags = h.ai_flags;
    rai->ai_family = h.ai_family;
    rai->ai_qp_type = h.ai_qp_type;
    rai->ai_port_space = h.ai_port_space;
    if (h.ai_dst_len != 0) ret = copy_addr(&rai->ai_dst_addr, &rai->ai_dst_len, h.ai_dst_addr, h.ai_dst_len);
  }
  if (ret == 0 && rai->ai_src_len == 0 && h.ai_src_len != 0)
    ret = copy_addr(&rai->ai_src_addr, &rai->ai_src_len, h.ai_src_addr, h.ai_src_len);
  if (ret != 0) {
    rdma_freeaddrinfo(rai);
    return ret;
  }
  *res = rai;
  return 0;
}

void rdma_freeaddrinfo(rdma_addrinfo* res) {
  while (res != nullptr) {
    rdma_addrinfo* next = res->ai_next;
    std::free(res->ai_connect);
    std::free(res->ai_route);
    std::free(res->ai_src_canonname);
    std::free(res->ai_dst_canonname);
    std::free(res->ai_src_addr);
    std::free(res->ai_dst_addr);
    std::free(res);
    res = next;
  }
}

}  // extern "C"
