// The device side of librdmacm: one ibv_context for softhca0, opened on first
// use and kept for the life of the process (rdma-core's librdmacm never closes
// its contexts either), and the default PD that ids get (id->pd), allocated
// with the first id that needs it and freed with the last one.
#include <fcntl.h>
#include <pthread.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

#include "cm_handles.hpp"
#include "engine/context.hpp"

namespace softhca::rdmacm {
namespace {

alignas(std::mutex) unsigned char g_mu_storage[sizeof(std::mutex)];
std::mutex& g_mu = *new (g_mu_storage) std::mutex;
ibv_context* g_context = nullptr;
ibv_pd* g_pd = nullptr;
int g_pd_refs = 0;
ibv_xrcd* g_xrcd = nullptr;  // XRC ids' domain, opened with the first and kept, as librdmacm does

// A forked child opens a context of its own (the parent's belongs to the
// parent's progress machinery), as it gets a CM service of its own.
void forget_in_child() {
  new (g_mu_storage) std::mutex;
  g_context = nullptr;
  g_pd = nullptr;
  g_pd_refs = 0;
  g_xrcd = nullptr;
}

ibv_context* open_locked() {
  static const bool hooked = pthread_atfork(nullptr, nullptr, forget_in_child) == 0;
  (void)hooked;
  if (g_context != nullptr) return g_context;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr) return nullptr;
  for (int i = 0; i < n && g_context == nullptr; ++i) g_context = ibv_open_device(list[i]);
  ibv_free_device_list(list);
  if (g_context == nullptr) errno = ENODEV;
  return g_context;
}

}  // namespace

// The engine node of libibverbs.so.1, behind our device context (our
// libibverbs keeps it in the context's verbs_context::priv): its udp link
// carries the CM's MADs to other hosts. This library's own copy of the
// engine must not start a node of its own: a second registration and a
// second link in one process would split the packets of port 4791 between
// them. Null when the context is not softhca's (another libibverbs).
engine::Node* verbs_node() {
  ibv_context* ctx = device_context();
  if (ctx == nullptr || ctx->device == nullptr || std::strncmp(ctx->device->name, "softhca", 7) != 0) return nullptr;
  verbs_context* v = verbs_get_ctx(ctx);
  if (v == nullptr || v->priv == nullptr) return nullptr;
  return &reinterpret_cast<engine::Context*>(v->priv)->node();
}

cm::Service* service() {
  static std::atomic<cm::Service*> configured{nullptr};
  auto s = cm::Service::instance();
  if (!s) {
    errno = static_cast<int>(s.error());
    return nullptr;
  }
  // Once per service (a forked child gets a new one).
  if (configured.load(std::memory_order_acquire) != *s) {
    (*s)->set_node_source(verbs_node);
    configured.store(*s, std::memory_order_release);
  }
  return *s;
}

bool device_present() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr) return false;
  ibv_free_device_list(list);
  return n > 0;
}

ibv_context* device_context() {
  std::lock_guard g(g_mu);
  return open_locked();
}

ibv_pd* device_pd_acquire() {
  std::lock_guard g(g_mu);
  if (open_locked() == nullptr) return nullptr;
  if (g_pd == nullptr) g_pd = ibv_alloc_pd(g_context);
  if (g_pd == nullptr) return nullptr;
  ++g_pd_refs;
  return g_pd;
}

ibv_xrcd* device_xrcd() {
  std::lock_guard g(g_mu);
  if (open_locked() == nullptr) return nullptr;
  if (g_xrcd == nullptr) {
    ibv_xrcd_init_attr attr{};
    attr.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
    attr.fd = -1;
    attr.oflags = O_CREAT;
    g_xrcd = ibv_open_xrcd(g_context, &attr);
  }
  return g_xrcd;
}

void device_pd_release() {
  std::lock_guard g(g_mu);
  if (g_pd_refs > 0 && --g_pd_refs == 0 && g_pd != nullptr) {
    // Fails (EBUSY) while the application still has MRs on it; then it stays
    // for the next id.
    if (ibv_dealloc_pd(g_pd) == 0) g_pd = nullptr;
  }
}

}  // namespace softhca::rdmacm

using namespace softhca::rdmacm;

extern "C" {

ibv_context** rdma_get_devices(int* num_devices) {
  ibv_context* ctx = device_context();
  auto** list = static_cast<ibv_context**>(std::calloc(2, sizeof(ibv_context*)));
  if (list == nullptr || ctx == nullptr) {
    std::free(list);
    if (num_devices != nullptr) *num_devices = 0;
    if (ctx != nullptr) errno = ENOMEM;
    return nullptr;
  }
  list[0] = ctx;
  if (num_devices != nullptr) *num_devices = 1;
  return list;
}

void rdma_free_devices(ibv_context** list) { std::free(list); }

}  // extern "C"
