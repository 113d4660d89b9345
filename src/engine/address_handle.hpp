// An address handle: where a UD message goes. The engine keeps the attributes
// it needs to route (dgid, port) and to fill the receiver's GRH.
#pragma once

#include <cstdint>
#include <cstring>

#include "wire/ud_grh.hpp"

namespace softhca::engine {

class ProtectionDomain;

struct AddressVector {
  uint8_t dgid[16];
  uint8_t sgid_index;
  uint8_t hop_limit;
  uint8_t traffic_class;
  uint8_t sl;
  uint32_t flow_label;
  uint16_t dlid;
  uint8_t is_global;
  uint8_t port_num;
  uint8_t static_rate;
  uint8_t src_path_bits;
};

class AddressHandle {
 public:
  // Any 32-bit flow label is taken and its 20 bits kept, as ibv_modify_qp
  // does (qp_state.cpp): the kernel passes the value through and mlx5 keeps
  // the 20 bits of the field.
  AddressHandle(ProtectionDomain& pd, const AddressVector& av) : pd_(pd), av_(av) {
    av_.flow_label &= wire::kFlowLabelMask;
  }
  ProtectionDomain& pd() { return pd_; }
  const AddressVector& av() const { return av_; }

 private:
  ProtectionDomain& pd_;
  AddressVector av_;
};

}  // namespace softhca::engine
