#include "engine/qp/foreign_memory.hpp"

#include <cstring>

#include "host/attachment.hpp"
#include "link/shm/remote_memory.hpp"

namespace softhca::engine {

void ForeignStaging::add(const host::MrRecord& mr, uint32_t pid, uint64_t owner_addr, uint64_t length) {
  pieces_.push_back(Piece{mr, pid, owner_addr, length, 0});
}

void ForeignStaging::finish() {
  uint64_t total = 0;
  for (Piece& p : pieces_) {
    p.at = total;
    total += p.length;
  }
  bytes_.resize(total);
}

bool ForeignStaging::gather(host::Attachment& host) {
  for (const Piece& p : pieces_)
    if (!copy(host, p, false)) return false;
  return true;
}

bool ForeignStaging::scatter(host::Attachment& host) {
  for (const Piece& p : pieces_)
    if (!copy(host, p, true)) return false;
  return true;
}

bool ForeignStaging::copy(host::Attachment& host, const Piece& p, bool into_owner) {
  host::HostRegistry& registry = host.registry();
  // Announced first, then the key checked: the owner's deregistration
  // either is seen here or waits until this copy ends.
  const uint32_t slot = registry.begin_access(host.proc(), p.mr.proc);
  host::MrRecord now;
  bool ok = host.pid_of(p.mr.proc) == p.pid && registry.lookup_mr(p.mr.key, now) && now.proc == p.mr.proc && now.pd_id == p.mr.pd_id &&
            now.access == p.mr.access && now.iova == p.mr.iova && now.length == p.mr.length &&
            now.host_addr == p.mr.host_addr && now.shared == p.mr.shared;
  if (ok) {
    unsigned char* mine = bytes_.data() + p.at;
    host::PeerBackings::View window{};
    if (char* there = host.in_backing(p.mr.proc, p.mr.shared, p.owner_addr, p.length, window)) {
      // Its pages in its shared file, mapped here.
      if (into_owner) std::memcpy(there, mine, p.length);
      else std::memcpy(mine, there, p.length);
    } else {
      // Pages that never moved there (the partial pages at an MR's ends, an
      // ODP MR): through the kernel, which reports what is not mapped.
      const iovec local{mine, static_cast<size_t>(p.length)};
      const iovec remote{reinterpret_cast<void*>(p.owner_addr), static_cast<size_t>(p.length)};
      ok = (into_owner ? shm::write_to(p.pid, &remote, 1, &local, 1, p.length)
                                   : shm::read_from(p.pid, &local, 1, &remote, 1, p.length)) == shm::CopyResult::kOk;
    }
  }
  registry.end_access(host.proc(), slot);
  return ok;
}

}  // namespace softhca::engine
