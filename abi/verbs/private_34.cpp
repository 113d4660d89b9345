// IBVERBS_PRIVATE_34: the interface between rdma-core's libibverbs and its
// provider libraries (rdma-core's private libibverbs/driver.h, not installed).
//
// No softhca program uses it, but libmlx5.so.1 and libefa.so.1 import it and
// are loaded BIND_NOW by perftest and pyverbs, so every symbol must exist. They
// are only ever reached from inside those providers, and the providers refuse
// our devices before doing anything (their verbs_device_ops pointer, stored
// right after struct ibv_device, is never theirs; see handles.hpp). So:
//   - the provider constructors' verbs_register_driver_34() is accepted and ignored;
//   - everything that would need a kernel uverbs fd fails cleanly: ibv_cmd_* and
//     execute_ioctl return EOPNOTSUPP (positive, the driver.h convention) with
//     errno set, pointer-returning calls return nullptr with errno = EOPNOTSUPP;
//   - the helpers that only touch caller-owned memory (verbs_init_cq,
//     __ioctl_final_num_attrs) do their real job;
//   - ibv_query_gid_type, the one symbol of this node programs call directly
//     (ibv_devinfo, pyverbs), is implemented with the device code, not here.
//
// The prototypes follow rdma-core 44's driver.h / cmd_ioctl.h. Structs that
// only exist in those private headers (verbs_mr, verbs_qp, ibv_command_buffer,
// the kern-abi command structs, ...) are passed as void*: with C linkage only
// the name is bound, and no argument is dereferenced except where noted.
#include <infiniband/verbs.h>
#include <pthread.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/rdma_user_ioctl_cmds.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>

namespace {

int not_supported() {
  errno = EOPNOTSUPP;
  return EOPNOTSUPP;
}

// Head of rdma-core's struct ibv_command_buffer (cmd_ioctl.h): three pointers,
// four index bytes and a byte of flag bits, then the kernel ioctl header whose
// flexible attrs[] array holds the attributes filled so far (attrs ..
// next_attr). Only next, next_attr and the position of hdr.attrs are used.
struct CommandBufferHead {
  CommandBufferHead* next;
  ib_uverbs_attr* next_attr;
  ib_uverbs_attr* last_attr;
  std::uint8_t uhw_indices[4];
  std::uint8_t flag_bits;
  alignas(ib_uverbs_ioctl_hdr) unsigned char hdr[sizeof(ib_uverbs_ioctl_hdr)];
};
constexpr std::size_t kAttrsOffset = offsetof(CommandBufferHead, hdr) + offsetof(ib_uverbs_ioctl_hdr, attrs);
// x86-64 layout of the v44 struct, as printed by a C program using its definition.
static_assert(offsetof(CommandBufferHead, hdr) == 32 && kAttrsOffset == 56 && sizeof(ib_uverbs_attr) == 16);

}  // namespace

extern "C" {

// ---- data object: libmlx5 reads it to decide whether destroy may report success
// after the device was disassociated. Never set by us.
bool verbs_allow_disassociate_destroy = false;

// ---- provider registration and context set-up -------------------------------

// Called from libmlx5's/libefa's constructors with their verbs_device_ops.
// softhca never matches devices to providers, so the table is not kept.
void verbs_register_driver_34(const void* /*verbs_device_ops*/) {}

void __verbs_log(struct verbs_context* /*ctx*/, uint32_t /*level*/, const char* /*fmt*/, ...) {
  // Provider debug logging: nothing is printed, the variadic arguments are never read.
}

void* _verbs_init_and_alloc_context(struct ibv_device* /*device*/, int /*cmd_fd*/, size_t /*alloc_size*/,
                                    struct verbs_context* /*context_offset*/, uint32_t /*driver_id*/) {
  errno = EOPNOTSUPP;
  return nullptr;
}

struct ibv_context* verbs_open_device(struct ibv_device* /*device*/, void* /*private_data*/) {
  errno = EOPNOTSUPP;
  return nullptr;
}

void verbs_set_ops(struct verbs_context* /*vctx*/, const void* /*verbs_context_ops*/) {}

void verbs_uninit_context(struct verbs_context* /*context*/) {}

// Fills the library-owned part of a provider-allocated CQ; the same field
// initialisation rdma-core does, including the channel reference the CQ holds.
void verbs_init_cq(struct ibv_cq* cq, struct ibv_context* context, struct ibv_comp_channel* channel,
                   void* cq_context) {
  cq->context = context;
  cq->channel = channel;
  if (channel != nullptr) {
    pthread_mutex_lock(&context->mutex);
    ++channel->refcnt;
    pthread_mutex_unlock(&context->mutex);
  }
  cq->cq_context = cq_context;
  cq->comp_events_completed = 0;
  cq->async_events_completed = 0;
  pthread_mutex_init(&cq->mutex, nullptr);
  pthread_cond_init(&cq->cond, nullptr);
}

// int ibv_read_ibdev_sysfs_file(char *buf, size_t size, struct verbs_sysfs_dev *, const char *fmt, ...):
// bytes read, or -1 with errno. Provider devices have no sysfs directory here.
int ibv_read_ibdev_sysfs_file(char* /*buf*/, size_t /*size*/, void* /*verbs_sysfs_dev*/, const char* /*fnfmt*/, ...) {
  errno = ENOENT;
  return -1;
}

// ---- ioctl command buffers --------------------------------------------------

// Number of attributes in this call plus those already filled in the linked
// buffers: providers size a stack array with it before filling attributes, so
// it must be the true count even though execute_ioctl then fails.
unsigned int __ioctl_final_num_attrs(unsigned int num_attrs, void* link) {
  for (auto* buf = static_cast<const CommandBufferHead*>(link); buf != nullptr; buf = buf->next) {
    const auto first = reinterpret_cast<std::uintptr_t>(buf) + kAttrsOffset;
    const auto filled = reinterpret_cast<std::uintptr_t>(buf->next_attr);
    if (filled > first) num_attrs += static_cast<unsigned int>((filled - first) / sizeof(ib_uverbs_attr));
  }
  return num_attrs;
}

int execute_ioctl(struct ibv_context* /*context*/, void* /*ibv_command_buffer*/) { return not_supported(); }

// ---- ibv_cmd_*: the kernel command wrappers ----------------------------------
// Arguments named void* are private rdma-core structs (verbs_*, kern-abi commands,
// ibv_command_buffer).

int ibv_cmd_get_context(struct verbs_context*, void* /*cmd*/, size_t, struct ib_uverbs_get_context_resp*, size_t) {
  return not_supported();
}
int ibv_cmd_query_context(struct ibv_context*, void* /*driver*/) { return not_supported(); }
int ibv_cmd_create_flow_action_esp(struct ibv_context*, struct ibv_flow_action_esp_attr*, void* /*flow_action*/,
                                   void* /*driver*/) {
  return not_supported();
}
int ibv_cmd_modify_flow_action_esp(void* /*flow_action*/, struct ibv_flow_action_esp_attr*, void* /*driver*/) {
  return not_supported();
}
int ibv_cmd_destroy_flow_action(void* /*action*/) { return not_supported(); }
int ibv_cmd_query_device_any(struct ibv_context*, const struct ibv_query_device_ex_input*, struct ibv_device_attr_ex*,
                             size_t, struct ib_uverbs_ex_query_device_resp*, size_t*) {
  return not_supported();
}
int ibv_cmd_query_port(struct ibv_context*, uint8_t, struct ibv_port_attr*, void* /*cmd*/, size_t) {
  return not_supported();
}

int ibv_cmd_alloc_pd(struct ibv_context*, struct ibv_pd*, void* /*cmd*/, size_t, struct ib_uverbs_alloc_pd_resp*,
                     size_t) {
  return not_supported();
}
int ibv_cmd_dealloc_pd(struct ibv_pd*) { return not_supported(); }
int ibv_cmd_open_xrcd(struct ibv_context*, void* /*xrcd*/, int, struct ibv_xrcd_init_attr*, void* /*cmd*/, size_t,
                      struct ib_uverbs_open_xrcd_resp*, size_t) {
  return not_supported();
}
int ibv_cmd_close_xrcd(void* /*xrcd*/) { return not_supported(); }

int ibv_cmd_reg_mr(struct ibv_pd*, void*, size_t, uint64_t, int, void* /*vmr*/, void* /*cmd*/, size_t,
                   struct ib_uverbs_reg_mr_resp*, size_t) {
  return not_supported();
}
int ibv_cmd_rereg_mr(void* /*vmr*/, uint32_t, void*, size_t, uint64_t, int, struct ibv_pd*, void* /*cmd*/, size_t,
                     struct ib_uverbs_rereg_mr_resp*, size_t) {
  return not_supported();
}
int ibv_cmd_dereg_mr(void* /*vmr*/) { return not_supported(); }
int ibv_cmd_query_mr(struct ibv_pd*, void* /*vmr*/, uint32_t) { return not_supported(); }
int ibv_cmd_advise_mr(struct ibv_pd*, enum ibv_advise_mr_advice, uint32_t, struct ibv_sge*, uint32_t) {
  return not_supported();
}
int ibv_cmd_reg_dmabuf_mr(struct ibv_pd*, uint64_t, size_t, uint64_t, int, int, void* /*vmr*/) {
  return not_supported();
}
int ibv_cmd_alloc_mw(struct ibv_pd*, enum ibv_mw_type, struct ibv_mw*, void* /*cmd*/, size_t,
                     struct ib_uverbs_alloc_mw_resp*, size_t) {
  return not_supported();
}
int ibv_cmd_dealloc_mw(struct ibv_mw*) { return not_supported(); }

int ibv_cmd_create_cq(struct ibv_context*, int, struct ibv_comp_channel*, int, struct ibv_cq*, void* /*cmd*/, size_t,
                      struct ib_uverbs_create_cq_resp*, size_t) {
  return not_supported();
}
int ibv_cmd_create_cq_ex(struct ibv_context*, const struct ibv_cq_init_attr_ex*, void* /*verbs_cq*/, void* /*cmd*/,
                         size_t, struct ib_uverbs_ex_create_cq_resp*, size_t, uint32_t) {
  return not_supported();
}
int ibv_cmd_poll_cq(struct ibv_cq*, int, struct ibv_wc*) { return not_supported(); }
int ibv_cmd_req_notify_cq(struct ibv_cq*, int) { return not_supported(); }
int ibv_cmd_resize_cq(struct ibv_cq*, int, void* /*cmd*/, size_t, struct ib_uverbs_resize_cq_resp*, size_t) {
  return not_supported();
}
int ibv_cmd_destroy_cq(struct ibv_cq*) { return not_supported(); }
int ibv_cmd_modify_cq(struct ibv_cq*, struct ibv_modify_cq_attr*, void* /*cmd*/, size_t) { return not_supported(); }

int ibv_cmd_create_srq(struct ibv_pd*, struct ibv_srq*, struct ibv_srq_init_attr*, void* /*cmd*/, size_t,
                       struct ib_uverbs_create_srq_resp*, size_t) {
  return not_supported();
}
int ibv_cmd_create_srq_ex(struct ibv_context*, void* /*verbs_srq*/, struct ibv_srq_init_attr_ex*, void* /*cmd*/,
                          size_t, struct ib_uverbs_create_srq_resp*, size_t) {
  return not_supported();
}
int ibv_cmd_modify_srq(struct ibv_srq*, struct ibv_srq_attr*, int, void* /*cmd*/, size_t) { return not_supported(); }
int ibv_cmd_query_srq(struct ibv_srq*, struct ibv_srq_attr*, void* /*cmd*/, size_t) { return not_supported(); }
int ibv_cmd_destroy_srq(struct ibv_srq*) { return not_supported(); }

int ibv_cmd_create_qp(struct ibv_pd*, struct ibv_qp*, struct ibv_qp_init_attr*, void* /*cmd*/, size_t,
                      struct ib_uverbs_create_qp_resp*, size_t) {
  return not_supported();
}
int ibv_cmd_create_qp_ex(struct ibv_context*, void* /*verbs_qp*/, struct ibv_qp_init_attr_ex*, void* /*cmd*/, size_t,
                         struct ib_uverbs_create_qp_resp*, size_t) {
  return not_supported();
}
int ibv_cmd_create_qp_ex2(struct ibv_context*, void* /*verbs_qp*/, struct ibv_qp_init_attr_ex*, void* /*cmd*/, size_t,
                          struct ib_uverbs_ex_create_qp_resp*, size_t) {
  return not_supported();
}
int ibv_cmd_open_qp(struct ibv_context*, void* /*verbs_qp*/, int, struct ibv_qp_open_attr*, void* /*cmd*/, size_t,
                    struct ib_uverbs_create_qp_resp*, size_t) {
  return not_supported();
}
int ibv_cmd_query_qp(struct ibv_qp*, struct ibv_qp_attr*, int, struct ibv_qp_init_attr*, void* /*cmd*/, size_t) {
  return not_supported();
}
int ibv_cmd_modify_qp(struct ibv_qp*, struct ibv_qp_attr*, int, void* /*cmd*/, size_t) { return not_supported(); }
int ibv_cmd_modify_qp_ex(struct ibv_qp*, struct ibv_qp_attr*, int, void* /*cmd*/, size_t,
                         struct ib_uverbs_ex_modify_qp_resp*, size_t) {
  return not_supported();
}
int ibv_cmd_destroy_qp(struct ibv_qp*) { return not_supported(); }

int ibv_cmd_post_send(struct ibv_qp*, struct ibv_send_wr* wr, struct ibv_send_wr** bad_wr) {
  if (bad_wr != nullptr) *bad_wr = wr;
  return not_supported();
}
int ibv_cmd_post_recv(struct ibv_qp*, struct ibv_recv_wr* wr, struct ibv_recv_wr** bad_wr) {
  if (bad_wr != nullptr) *bad_wr = wr;
  return not_supported();
}
int ibv_cmd_post_srq_recv(struct ibv_srq*, struct ibv_recv_wr* wr, struct ibv_recv_wr** bad_wr) {
  if (bad_wr != nullptr) *bad_wr = wr;
  return not_supported();
}

int ibv_cmd_create_ah(struct ibv_pd*, struct ibv_ah*, struct ibv_ah_attr*, struct ib_uverbs_create_ah_resp*, size_t) {
  return not_supported();
}
int ibv_cmd_destroy_ah(struct ibv_ah*) { return not_supported(); }
int ibv_cmd_attach_mcast(struct ibv_qp*, const union ibv_gid*, uint16_t) { return not_supported(); }
int ibv_cmd_detach_mcast(struct ibv_qp*, const union ibv_gid*, uint16_t) { return not_supported(); }

int ibv_cmd_create_flow(struct ibv_qp*, struct ibv_flow*, struct ibv_flow_attr*, void* /*ucmd*/, size_t) {
  return not_supported();
}
int ibv_cmd_destroy_flow(struct ibv_flow*) { return not_supported(); }

int ibv_cmd_create_wq(struct ibv_context*, struct ibv_wq_init_attr*, struct ibv_wq*, void* /*cmd*/, size_t,
                      struct ib_uverbs_ex_create_wq_resp*, size_t) {
  return not_supported();
}
int ibv_cmd_modify_wq(struct ibv_wq*, struct ibv_wq_attr*, void* /*cmd*/, size_t) { return not_supported(); }
int ibv_cmd_destroy_wq(struct ibv_wq*) { return not_supported(); }
int ibv_cmd_create_rwq_ind_table(struct ibv_context*, struct ibv_rwq_ind_table_init_attr*, struct ibv_rwq_ind_table*,
                                 struct ib_uverbs_ex_create_rwq_ind_table_resp*, size_t) {
  return not_supported();
}
int ibv_cmd_destroy_rwq_ind_table(struct ibv_rwq_ind_table*) { return not_supported(); }

int ibv_cmd_create_counters(struct ibv_context*, struct ibv_counters_init_attr*, void* /*vcounters*/,
                            void* /*link*/) {
  return not_supported();
}
int ibv_cmd_destroy_counters(void* /*vcounters*/) { return not_supported(); }
int ibv_cmd_read_counters(void* /*vcounters*/, uint64_t*, uint32_t, uint32_t, void* /*link*/) {
  return not_supported();
}

int ibv_cmd_alloc_dm(struct ibv_context*, const struct ibv_alloc_dm_attr*, void* /*verbs_dm*/, void* /*link*/) {
  return not_supported();
}
int ibv_cmd_free_dm(void* /*verbs_dm*/) { return not_supported(); }
int ibv_cmd_reg_dm_mr(struct ibv_pd*, void* /*verbs_dm*/, uint64_t, size_t, unsigned int, void* /*vmr*/,
                      void* /*link*/) {
  return not_supported();
}

}  // extern "C"
