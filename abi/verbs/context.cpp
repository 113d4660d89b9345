// ibv_open_device / ibv_close_device and the context's op tables, plus the async
// event verbs. The op tables follow rdma-core's rule: every slot an inline verb
// calls without a NULL check holds a working function.
#include <pthread.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "common/log.hpp"
#include "device_list.hpp"
#include "device_query.hpp"
#include "engine/completion_queue.hpp"
#include "engine/context.hpp"
#include "common/limits.hpp"
#include "engine/qp/queue_pair.hpp"
#include "engine/shared_receive_queue.hpp"
#include "handles.hpp"
#include "verbs_ops.hpp"

#undef ibv_query_port

extern "C" int ibv_query_port(ibv_context* context, uint8_t port_num, struct _compat_ibv_port_attr* port_attr);

namespace softhca::abi {
namespace {

void fill_ops(ContextHandle& h) {
  verbs_context& v = h.vctx;
  ibv_context_ops& ops = v.context.ops;
  ops._compat_query_device = ibv_query_device;
  ops._compat_query_port = ibv_query_port;
  ops.poll_cq = poll_cq_op;
  ops.req_notify_cq = req_notify_cq_op;
  ops.post_send = post_send_op;
  ops.post_recv = post_recv_op;
  ops.post_srq_recv = post_srq_recv_op;
  ops.alloc_mw = alloc_mw_op;
  ops.bind_mw = bind_mw_op;
  ops.dealloc_mw = dealloc_mw_op;
  v.query_port = query_port_op;
  v.query_device_ex = query_device_ex_op;
  v.query_rt_values = query_rt_values_op;
  v.create_cq_ex = create_cq_ex_op;
  v.create_qp_ex = create_qp_ex_op;
  v.open_xrcd = open_xrcd_op;
  v.close_xrcd = close_xrcd_op;
  v.create_srq_ex = create_srq_ex_op;
  v.get_srq_num = get_srq_num_op;
  v.post_srq_ops = post_srq_ops_op;
  v.open_qp = open_qp_op;
  v.advise_mr = advise_mr_op;
  v.alloc_dm = alloc_dm_op;
  v.free_dm = free_dm_op;
  v.reg_dm_mr = reg_dm_mr_op;
  v.alloc_td = alloc_td_op;
  v.dealloc_td = dealloc_td_op;
  v.alloc_parent_domain = alloc_parent_domain_op;
  v.create_wq = create_wq_op;
  v.modify_wq = modify_wq_op;
  v.destroy_wq = destroy_wq_op;
  v.create_rwq_ind_table = create_rwq_ind_table_op;
  v.destroy_rwq_ind_table = destroy_rwq_ind_table_op;
  v.ibv_create_flow = create_flow_op;
  v.ibv_destroy_flow = destroy_flow_op;
  // Apps built against libibverbs 1.1.8 reach the flow verbs through these.
  v.ABI_placeholder1 = reinterpret_cast<void (*)(void)>(create_flow_op);
  v.ABI_placeholder2 = reinterpret_cast<void (*)(void)>(destroy_flow_op);
  v.sz = sizeof(verbs_context);
}

// The application's context onto an engine context (opened or imported).
ibv_context* make_context_handle(ibv_device* device, engine::Context* impl) {
  auto* h = new ContextHandle{};
  h->impl = impl;
  h->impl->set_ah_translator(address_handle_of);
  h->impl->set_window_translators(memory_window_of, memory_region_of);
  fill_ops(*h);
  ibv_context& c = h->vctx.context;
  c.device = device;
  c.cmd_fd = h->impl->cmd_fd();
  c.async_fd = h->impl->async_fd();
  c.num_comp_vectors = limits::kNumCompVectors;
  pthread_mutex_init(&c.mutex, nullptr);
  c.abi_compat = __VERBS_ABI_IS_EXTENDED;
  // Our librdmacm finds the engine behind the context here (rdma-core
  // keeps libibverbs' own private state in this field; ours has none):
  // the CM sends and receives its MADs through this context's udp link,
  // the one link of the process (abi/rdmacm/device.cpp).
  h->vctx.priv = reinterpret_cast<verbs_ex_private*>(h->impl);
  return &c;
}

}  // namespace
}  // namespace softhca::abi

using namespace softhca;
using namespace softhca::abi;

extern "C" {

ibv_context* ibv_open_device(ibv_device* device) {
  return pointer_verb([&]() -> ibv_context* {
    if (!is_softhca_device(device)) {
      errno = ENODEV;
      return nullptr;
    }
    auto ctx = engine::Context::open();
    if (!ctx) {
      errno = to_errno(ctx.error());
      return nullptr;
    }
    return make_context_handle(device, *ctx);
  });
}

// Another context onto the same device context (in this process: a dup of
// its cmd_fd), sharing its objects: ibv_import_pd / _mr / _dm find them.
// As in rdma-core, the fd passes to the new context: it is its cmd_fd, and
// ibv_close_device closes it.
ibv_context* ibv_import_device(int cmd_fd) {
  return pointer_verb([&]() -> ibv_context* {
    auto ctx = engine::Context::import(cmd_fd);
    if (!ctx) {
      errno = to_errno(ctx.error());
      return nullptr;
    }
    ibv_context* c = make_context_handle(&device_handle().device, *ctx);
    // The application's fd is this context's now: it shows as cmd_fd and
    // ibv_close_device closes it.
    to_context_handle(c)->imported_fd = cmd_fd;
    c->cmd_fd = cmd_fd;
    return c;
  });
}

int ibv_close_device(ibv_context* context) {
  return int_verb([&] {
    ContextHandle* h = to_context_handle(context);
    if (h == nullptr) return EINVAL;
    pthread_mutex_destroy(&h->vctx.context.mutex);
    h->impl->release();  // the context lives on while an importer holds it
    if (h->imported_fd >= 0) ::close(h->imported_fd);
    delete h;
    return 0;
  });
}

int ibv_get_async_event(ibv_context* context, ibv_async_event* event) {
  // Returns 0 or -1 with errno, as rdma-core does.
  engine::Context* ctx = to_context(context);
  if (ctx == nullptr || event == nullptr) {
    errno = EINVAL;
    return -1;
  }
  auto got = ctx->get_async_event();
  if (!got) {
    errno = to_errno(got.error());
    return -1;
  }
  std::memset(event, 0, sizeof *event);
  event->event_type = got->type;
  switch (got->type) {
    case IBV_EVENT_CQ_ERR:
      event->element.cq = static_cast<ibv_cq*>(got->handle);
      if (auto* cq = to_cq(event->element.cq)) cq->async_events.reported();
      break;
    case IBV_EVENT_SRQ_ERR:
    case IBV_EVENT_SRQ_LIMIT_REACHED:
      event->element.srq = static_cast<ibv_srq*>(got->handle);
      if (auto* srq = to_srq(event->element.srq)) srq->async_events.reported();
      break;
    case IBV_EVENT_PORT_ACTIVE:
    case IBV_EVENT_PORT_ERR:
    case IBV_EVENT_LID_CHANGE:
    case IBV_EVENT_PKEY_CHANGE:
    case IBV_EVENT_SM_CHANGE:
    case IBV_EVENT_CLIENT_REREGISTER:
    case IBV_EVENT_GID_CHANGE:
      event->element.port_num = got->port_num;
      break;
    case IBV_EVENT_DEVICE_FATAL:
      break;
    default:
      event->element.qp = static_cast<ibv_qp*>(got->handle);
      if (auto* qp = to_qp(event->element.qp)) qp->async_events.reported();
      break;
  }
  return 0;
}

void ibv_ack_async_event(ibv_async_event* event) {
  if (event == nullptr) return;
  switch (event->event_type) {
    case IBV_EVENT_CQ_ERR:
      if (auto* cq = to_cq(event->element.cq)) cq->async_events.acked();
      break;
    case IBV_EVENT_SRQ_ERR:
    case IBV_EVENT_SRQ_LIMIT_REACHED:
      if (auto* srq = to_srq(event->element.srq)) srq->async_events.acked();
      break;
    case IBV_EVENT_COMM_EST:
    case IBV_EVENT_SQ_DRAINED:
    case IBV_EVENT_PATH_MIG:
    case IBV_EVENT_PATH_MIG_ERR:
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_QP_LAST_WQE_REACHED:
      if (auto* qp = to_qp(event->element.qp)) qp->async_events.acked();
      break;
    default:
      break;
  }
}

}  // extern "C"
