// The extended verbs (ibv_cq_ex, ibv_qp_ex) and the creation helpers they
// share with the legacy verbs.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

#include "handles.hpp"

namespace softhca::abi {

// cq.cpp: the one creation path of ibv_create_cq and ibv_create_cq_ex. Returns
// the new CQ, or nullptr with errno set. `wc_flags` and `flags` are already
// validated by the caller (ibv_cq_init_attr_ex semantics).
ibv_cq_ex* create_cq_common(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                            int comp_vector, uint64_t wc_flags, uint32_t flags);

// cq_ex.cpp: fills start_poll/next_poll/end_poll and every read_* pointer.
void install_cq_poll_ops(CqHandle& h);

// qp_ex.cpp: 0, or EOPNOTSUPP when `send_ops_flags` asks for an operation we
// do not offer on a QP of this type.
int check_send_ops_flags(ibv_qp_type type, uint64_t send_ops_flags);
// qp_ex.cpp: gives a created QP its batch storage (sized by the granted caps)
// and fills every wr_* pointer. Throws std::bad_alloc.
void enable_qp_ex(QpHandle& h, uint64_t send_ops_flags, const ibv_qp_cap& granted);

}  // namespace softhca::abi
