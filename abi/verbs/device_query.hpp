// Device, port, GID and P_Key queries of softhca0.
//
// The exported verbs live in device_query.cpp; the two verbs_context ops below
// are installed into every context by ibv_open_device.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>

// GID types as rdma-core's private driver.h spells them for
// ibv_query_gid_type@IBVERBS_PRIVATE_34 (not the public enum ibv_gid_type).
enum ibv_gid_type_sysfs {
  IBV_GID_TYPE_SYSFS_IB_ROCE_V1 = 0,
  IBV_GID_TYPE_SYSFS_ROCE_V2 = 1,
};

extern "C" int ibv_query_gid_type(struct ibv_context* context, uint8_t port_num, unsigned int index,
                                  enum ibv_gid_type_sysfs* type);

namespace softhca::abi {

// verbs_context.query_port: fills the caller's port_attr_len bytes (the inline
// ibv_query_port passes sizeof from the app's header); bytes past our
// struct ibv_port_attr are zeroed. Port other than 1 -> EINVAL.
int query_port_op(ibv_context* context, uint8_t port_num, ibv_port_attr* port_attr, size_t port_attr_len);

// verbs_context.query_device_ex: input->comp_mask != 0 -> EINVAL; attr_size
// smaller than struct ibv_device_attr -> EINVAL; writes exactly attr_size bytes.
int query_device_ex_op(ibv_context* context, const ibv_query_device_ex_input* input, ibv_device_attr_ex* attr,
                       size_t attr_size);
// verbs_context.query_rt_values (ibv_query_rt_values_ex): the completion
// clock now, as IBV_VALUES_MASK_RAW_CLOCK (seconds and nanoseconds of the
// same ns count completion timestamps use). EINVAL for other mask bits.
int query_rt_values_op(ibv_context* context, ibv_values_ex* values);

}  // namespace softhca::abi
