// An XRC domain (ibv_open_xrcd): what ties XRC SRQs and XRC_RECV (TGT) QPs
// together. A message to a TGT QP names an SRQ; it is delivered only if that
// SRQ belongs to the same domain. Domains opened on the same file (the
// inode, as the kernel keys them) are one domain, in every context and every
// process of the host; a domain opened without a file (fd -1) is its own.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>

#include "common/result.hpp"
#include "engine/user_count.hpp"

namespace softhca::engine {

class Context;

class XrcDomain : public UserCount {
 public:
  // ibv_open_xrcd: `fd` -1 (oflags must hold O_CREAT) or an open file;
  // O_CREAT|O_EXCL on a file whose domain this process already has open is
  // refused (EINVAL, as the kernel does).
  static Result<XrcDomain*> open(Context& context, int fd, int oflags);
  ~XrcDomain();
  XrcDomain(const XrcDomain&) = delete;
  XrcDomain& operator=(const XrcDomain&) = delete;

  Context& context() { return context_; }
  // Never 0. Equal for domains of the same file on this host.
  uint32_t id() const { return id_; }

 private:
  XrcDomain(Context& context, uint32_t id, dev_t dev, ino_t ino) : context_(context), id_(id), dev_(dev), ino_(ino) {}

  Context& context_;
  uint32_t id_;
  dev_t dev_;
  ino_t ino_;  // 0 for a domain without a file
};

}  // namespace softhca::engine
