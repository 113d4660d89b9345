#include "engine/memory_window.hpp"

#include "common/log.hpp"
#include "engine/context.hpp"
#include "engine/protection_domain.hpp"

namespace softhca::engine {
namespace {

constexpr uint32_t kRemoteAccess = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;

ibv_wc_status refuse(const char* why) {
  SOFTHCA_DEBUG("bind_mw: %s", why);
  return IBV_WC_MW_BIND_ERR;
}

}  // namespace

ibv_wc_status check_bind(const host::MrRecord& window, const host::MrRecord* mr, const BindRequest& b,
                         uint32_t qp_pd_id, uint32_t self_proc) {
  if (window.proc != self_proc || (window.kind != host::kKeyWindow1 && window.kind != host::kKeyWindow2))
    return refuse("not a memory window of this process");
  if (window.kind == host::kKeyWindow1) {
    if (b.access & IBV_ACCESS_ZERO_BASED) return refuse("a type 1 window cannot be zero based");
  } else {
    if (window.length != 0) return refuse("a type 2 window is bound again only once invalidated");
    if (window.pd_id != qp_pd_id) return refuse("a type 2 window binds through a QP of its own PD only");
    if (b.length == 0) return refuse("a type 2 window is invalidated, not bound with length 0");
  }
  if (b.length == 0) return IBV_WC_SUCCESS;
  if (mr == nullptr || mr->kind != host::kKeyRegion || mr->proc != self_proc) return refuse("no such MR");
  if (mr->pd_id != window.pd_id) return refuse("the MR belongs to another PD");
  if (mr->access & IBV_ACCESS_ZERO_BASED) return refuse("the MR is zero based");
  if (!(mr->access & IBV_ACCESS_MW_BIND)) return refuse("the MR was registered without IBV_ACCESS_MW_BIND");
  // A window over an on-demand MR would reach memory nobody checked (an
  // implicit MR's whole address space): not offered, as on mlx5.
  if (mr->access & IBV_ACCESS_ON_DEMAND) return refuse("the MR is on-demand (ODP)");
  if ((b.access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(mr->access & IBV_ACCESS_LOCAL_WRITE))
    return refuse("a writable window needs local write on its MR");
  if (b.addr < mr->iova || b.addr + b.length < b.addr || b.addr + b.length > mr->iova + mr->length)
    return refuse("the range is not inside the MR");
  return IBV_WC_SUCCESS;
}

host::WindowBinding binding_for(const host::MrRecord& window, const host::MrRecord* mr, const BindRequest& b,
                                uint32_t qpn) {
  host::WindowBinding w{};
  w.new_key = (window.key & ~0xFFu) | (b.new_key & 0xFFu);
  w.length = b.length;
  w.shared = host::SharedSpan{};
  if (b.length == 0 || mr == nullptr) return w;
  const uint64_t offset = b.addr - mr->iova;
  w.access = b.access & kRemoteAccess;
  // Zero based: peers address the window from 0, wherever it starts in the MR.
  w.iova = (b.access & IBV_ACCESS_ZERO_BASED) ? 0 : b.addr;
  w.host_addr = mr->host_addr + offset;
  w.shared = mr->shared.within(w.host_addr, b.length);
  w.qpn = window.kind == host::kKeyWindow2 ? qpn : 0;
  return w;
}

Result<MemoryWindow*> MemoryWindow::create(ProtectionDomain& pd, uint32_t type) {
  if (type != IBV_MW_TYPE_1 && type != IBV_MW_TYPE_2) return fail(std::errc::invalid_argument);
  Node& node = pd.context().node();
  auto key = node.registry().allocate_window(node.proc(), pd.id(),
                                             type == IBV_MW_TYPE_1 ? host::kKeyWindow1 : host::kKeyWindow2);
  if (!key) return fail(key.error());
  pd.attach();
  return new MemoryWindow(pd, type, *key);
}

MemoryWindow::~MemoryWindow() {
  Node& node = pd_.context().node();
  node.registry().release_mr(key());
  // As ibv_dereg_mr: an access that validated the key before it went ends first.
  node.registry().fence_accesses(node.proc());
  pd_.detach();
}

ibv_wc_status MemoryWindow::bind(const BindRequest& b, uint32_t qpn, uint32_t qp_pd_id) {
  Node& node = pd_.context().node();
  host::HostRegistry& registry = node.registry();
  host::MrRecord window;
  if (!registry.lookup_mr(key(), window)) return refuse("the window's key changed");
  host::MrRecord mr{};
  const bool has_mr = b.length != 0 && registry.lookup_mr(b.mr_lkey, mr);
  const ibv_wc_status status = check_bind(window, has_mr ? &mr : nullptr, b, qp_pd_id, node.proc());
  if (status != IBV_WC_SUCCESS) return status;
  const host::WindowBinding binding = binding_for(window, has_mr ? &mr : nullptr, b, qpn);
  if (!registry.bind_window(window.key, node.proc(), mr, binding)) return refuse("the MR changed meanwhile");
  key_.store(binding.new_key, std::memory_order_release);
  // A window that was bound granted access under its old key: none outlives the bind.
  if (window.length != 0) registry.fence_accesses(node.proc());
  return IBV_WC_SUCCESS;
}

ibv_wc_status invalidate_locally(host::HostRegistry& registry, uint32_t self_proc, uint32_t rkey, uint32_t qp_pd_id) {
  if (!registry.invalidate_window(rkey, self_proc, qp_pd_id)) {
    SOFTHCA_DEBUG("local_inv: key 0x%x is no bound type 2 window of this process and PD", rkey);
    return IBV_WC_LOC_QP_OP_ERR;
  }
  registry.fence_accesses(self_proc);
  return IBV_WC_SUCCESS;
}

}  // namespace softhca::engine
