#include "cm/refusals.hpp"

namespace softhca::cm {

RejMsg refuse_req(const ReqMsg& req, RejReason reason) {
  RejMsg rej;
  rej.remote_comm_id = req.local_comm_id;
  rej.message_rejected = RejectedMessage::kReq;
  rej.reason = static_cast<uint16_t>(reason);
  return rej;
}

SidrRepMsg refuse_sidr_req(const SidrReqMsg& req, SidrStatus status) {
  SidrRepMsg rep;
  rep.request_id = req.request_id;
  rep.status = static_cast<uint8_t>(status);
  rep.service_id = req.service_id;
  return rep;
}

DrepMsg answer_unknown_dreq(const DreqMsg& dreq) {
  DrepMsg drep;
  drep.local_comm_id = dreq.remote_comm_id;
  drep.remote_comm_id = dreq.local_comm_id;
  return drep;
}

}  // namespace softhca::cm
