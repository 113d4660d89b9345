// The structs a librdmacm application sees, and how the shim gets from them to
// the CM service (src/cm/service.hpp).
//
// Each handle embeds the public struct first; the service's objects carry a
// pointer back (CmId::user). The shim keeps librdmacm's own bookkeeping here
// (synchronous ids, rdma_create_ep's saved attributes, the negotiated depths,
// ECE values) and does the QP work of librdmacm itself through the public
// verbs API, as rdma-core's librdmacm does on top of libibverbs.
#pragma once

#include <infiniband/verbs.h>
#include <infiniband/ib.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include <cerrno>
#include <cstddef>
#include <memory>
#include <new>
#include <vector>

#include "cm/service.hpp"

namespace softhca::engine {
class Node;
}

namespace softhca::rdmacm {

struct ChannelHandle {
  rdma_event_channel channel;
  std::shared_ptr<cm::Channel> impl;
};

// One rdma_join_multicast of an id (librdmacm's struct cma_multicast).
struct McJoin {
  sockaddr_storage addr{};  // as the application gave it, to find it again at leave
  cm::Gid mgid{};
  void* context = nullptr;
  bool send_only = false;   // RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER: the QP is not attached
  bool attached = false;    // the QP was attached when its MULTICAST_JOIN was handed out
};

struct IdHandle {
  rdma_cm_id id;
  cm::CmId* impl = nullptr;
  ChannelHandle* sync_channel = nullptr;  // a synchronous id's private channel (NULL channel at create)
  bool device_ref = false;                // holds a reference on the default PD
  std::unique_ptr<ibv_qp_init_attr> ep_qp_init_attr;  // rdma_create_ep on a passive endpoint
  std::vector<uint8_t> ep_connect_data;               // rdma_create_ep's ai_connect
  uint8_t initiator_depth = 0;
  uint8_t responder_resources = 0;
  bool connect_error = false;
  ibv_ece local_ece{};
  ibv_ece remote_ece{};
  std::vector<McJoin> multicast;
};

struct EventHandle {
  rdma_cm_event event;
  cm::CmId* counted = nullptr;
  uint8_t private_data[cm::kMaxEventPrivateData];
};

static_assert(offsetof(ChannelHandle, channel) == 0 && offsetof(IdHandle, id) == 0 &&
              offsetof(EventHandle, event) == 0);

inline IdHandle* to_handle(rdma_cm_id* id) { return reinterpret_cast<IdHandle*>(id); }
inline ChannelHandle* to_handle(rdma_event_channel* ch) { return reinterpret_cast<ChannelHandle*>(ch); }
inline EventHandle* to_handle(rdma_cm_event* ev) { return reinterpret_cast<EventHandle*>(ev); }

// librdmacm's conventions: 0 or -1 with errno; pointers or NULL with errno.
inline int set_errno(int err) {
  errno = err;
  return -1;
}
inline int set_errno(std::errc err) { return set_errno(static_cast<int>(err)); }

template <typename Fn>
int cm_call(Fn&& fn) noexcept {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return set_errno(ENOMEM);
  } catch (...) {
    return set_errno(EIO);
  }
}

// The service, or nullptr with errno set.
cm::Service* service();

// ---- channels and ids (event_channel.cpp, cm_id.cpp) ----
// A new channel handle, or nullptr with errno set.
ChannelHandle* new_channel(cm::Service* svc);
void free_channel(ChannelHandle* h);
// rdma_create_id with the QP type given (rdma_create_ep takes it from its
// rdma_addrinfo); a NULL channel makes a synchronous id. 0 or -1 with errno.
int create_id(rdma_event_channel* channel, rdma_cm_id** out, void* context, rdma_port_space ps, ibv_qp_type qp_type);

// ---- the device (one softhca0 context shared by every id, as librdmacm does) ----
bool device_present();  // without opening it (librdmacm's "No RDMA devices" check)
ibv_context* device_context();
// The engine node of libibverbs.so.1 behind device_context(), or null when
// that context is not softhca's (device.cpp says why the CM needs it).
engine::Node* verbs_node();
// The default protection domain, allocated with the first id that needs it.
ibv_pd* device_pd_acquire();
// The XRC domain of XRC ids (no file: this process's alone), opened on first use.
ibv_xrcd* device_xrcd();
void device_pd_release();

// Refreshes the id's public fields (addresses, GIDs, verbs/pd/port, path
// record) from the service.
void sync_id(IdHandle* h);

// librdmacm's QP steps (qp.cpp).
int modify_qp_rtr(IdHandle* h, uint8_t resp_res);
int modify_qp_rts(IdHandle* h, uint8_t init_depth);
int modify_qp_err(rdma_cm_id* id);
// rdma_disconnect, before modify_qp_err: an RC QP in RTS goes to SQD, and
// this waits (200 ms at most) until the sends it had started are done. A
// NIC puts a send on the wire within microseconds of its post, so a send
// posted just before rdma_disconnect has reached the peer there, and the
// move to ERROR flushes nothing that was under way; here a send still being
// resent after a loss was flushed, and the peer waited for it for ever
// (ucmatose's replies at 20% loss between two hosts). Sends not started
// yet stay queued, and ERROR flushes them as before.
void drain_send_queue(rdma_cm_id* id);
void destroy_cqs(rdma_cm_id* id);
// The RTU after CONNECT_RESPONSE (rdma_establish, or with a QP inside
// rdma_get_cm_event; connect.cpp).
int process_conn_resp(IdHandle* h);
// MULTICAST_JOIN as librdmacm hands it out: param.ud for the group, and the
// id's QP attached to it (multicast.cpp). False if the attach failed (errno set).
bool process_join(IdHandle* h, rdma_cm_event& event, const cm::Gid& mgid, void* context);
// A synchronous id waits for the event its call started; 0 for other ids
// (event_channel.cpp).
int complete(IdHandle* h);

}  // namespace softhca::rdmacm
