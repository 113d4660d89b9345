// A protection domain: an id that is unique on the host, so a responder can
// check that an rkey's MR and its QP belong to the same PD.
#pragma once

#include <atomic>
#include <cstdint>

#include "common/result.hpp"
#include "engine/shared_users.hpp"

namespace softhca::engine {

class Context;

class ProtectionDomain {
 public:
  // A new PD with a host-unique id; not_enough_memory at max_pd.
  static Result<ProtectionDomain*> create(Context& context);
  // This process's handle onto PD `id`, which another process sharing
  // `context` made (ibv_import_pd): objects made here in it carry its id.
  static ProtectionDomain* adopt(Context& context, uint32_t id);
  ~ProtectionDomain();
  ProtectionDomain(const ProtectionDomain&) = delete;
  ProtectionDomain& operator=(const ProtectionDomain&) = delete;

  // The objects that use the PD, in every process that shares its context:
  // ibv_dealloc_pd refuses (EBUSY) while any is attached.
  void attach() { users_.attach(); }
  void detach() { users_.detach(); }
  bool in_use() const { return users_.in_use(); }

  Context& context() { return context_; }
  uint32_t id() const { return id_; }
  // Made by another process (adopt).
  bool adopted() const { return adopted_; }

 private:
  ProtectionDomain(Context& context, uint32_t id, bool adopted)
      : context_(context), id_(id), adopted_(adopted), users_(context, ExportKind::kPd, id) {}

  Context& context_;
  uint32_t id_;
  bool adopted_;
  SharedUsers users_;
};

}  // namespace softhca::engine
