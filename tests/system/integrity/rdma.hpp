// One host's verbs resources for the integrity peer: a device context, an
// RC, a UC and a UD QP sharing a send CQ and a receive CQ, and one buffer
// registered for every access. Plain verbs C API only, so the peer runs on
// any libibverbs (softhca's or a real HCA's).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <expected>
#include <memory>
#include <string>
#include <vector>

#include "cases.hpp"
#include "oob.hpp"

namespace integrity {

struct RdmaOptions {
  std::string device;  // empty: the first one
  int gid_index = 0;
  uint8_t qp_timeout = 14;  // 4.096 us x 2^14 = 67 ms, as perftest
  uint8_t retry_cnt = 7;
  long rc_psn = -1;  // the RC QP's first PSN; -1: a few hundred short of 2^24
};

// What the peer needs to reach this host's QPs and buffer.
struct Endpoint {
  uint32_t rc_qpn = 0, rc_psn = 0, uc_qpn = 0, uc_psn = 0, ud_qpn = 0;
  uint32_t mtu = 0;  // the port's active MTU in bytes
  ibv_gid gid{};
  uint64_t addr = 0;
  uint32_t rkey = 0;

  Msg to_msg() const;
  static Endpoint from_msg(const Msg& m);
};

inline constexpr uint32_t kQkey = 0x11111111;
inline constexpr uint32_t kQueueDepth = 64;

class Host {
 public:
  static std::expected<std::unique_ptr<Host>, std::string> open(const RdmaOptions& options, uint64_t seed);
  ~Host();

  const Endpoint& self() const { return self_; }
  // Moves the QPs to RTS towards `peer` (the path MTU: the smaller of the
  // two ports'); makes the UD address handle. Empty on success.
  std::string connect(const Endpoint& peer);
  uint32_t path_mtu() const { return path_mtu_; }

  ibv_qp* qp(Transport t) const;
  ibv_cq* send_cq() const { return send_cq_; }
  ibv_cq* recv_cq() const { return recv_cq_; }
  ibv_ah* ah() const { return ah_; }
  uint8_t* buffer() const { return buffer_.get(); }
  ibv_sge sge(size_t offset, size_t length) const;
  uint64_t addr(size_t offset) const { return reinterpret_cast<uint64_t>(buffer_.get() + offset); }

 private:
  Host() = default;
  RdmaOptions options_;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* send_cq_ = nullptr;
  ibv_cq* recv_cq_ = nullptr;
  ibv_qp* rc_ = nullptr;
  ibv_qp* uc_ = nullptr;
  ibv_qp* ud_ = nullptr;
  ibv_ah* ah_ = nullptr;
  ibv_mr* mr_ = nullptr;
  std::unique_ptr<uint8_t[]> buffer_;
  Endpoint self_;
  uint32_t path_mtu_ = 0;
  ibv_mtu path_mtu_enum_ = IBV_MTU_1024;
  uint8_t max_rd_atomic_ = 1;
};

// Polls `cq` until `n` completions arrived (appended to `out`) or `deadline`
// passed; false then. Sleeps between empty polls: the machine has few cores
// and softhca's own threads need them.
bool poll_cq(ibv_cq* cq, size_t n, std::vector<ibv_wc>& out, Clock::time_point deadline);

// "wr_id 0x..., status 12 (transport retry counter exceeded), opcode 1, byte_len 8"
std::string describe(const ibv_wc& wc);
const char* wc_opcode_name(ibv_wc_opcode op);

}  // namespace integrity
