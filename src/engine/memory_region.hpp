// A memory region: a registered range with a host-unique key (lkey == rkey),
// published in the host registry so initiators of any process can validate an
// rkey and reach the memory.
#pragma once

#include <cstdint>
#include <optional>

#include "common/result.hpp"
#include "engine/context_file.hpp"
#include "host/memory_backing.hpp"

namespace softhca::engine {

class ProtectionDomain;

// Access flags we understand; IBV_ACCESS_OPTIONAL_RANGE bits are ignored when unsupported.
uint32_t supported_access_flags();
Result<void> check_access_flags(uint32_t access);

// ibv_advise_mr's check of one range: an on-demand MR of this process and of
// `pd` must hold it (with local write for a PREFETCH_WRITE). softhca has no
// page faults to take ahead, so a range that passes needs nothing more.
Result<void> check_advice_range(ProtectionDomain& pd, uint32_t lkey, uint64_t addr, uint64_t length, bool write);

class MemoryRegion {
 public:
  // `empty_ok`: a length of 0 registers an empty MR (device memory MRs
  // may be empty, as the kernel allows them); it reaches no memory.
  static Result<MemoryRegion*> create(ProtectionDomain& pd, void* addr, uint64_t length, uint64_t iova,
                                      uint32_t access, bool empty_ok = false);
  // This process's handle onto an MR that another process sharing `pd`'s
  // context registered (ibv_import_mr): its key, used as an lkey here,
  // reaches that process's memory (the requester copies through it, fenced
  // against its deregistration).
  static MemoryRegion* adopt(ProtectionDomain& pd, const ExportRecord& record);
  // ibv_dereg_mr: invalid_argument while a memory window is bound to the MR
  // (rxe refuses so; IBA 10.6.7.2.6), the MR unchanged. Once it succeeds no
  // initiator touches the range; delete the object then. Through an adopted
  // handle it deregisters the other process's MR, for every process; the
  // registering process's own ibv_dereg_mr then only lets go of its pages.
  Result<void> deregister();
  ~MemoryRegion();

  // IBV_REREG_MR_* flags; a new PD, access or range.
  Result<void> rereg(int flags, ProtectionDomain* pd, void* addr, uint64_t length, uint32_t access);

  uint32_t key() const { return key_; }
  // The handle ibv_import_mr names it by: its key, kept after deregistration.
  uint32_t handle() const { return handle_; }
  ProtectionDomain& pd() { return *pd_; }
  void* addr() const { return addr_; }
  uint64_t length() const { return length_; }
  uint64_t iova() const { return iova_; }
  uint32_t access() const { return access_; }
  bool adopted() const { return owner_proc_ != kOwnProcess; }

 private:
  MemoryRegion(ProtectionDomain& pd, void* addr, uint64_t length, uint64_t iova, uint32_t access)
      : pd_(&pd), addr_(addr), length_(length), iova_(iova), access_(access) {}
  ProtectionDomain* pd_;
  void* addr_;
  uint64_t length_;
  uint64_t iova_;
  uint32_t access_;
  uint32_t key_ = 0;
  uint32_t handle_ = 0;
  // The registry slot of the process that registered it, when another (adopt).
  static constexpr uint32_t kOwnProcess = ~0u;
  uint32_t owner_proc_ = kOwnProcess;
  // The pages this MR moved into the process's backing file, if any.
  std::optional<host::SharedPages> shared_;
};

}  // namespace softhca::engine
