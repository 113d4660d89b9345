// softhca C++ API: RAII handles, spans and typed flags over the verbs C API.
//
// Header-only and dependent on nothing but <infiniband/verbs.h>, so it works
// the same over softhca's libibverbs.so.1 and over rdma-core's on a real NIC.
//
// One naming scheme throughout, for every verbs object X:
//   X::create(args...) -> Expected<X>   never throws; the Error carries errno
//                                       and the name of the verb that failed
//   X::make(args...)   -> X             same arguments, throws VerbsError
//                                       (a std::system_error) instead
//   X()                                 empty handle; X(raw*) adopts a raw one
//   x.get()                             the raw pointer, for any verb not wrapped
//   x.reset()          -> Expected<void> destroys now and reports failure; the
//                                       destructor does the same silently
//   x.release()                         gives up ownership
// Handles are move-only. Factory functions rather than throwing constructors,
// because several types have overloads a constructor could not tell apart from
// "empty" or "adopt" (DeviceList() would be both enumerate and empty).
//
// Destruction order is the caller's, as in C: declare the Context first, then
// the PD, channel, CQs, MRs and QPs, and C++ destroys them in reverse.
//
// Member functions that wrap a verb (query_port, modify, post_send, poll, ...)
// return Expected and never throw; use softhca::value_or_throw(...) for the
// throwing form.
#pragma once

#include "ah.hpp"
#include "cq.hpp"
#include "device.hpp"
#include "error.hpp"
#include "flags.hpp"
#include "mr.hpp"
#include "pd.hpp"
#include "qp.hpp"
#include "srq.hpp"
