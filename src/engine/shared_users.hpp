// The objects that use a PD or a DM, in every process that shares its
// context (ibv_import_device): this process's are counted here, and each
// process's in the context's file, where the others see them. ibv_dealloc_pd
// and ibv_free_dm refuse (EBUSY) while any live process has one.
#pragma once

#include <cstdint>

#include "engine/context_file.hpp"
#include "engine/user_count.hpp"

namespace softhca::engine {

class Context;

class SharedUsers {
 public:
  SharedUsers(Context& context, ExportKind kind, uint32_t handle) : context_(context), kind_(kind), handle_(handle) {}
  void attach();
  void detach();
  bool in_use() const;

 private:
  Context& context_;
  ExportKind kind_;
  uint32_t handle_;
  UserCount here_;
};

}  // namespace softhca::engine
