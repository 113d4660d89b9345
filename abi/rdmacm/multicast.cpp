// Multicast on rdma_cm ids: not in this slice yet (issue 3 keeps it for UD ids
// with the verbs' ibv_attach_mcast). The calls exist and fail cleanly.
#include "cm_handles.hpp"

using softhca::rdmacm::set_errno;

extern "C" {

int rdma_join_multicast(rdma_cm_id* id, sockaddr* addr, void* /*context*/) {
  if (id == nullptr || addr == nullptr) return set_errno(EINVAL);
  return set_errno(ENOSYS);
}

int rdma_join_multicast_ex(rdma_cm_id* id, rdma_cm_join_mc_attr_ex* mc_join_attr, void* /*context*/) {
  if (id == nullptr || mc_join_attr == nullptr) return set_errno(EINVAL);
  return set_errno(ENOSYS);
}

int rdma_leave_multicast(rdma_cm_id* id, sockaddr* addr) {
  if (id == nullptr || addr == nullptr) return set_errno(EINVAL);
  return set_errno(EADDRNOTAVAIL);  // never joined
}

}  // extern "C"
