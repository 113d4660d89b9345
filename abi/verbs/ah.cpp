// Address handles, including the ones built from a received work completion.
#include <arpa/inet.h>

#include <cerrno>
#include <cstring>
#include <span>

#include "engine/address_handle.hpp"
#include "engine/device/device_info.hpp"
#include "engine/protection_domain.hpp"
#include "handles.hpp"

using namespace softhca;
using namespace softhca::abi;

namespace softhca::abi {
engine::AddressHandle* address_handle_of(ibv_ah* ah) { return to_ah(ah); }
}  // namespace softhca::abi

namespace {

// For ibv_init_ah_from_wc, a verb of the -1 + errno kind.
int fail_minus_one(int err) {
  errno = err;
  return -1;
}

// RoCE routes by GID only: an AH needs a GRH whose source GID exists (rdma-core
// and the kernel refuse anything else with EINVAL).
int check_ah_attr(const ibv_ah_attr& attr) {
  if (attr.port_num != 1 || !attr.is_global) return EINVAL;
  if (engine::device_info().gid_at(attr.grh.sgid_index) == nullptr) return EINVAL;
  return 0;
}

}  // namespace

extern "C" {

ibv_ah* ibv_create_ah(ibv_pd* pd, ibv_ah_attr* attr) {
  return pointer_verb([&]() -> ibv_ah* {
    engine::ProtectionDomain* impl_pd = to_pd(pd);
    if (impl_pd == nullptr || attr == nullptr) {
      errno = EINVAL;
      return nullptr;
    }
    if (int err = check_ah_attr(*attr)) {
      errno = err;
      return nullptr;
    }
    engine::AddressVector av{};
    std::memcpy(av.dgid, attr->grh.dgid.raw, 16);
    av.sgid_index = attr->grh.sgid_index;
    av.hop_limit = attr->grh.hop_limit;
    av.traffic_class = attr->grh.traffic_class;
    av.flow_label = attr->grh.flow_label;  // the engine keeps its 20 bits
    av.sl = attr->sl;
    av.dlid = attr->dlid;
    av.is_global = attr->is_global;
    av.port_num = attr->port_num;
    av.static_rate = attr->static_rate;
    av.src_path_bits = attr->src_path_bits;
    auto* h = new AhHandle{};
    h->impl = new engine::AddressHandle(*impl_pd, av);
    impl_pd->attach();
    h->ah.context = pd->context;
    h->ah.pd = pd;
    return &h->ah;
  });
}

int ibv_destroy_ah(ibv_ah* ah) {
  return int_verb([&] {
    engine::AddressHandle* impl = to_ah(ah);
    if (impl == nullptr) return EINVAL;
    impl->pd().detach();
    delete impl;
    delete reinterpret_cast<AhHandle*>(ah);
    return 0;
  });
}

// 0, or -1 with errno set (its man page and rdma-core; not the positive errno
// of most int verbs).
int ibv_init_ah_from_wc(ibv_context* context, uint8_t port_num, ibv_wc* wc, ibv_grh* grh, ibv_ah_attr* ah_attr) {
  if (context == nullptr || wc == nullptr || ah_attr == nullptr || port_num != 1) return fail_minus_one(EINVAL);
  std::memset(ah_attr, 0, sizeof *ah_attr);
  ah_attr->dlid = wc->slid;
  ah_attr->sl = wc->sl;
  ah_attr->src_path_bits = wc->dlid_path_bits;
  ah_attr->port_num = port_num;
  if (!(wc->wc_flags & IBV_WC_GRH)) return 0;
  if (grh == nullptr) return fail_minus_one(EINVAL);
  const auto* raw = reinterpret_cast<const uint8_t*>(grh);
  uint8_t sgid[16] = {};  // the packet's source: our reply's destination
  uint8_t dgid[16] = {};  // the packet's destination: one of our GIDs
  if (raw[20] == 0x45) {  // RoCEv2 over IPv4: the IPv4 header sits in the last 20 bytes
    sgid[10] = sgid[11] = 0xff;
    dgid[10] = dgid[11] = 0xff;
    std::memcpy(sgid + 12, raw + 20 + 12, 4);
    std::memcpy(dgid + 12, raw + 20 + 16, 4);
    ah_attr->grh.traffic_class = raw[21];
  } else {
    std::memcpy(sgid, raw + 8, 16);
    std::memcpy(dgid, raw + 24, 16);
    uint32_t vtf;
    std::memcpy(&vtf, raw, 4);
    vtf = ntohl(vtf);
    ah_attr->grh.traffic_class = static_cast<uint8_t>((vtf >> 20) & 0xFF);
    ah_attr->grh.flow_label = vtf & 0xFFFFF;
  }
  const auto index = engine::find_gid_index(std::span<const uint8_t, 16>(dgid, 16));
  if (!index) return fail_minus_one(EINVAL);
  ah_attr->is_global = 1;
  std::memcpy(ah_attr->grh.dgid.raw, sgid, 16);
  ah_attr->grh.sgid_index = static_cast<uint8_t>(*index);
  ah_attr->grh.hop_limit = 0xFF;
  return 0;
}

ibv_ah* ibv_create_ah_from_wc(ibv_pd* pd, ibv_wc* wc, ibv_grh* grh, uint8_t port_num) {
  if (pd == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  ibv_ah_attr attr;
  if (ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &attr) != 0) return nullptr;  // errno is set
  return ibv_create_ah(pd, &attr);
}

}  // extern "C"
