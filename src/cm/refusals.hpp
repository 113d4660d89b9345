// What a CM answers for a message that names nothing it has, as the
// kernel's ib_cm does: a REQ for a service nobody listens on gets a REJ, a
// SIDR_REQ a SIDR_REP saying so, a DREQ for a connection it no longer has a
// DREP (so that the peer does not wait out its retries). One home for these
// answers: the service gives them for ids it does not have
// (service_passive.cpp, service_messages.cpp), and the host's CM agent for
// processes that are gone (tools/cm_agent). Pure.
#pragma once

#include <optional>

#include "cm/mad_codec.hpp"

namespace softhca::cm {

RejMsg refuse_req(const ReqMsg& req, RejReason reason);
SidrRepMsg refuse_sidr_req(const SidrReqMsg& req, SidrStatus status);
DrepMsg answer_unknown_dreq(const DreqMsg& dreq);

// The answer of a host where nothing listens and no connection is left:
// REJ "invalid service ID" (8) for a REQ, SIDR_REP "unsupported" for a
// SIDR_REQ, DREP for a DREQ, with the request's transaction ID; nothing for
// the rest (answers to requests nobody here sent).
std::optional<Mad> answer_for_nobody(const Mad& mad);

}  // namespace softhca::cm
