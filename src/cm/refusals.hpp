// What a CM answers for a message that names nothing it has, as the
// kernel's ib_cm does: a REQ for a service nobody listens on gets a REJ, a
// SIDR_REQ a SIDR_REP saying so, a DREQ for a connection it no longer has a
// DREP (so that the peer does not wait out its retries). One home for these
// answers, used by the passive side (service_passive.cpp) and for messages
// to ids that are gone (service_messages.cpp). Pure.
#pragma once

#include "cm/mad_codec.hpp"

namespace softhca::cm {

RejMsg refuse_req(const ReqMsg& req, RejReason reason);
SidrRepMsg refuse_sidr_req(const SidrReqMsg& req, SidrStatus status);
DrepMsg answer_unknown_dreq(const DreqMsg& dreq);

}  // namespace softhca::cm
