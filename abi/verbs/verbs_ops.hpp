// The functions the shim installs in ibv_context.ops and verbs_context (the
// slots inline verbs call), defined in the files of their verb families.
#pragma once

#include <infiniband/verbs.h>

#include "handles.hpp"

namespace softhca::abi {

int poll_cq_op(ibv_cq* cq, int num_entries, ibv_wc* wc);
int req_notify_cq_op(ibv_cq* cq, int solicited_only);
int post_send_op(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr);
int post_recv_op(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr);
int post_srq_recv_op(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad_wr);
int post_srq_ops_op(ibv_srq* srq, ibv_ops_wr* op, ibv_ops_wr** bad_op);
ibv_cq_ex* create_cq_ex_op(ibv_context* context, ibv_cq_init_attr_ex* attr);
ibv_qp* create_qp_ex_op(ibv_context* context, ibv_qp_init_attr_ex* attr);
// Flow steering of raw packet QPs (flow.cpp).
ibv_flow* create_flow_op(ibv_qp* qp, ibv_flow_attr* flow_attr);
int destroy_flow_op(ibv_flow* flow);
// Receive work queues and indirection tables of RSS QPs (wq.cpp).
ibv_wq* create_wq_op(ibv_context* context, ibv_wq_init_attr* attr);
int modify_wq_op(ibv_wq* wq, ibv_wq_attr* attr);
int destroy_wq_op(ibv_wq* wq);
ibv_rwq_ind_table* create_rwq_ind_table_op(ibv_context* context, ibv_rwq_ind_table_init_attr* attr);
int destroy_rwq_ind_table_op(ibv_rwq_ind_table* table);
int advise_mr_op(ibv_pd* pd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge* sg_list, uint32_t num_sge);
// Device memory (device_memory.cpp).
ibv_dm* alloc_dm_op(ibv_context* context, ibv_alloc_dm_attr* attr);
int free_dm_op(ibv_dm* dm);
ibv_mr* reg_dm_mr_op(ibv_pd* pd, ibv_dm* dm, uint64_t dm_offset, size_t length, unsigned int access);
// XRC (xrc.cpp, srq.cpp).
ibv_xrcd* open_xrcd_op(ibv_context* context, ibv_xrcd_init_attr* attr);
int close_xrcd_op(ibv_xrcd* xrcd);
ibv_srq* create_srq_ex_op(ibv_context* context, ibv_srq_init_attr_ex* attr);
int get_srq_num_op(ibv_srq* srq, uint32_t* srq_num);
ibv_qp* open_qp_op(ibv_context* context, ibv_qp_open_attr* attr);
// The application's ibv_qp for engine QP `impl` (created or opened): no PD,
// CQs or SRQ yet; the caller sets those it has.
ibv_qp* adopt_qp(engine::QueuePair* impl, ibv_context* context, void* qp_context);
// Thread and parent domains (parent_domain.cpp). ibv_dealloc_pd hands a
// parent domain to dealloc_parent_domain.
ibv_td* alloc_td_op(ibv_context* context, ibv_td_init_attr* init_attr);
int dealloc_td_op(ibv_td* td);
ibv_pd* alloc_parent_domain_op(ibv_context* context, ibv_parent_domain_init_attr* attr);
int dealloc_parent_domain(ibv_pd* pd);
// Given to the engine context so UD work requests can name their ibv_ah.
engine::AddressHandle* address_handle_of(ibv_ah* ah);
// Memory windows (mw.cpp); the engine finds a bind WR's window and MR with the translators.
ibv_mw* alloc_mw_op(ibv_pd* pd, ibv_mw_type type);
int dealloc_mw_op(ibv_mw* mw);
int bind_mw_op(ibv_qp* qp, ibv_mw* mw, ibv_mw_bind* mw_bind);
engine::MemoryWindow* memory_window_of(ibv_mw* mw);
engine::MemoryRegion* memory_region_of(ibv_mr* mr);

}  // namespace softhca::abi
