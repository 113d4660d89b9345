// Public verbs softhca does not implement (yet). Each one fails the way the
// man page / rdma-core 44 fails when the device lacks the feature, so callers
// take their "not supported" path instead of crashing:
//   pointer verbs -> nullptr, errno = EOPNOTSUPP
//   int verbs     -> EOPNOTSUPP (errno set as well, as rdma-core's ECE code does)
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdint>

namespace {

template <typename T>
T* fail_pointer() {
  errno = EOPNOTSUPP;
  return nullptr;
}

int fail_int() {
  errno = EOPNOTSUPP;
  return EOPNOTSUPP;
}

}  // namespace

extern "C" {

// --- dma-buf memory (IBVERBS_1.12): there is no device to share a dma-buf with.
struct ibv_mr* ibv_reg_dmabuf_mr(struct ibv_pd* /*pd*/, uint64_t /*offset*/, size_t /*length*/, uint64_t /*iova*/,
                                 int /*fd*/, int /*access*/) {
  return fail_pointer<ibv_mr>();
}

// --- Enhanced Connection Establishment (IBVERBS_1.10): no vendor options to
// negotiate. rdma-core answers EOPNOTSUPP for a device without ECE too, and
// librdmacm / pyverbs treat that as "no ECE".
int ibv_query_ece(struct ibv_qp* /*qp*/, struct ibv_ece* /*ece*/) { return fail_int(); }
int ibv_set_ece(struct ibv_qp* /*qp*/, struct ibv_ece* /*ece*/) { return fail_int(); }

// --- RoCE L2 resolution: rdma-core looks up the neighbour (MAC, VLAN) of a
// destination GID over netlink for kernel providers that build Ethernet
// headers themselves. softhca builds no Ethernet frames, so there is nothing to
// resolve. rdma-core reports its own failures from here as negative errno
// values (-EINVAL, -EHOSTUNREACH) and callers only test for non-zero, so keep
// that convention.
int ibv_resolve_eth_l2_from_gid(struct ibv_context* /*context*/, struct ibv_ah_attr* /*attr*/,
                                uint8_t /*eth_mac*/[ETHERNET_LL_SIZE], uint16_t* /*vid*/) {
  errno = EOPNOTSUPP;
  return -EOPNOTSUPP;
}

}  // extern "C"
