// Memory windows below the verbs: the bind rules (engine/memory_window's
// check_bind and binding_for), the registry's window keys (bind, rebind,
// invalidate, release, the MR's count of bound windows), and the responder's
// rules for an rkey that names a window (transport/responder.hpp with a fake
// port): type 2 serves only its QP, a window is no lkey, SEND WITH
// INVALIDATE invalidates a bound type 2 window of the QP's PD and nothing else.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "engine/memory_window.hpp"
#include "fake_responder_port.hpp"
#include "host/host_registry.hpp"
#include "transport/responder.hpp"

namespace softhca {
namespace {

using host::kKeyRegion;
using host::kKeyWindow1;
using host::kKeyWindow2;
using host::MrRecord;

constexpr uint32_t kSelf = 3;
constexpr uint32_t kPdId = 7;

MrRecord region(uint32_t access) {
  MrRecord r{};
  r.key = 0x1234;
  r.proc = kSelf;
  r.pd_id = kPdId;
  r.access = access;
  r.iova = 0x10000;
  r.length = 0x1000;
  r.host_addr = 0x7f0000;
  r.shared = host::SharedSpan{0x7f0000, 0x1000, 0x2000};
  r.kind = kKeyRegion;
  return r;
}

MrRecord window(uint32_t kind, uint64_t bound_length = 0) {
  MrRecord w{};
  w.key = 0x5600 | 0x11;
  w.proc = kSelf;
  w.pd_id = kPdId;
  w.length = bound_length;
  w.kind = kind;
  return w;
}

engine::BindRequest request(uint64_t addr, uint64_t length, uint32_t access) {
  engine::BindRequest b;
  b.new_key = 0x5612;
  b.mr_lkey = 0x1234;
  b.addr = addr;
  b.length = length;
  b.access = access;
  return b;
}

constexpr uint32_t kBindable = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND;
constexpr uint32_t kRw = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

TEST(BindRules, AValidBindPasses) {
  const MrRecord mr = region(kBindable);
  for (uint32_t kind : {kKeyWindow1, kKeyWindow2})
    EXPECT_EQ(engine::check_bind(window(kind), &mr, request(0x10000, 0x1000, kRw), kPdId, kSelf), IBV_WC_SUCCESS);
}

TEST(BindRules, TheMrNeedsMwBindAndLocalWriteForAWritableWindow) {
  const MrRecord no_bind = region(IBV_ACCESS_LOCAL_WRITE);
  EXPECT_EQ(engine::check_bind(window(kKeyWindow1), &no_bind, request(0x10000, 64, kRw), kPdId, kSelf),
            IBV_WC_MW_BIND_ERR);
  const MrRecord read_only = region(IBV_ACCESS_MW_BIND | IBV_ACCESS_REMOTE_READ);
  EXPECT_EQ(engine::check_bind(window(kKeyWindow1), &read_only, request(0x10000, 64, IBV_ACCESS_REMOTE_WRITE), kPdId,
                               kSelf),
            IBV_WC_MW_BIND_ERR);
  EXPECT_EQ(engine::check_bind(window(kKeyWindow1), &read_only, request(0x10000, 64, IBV_ACCESS_REMOTE_ATOMIC), kPdId,
                               kSelf),
            IBV_WC_MW_BIND_ERR);
  // A read-only window on it is fine: the window's rights are its own.
  EXPECT_EQ(engine::check_bind(window(kKeyWindow1), &read_only, request(0x10000, 64, IBV_ACCESS_REMOTE_READ), kPdId,
                               kSelf),
            IBV_WC_SUCCESS);
}

TEST(BindRules, TheRangeLiesInsideTheMr) {
  const MrRecord mr = region(kBindable);
  auto check = [&](uint64_t addr, uint64_t length) {
    return engine::check_bind(window(kKeyWindow2), &mr, request(addr, length, kRw), kPdId, kSelf);
  };
  EXPECT_EQ(check(0x10000, 0x1000), IBV_WC_SUCCESS);
  EXPECT_EQ(check(0x10fff, 1), IBV_WC_SUCCESS);
  EXPECT_EQ(check(0xffff, 2), IBV_WC_MW_BIND_ERR);
  EXPECT_EQ(check(0x10fff, 2), IBV_WC_MW_BIND_ERR);
  EXPECT_EQ(check(0x10000, 0x1001), IBV_WC_MW_BIND_ERR);
  EXPECT_EQ(check(~uint64_t{0} - 4, 16), IBV_WC_MW_BIND_ERR);  // wraps
}

TEST(BindRules, Type1) {
  const MrRecord mr = region(kBindable);
  // Unbind with length 0 and no MR; a zero based type 1 window is refused (o10-36.2.2).
  EXPECT_EQ(engine::check_bind(window(kKeyWindow1, 64), nullptr, request(0, 0, 0), kPdId, kSelf), IBV_WC_SUCCESS);
  EXPECT_EQ(engine::check_bind(window(kKeyWindow1), &mr, request(0x10000, 64, kRw | IBV_ACCESS_ZERO_BASED), kPdId,
                               kSelf),
            IBV_WC_MW_BIND_ERR);
  // Rebinding a bound type 1 window is allowed, through a QP of any PD.
  EXPECT_EQ(engine::check_bind(window(kKeyWindow1, 64), &mr, request(0x10000, 64, kRw), kPdId + 1, kSelf),
            IBV_WC_SUCCESS);
}

TEST(BindRules, Type2) {
  const MrRecord mr = region(kBindable);
  EXPECT_EQ(engine::check_bind(window(kKeyWindow2, 64), &mr, request(0x10000, 64, kRw), kPdId, kSelf),
            IBV_WC_MW_BIND_ERR)
      << "bound: invalidate first (o10-37.2.30)";
  EXPECT_EQ(engine::check_bind(window(kKeyWindow2), &mr, request(0x10000, 64, kRw), kPdId + 1, kSelf),
            IBV_WC_MW_BIND_ERR)
      << "through a QP of another PD (C10-72)";
  EXPECT_EQ(engine::check_bind(window(kKeyWindow2), nullptr, request(0, 0, 0), kPdId, kSelf), IBV_WC_MW_BIND_ERR)
      << "length 0 (o10-37.2.40)";
  EXPECT_EQ(engine::check_bind(window(kKeyWindow2), &mr, request(0x10000, 64, kRw | IBV_ACCESS_ZERO_BASED), kPdId,
                               kSelf),
            IBV_WC_SUCCESS);
}

TEST(BindRules, TheMrIsOfThisProcessAndTheWindowsPd) {
  MrRecord mr = region(kBindable);
  mr.pd_id = kPdId + 1;
  EXPECT_EQ(engine::check_bind(window(kKeyWindow1), &mr, request(0x10000, 64, kRw), kPdId, kSelf),
            IBV_WC_MW_BIND_ERR);
  mr = region(kBindable);
  mr.proc = kSelf + 1;
  EXPECT_EQ(engine::check_bind(window(kKeyWindow1), &mr, request(0x10000, 64, kRw), kPdId, kSelf),
            IBV_WC_MW_BIND_ERR);
  mr = region(kBindable | IBV_ACCESS_ZERO_BASED);
  EXPECT_EQ(engine::check_bind(window(kKeyWindow1), &mr, request(0x10000, 64, kRw), kPdId, kSelf),
            IBV_WC_MW_BIND_ERR);
  EXPECT_EQ(engine::check_bind(window(kKeyWindow1), nullptr, request(0x10000, 64, kRw), kPdId, kSelf),
            IBV_WC_MW_BIND_ERR);
  MrRecord other_window = window(kKeyWindow1, 64);
  EXPECT_EQ(engine::check_bind(window(kKeyWindow1), &other_window, request(0x10000, 64, kRw), kPdId, kSelf),
            IBV_WC_MW_BIND_ERR)
      << "a window is no MR";
  EXPECT_EQ(engine::check_bind(region(kBindable), &mr, request(0x10000, 64, kRw), kPdId, kSelf), IBV_WC_MW_BIND_ERR)
      << "an MR is no window";
}

TEST(BindRules, TheBindingDescribesThePartOfTheMr) {
  const MrRecord mr = region(kBindable);
  host::WindowBinding w =
      engine::binding_for(window(kKeyWindow2), &mr, request(0x10100, 0x80, kRw | IBV_ACCESS_LOCAL_WRITE), 0x42);
  EXPECT_EQ(w.new_key, 0x5612u) << "the window's index, the request's key byte";
  EXPECT_EQ(w.iova, 0x10100u);
  EXPECT_EQ(w.length, 0x80u);
  EXPECT_EQ(w.host_addr, 0x7f0100u);
  EXPECT_EQ(w.shared, (host::SharedSpan{0x7f0100, 0x80, 0x2100}));
  EXPECT_EQ(w.access, kRw) << "remote rights only";
  EXPECT_EQ(w.qpn, 0x42u);
  w = engine::binding_for(window(kKeyWindow2), &mr, request(0x10100, 0x80, kRw | IBV_ACCESS_ZERO_BASED), 0x42);
  EXPECT_EQ(w.iova, 0u) << "zero based";
  EXPECT_EQ(w.host_addr, 0x7f0100u);
  w = engine::binding_for(window(kKeyWindow1), &mr, request(0x10100, 0x80, kRw), 0x42);
  EXPECT_EQ(w.qpn, 0u) << "a type 1 window serves every QP of its PD";
}

// Only an MR's whole pages live in the shared file: a window shares the part
// of them it covers, and accesses reaching beyond them are copied.
TEST(SharedSpans, AWindowSharesWhatItsMrSharesOfItsRange) {
  const host::SharedSpan mr{0x7f1000, 0x2000, 0x5000};  // the MR's inside, pages 1 and 2
  EXPECT_EQ(mr.within(0x7f0ff0, 0x20), (host::SharedSpan{0x7f1000, 0x10, 0x5000})) << "over the head page";
  EXPECT_EQ(mr.within(0x7f2ff0, 0x100), (host::SharedSpan{0x7f2ff0, 0x10, 0x6ff0})) << "over the tail page";
  EXPECT_EQ(mr.within(0x7f0000, 0x800), host::SharedSpan{}) << "only the head page";
  EXPECT_EQ(mr.within(0x7f3000, 0x10), host::SharedSpan{}) << "only the tail page";
  EXPECT_EQ(host::SharedSpan{}.within(0x7f1000, 0x10), host::SharedSpan{}) << "an MR with nothing shared";
  EXPECT_TRUE(mr.holds(0x7f1000, 0x2000));
  EXPECT_TRUE(mr.holds(0x7f2fff, 1));
  EXPECT_FALSE(mr.holds(0x7f0fff, 2)) << "one byte in the head page";
  EXPECT_FALSE(mr.holds(0x7f2fff, 2)) << "one byte in the tail page";
  EXPECT_FALSE(host::SharedSpan{}.holds(0, 0));
  EXPECT_EQ(mr.offset_of(0x7f1234), 0x5234u);
}

// --- the registry's window keys ---

class RegistryWindows : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = "/dev/shm/softhca-unit-mw-" + std::to_string(::getpid()) + "-" +
                             ::testing::UnitTest::GetInstance()->current_test_info()->name();
    auto opened = host::HostRegistry::open_named(path, true);
    ASSERT_TRUE(opened.has_value());
    registry_ = *opened;
    auto proc = registry_->register_process(static_cast<uint32_t>(::getpid()), 3);
    ASSERT_TRUE(proc.has_value());
    proc_ = *proc;
  }
  void TearDown() override { delete registry_; }
  host::HostRegistry* registry_ = nullptr;
  uint32_t proc_ = 0;
};

TEST_F(RegistryWindows, BindInvalidateRelease) {
  auto mr_key = registry_->allocate_mr(proc_, kPdId, kBindable, 0x10000, 0x1000, 0x7f0000);
  ASSERT_TRUE(mr_key.has_value());
  auto w = registry_->allocate_window(proc_, kPdId, kKeyWindow2);
  ASSERT_TRUE(w.has_value());
  EXPECT_NE(*w >> 8, 0u) << "never slot 0: key byte 0 would make key 0";
  MrRecord rec;
  ASSERT_TRUE(registry_->lookup_mr(*w, rec));
  EXPECT_EQ(rec.kind, kKeyWindow2);
  EXPECT_EQ(rec.length, 0u) << "unbound: grants nothing";
  MrRecord mr;
  ASSERT_TRUE(registry_->lookup_mr(*mr_key, mr));
  host::WindowBinding b{};
  b.new_key = (*w & ~0xFFu) | ((*w + 1) & 0xFFu);
  b.access = kRw;
  b.iova = 0x10000;
  b.length = 0x100;
  b.host_addr = 0x7f0000;
  b.shared = host::SharedSpan{};
  b.qpn = 0x99;
  ASSERT_TRUE(registry_->bind_window(*w, proc_, mr, b).has_value());
  EXPECT_FALSE(registry_->lookup_mr(*w, rec)) << "the old key went";
  EXPECT_FALSE(registry_->bind_window(b.new_key, proc_, mr, b).has_value()) << "a bound type 2 window";
  ASSERT_TRUE(registry_->lookup_mr(b.new_key, rec));
  EXPECT_EQ(rec.length, 0x100u);
  EXPECT_EQ(rec.qpn, 0x99u);
  EXPECT_EQ(rec.parent, *mr_key);
  EXPECT_TRUE(registry_->windows_bound(*mr_key));
  EXPECT_FALSE(registry_->release_mr(*mr_key)) << "an MR with a window bound stays";
  ASSERT_TRUE(registry_->lookup_mr(*mr_key, mr));
  // Invalidation: only with the window's PD, once.
  EXPECT_FALSE(registry_->invalidate_window(b.new_key, proc_, kPdId + 1).has_value());
  EXPECT_TRUE(registry_->invalidate_window(b.new_key, proc_, kPdId).has_value());
  EXPECT_FALSE(registry_->invalidate_window(b.new_key, proc_, kPdId).has_value());
  ASSERT_TRUE(registry_->lookup_mr(b.new_key, rec)) << "the key stays";
  EXPECT_EQ(rec.length, 0u);
  EXPECT_EQ(rec.access, 0u);
  EXPECT_FALSE(registry_->windows_bound(*mr_key));
  EXPECT_TRUE(registry_->release_mr(b.new_key));
  EXPECT_TRUE(registry_->release_mr(*mr_key));
}

TEST_F(RegistryWindows, OnlyType2WindowsAreInvalidated) {
  auto mr_key = registry_->allocate_mr(proc_, kPdId, kBindable, 0x10000, 0x1000, 0x7f0000);
  auto w1 = registry_->allocate_window(proc_, kPdId, kKeyWindow1);
  ASSERT_TRUE(mr_key.has_value() && w1.has_value());
  MrRecord mr;
  ASSERT_TRUE(registry_->lookup_mr(*mr_key, mr));
  host::WindowBinding b{};
  b.new_key = *w1;
  b.access = kRw;
  b.length = 0x100;
  b.iova = 0x10000;
  ASSERT_TRUE(registry_->bind_window(*w1, proc_, mr, b).has_value());
  EXPECT_FALSE(registry_->invalidate_window(*w1, proc_, kPdId).has_value());
  EXPECT_FALSE(registry_->invalidate_window(*mr_key, proc_, kPdId).has_value());
  // A stale view of the MR (rereg'd since) makes the bind fail.
  registry_->update_mr(*mr_key, kPdId, kBindable, 0x20000, 0x1000, 0x7f0000);
  EXPECT_FALSE(registry_->bind_window(*w1, proc_, mr, b).has_value());
  // Releasing a bound window unbinds it from its MR.
  EXPECT_TRUE(registry_->windows_bound(*mr_key));
  EXPECT_TRUE(registry_->release_mr(*w1));
  EXPECT_FALSE(registry_->windows_bound(*mr_key));
  EXPECT_TRUE(registry_->release_mr(*mr_key));
}

// --- the responder ---

constexpr uint32_t kWindow2Key = 0x7711;
constexpr uint32_t kWindow1Key = 0x7822;
constexpr uint32_t kQpn = 0x55;

class WindowResponder : public ::testing::Test {
 protected:
  void SetUp() override {
    port_.qp_.qpn = kQpn;
    const uint64_t host = reinterpret_cast<uint64_t>(port_.memory.data());
    port_.keys[kWindow2Key] = transport::MemoryKey{kWindow2Key, transport::kPd, kRw, 0, 256, host + 256,
                                                   transport::KeyKind::kWindow2, kQpn};
    port_.keys[kWindow1Key] = transport::MemoryKey{kWindow1Key, transport::kPd, kRw, transport::kIova, 256, host,
                                                   transport::KeyKind::kWindow1, 0};
  }
  transport::Request request(transport::Operation op, uint64_t addr, uint32_t rkey) {
    transport::Request r;
    r.op = op;
    r.qp_type = IBV_QPT_RC;
    r.src_qpn = 0x99;
    r.remote_addr = addr;
    r.rkey = rkey;
    r.data = &iov_;
    r.ndata = 1;
    r.length = payload_.size();
    return r;
  }
  transport::FakePort port_;
  std::vector<unsigned char> payload_ = std::vector<unsigned char>(64, 0xCD);
  iovec iov_{payload_.data(), payload_.size()};
};

TEST_F(WindowResponder, WritesThroughWindowsLandInTheirRange) {
  EXPECT_EQ(transport::respond(request(transport::Operation::kWrite, 0, kWindow2Key), port_, true).syndrome,
            transport::Syndrome::ack());
  EXPECT_EQ(port_.memory[256], 0xCD) << "zero based: 0 is the window's first byte";
  EXPECT_EQ(port_.memory[255], 0);
  EXPECT_EQ(transport::respond(request(transport::Operation::kWrite, 230, kWindow2Key), port_, true).syndrome,
            transport::Syndrome::nak(transport::Answer::kNakRemoteAccess))
      << "past the window";
}

TEST_F(WindowResponder, Type2ServesOnlyItsQp) {
  port_.qp_.qpn = kQpn + 1;
  EXPECT_EQ(transport::respond(request(transport::Operation::kWrite, 0, kWindow2Key), port_, true).syndrome,
            transport::Syndrome::nak(transport::Answer::kNakRemoteAccess));
  ASSERT_EQ(port_.events.size(), 1u);
  EXPECT_EQ(port_.events[0], IBV_EVENT_QP_ACCESS_ERR);
}

TEST_F(WindowResponder, Type1ServesAnyQpOfItsPd) {
  port_.qp_.qpn = kQpn + 1;
  EXPECT_EQ(
      transport::respond(request(transport::Operation::kWrite, transport::kIova, kWindow1Key), port_, true).syndrome,
      transport::Syndrome::ack());
}

TEST_F(WindowResponder, AWindowIsNoLkey) {
  port_.post_receive(1, transport::kIova, 128, kWindow1Key);
  const transport::Response r = transport::respond(request(transport::Operation::kSend, 0, 0), port_, true);
  EXPECT_EQ(r.syndrome, transport::Syndrome::nak(transport::Answer::kNakRemoteOperational));
  ASSERT_EQ(port_.completions.size(), 1u);
  EXPECT_EQ(port_.completions[0].status, IBV_WC_LOC_PROT_ERR);
}

TEST_F(WindowResponder, SendWithInvalidateInvalidatesABoundType2Window) {
  port_.post_receive(1, transport::kIova, 128);
  transport::Request r = request(transport::Operation::kSendWithInv, 0, 0);
  r.invalidate_rkey = kWindow2Key;
  EXPECT_EQ(transport::respond(r, port_, true).syndrome, transport::Syndrome::ack());
  ASSERT_EQ(port_.invalidated.size(), 1u);
  EXPECT_EQ(port_.invalidated[0], kWindow2Key);
  ASSERT_EQ(port_.completions.size(), 1u);
  EXPECT_EQ(port_.completions[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(port_.completions[0].wc_flags, static_cast<uint32_t>(IBV_WC_WITH_INV));
  EXPECT_EQ(port_.completions[0].imm_data, kWindow2Key) << "ibv_wc.invalidated_rkey";
  EXPECT_EQ(port_.completions[0].byte_len, 64u);
  // The key now grants nothing.
  EXPECT_EQ(transport::respond(request(transport::Operation::kWrite, 0, kWindow2Key), port_, true).syndrome,
            transport::Syndrome::nak(transport::Answer::kNakRemoteAccess));
}

TEST_F(WindowResponder, SendWithInvalidateOfAnythingElseIsAnInvalidRequest) {
  for (uint32_t key : {kWindow1Key, transport::kKey, 0xdead00u}) {
    transport::FakePort port;
    port.keys = port_.keys;
    port.qp_ = port_.qp_;
    port.post_receive(1, transport::kIova, 128);
    transport::Request r = request(transport::Operation::kSendWithInv, 0, 0);
    r.invalidate_rkey = key;
    EXPECT_EQ(transport::respond(r, port, true).syndrome, transport::Syndrome::nak(transport::Answer::kNakInvalidRequest))
        << std::hex << key;
    ASSERT_EQ(port.completions.size(), 1u);
    EXPECT_EQ(port.completions[0].status, IBV_WC_REM_INV_REQ_ERR);
    ASSERT_EQ(port.events.size(), 1u);
    EXPECT_EQ(port.events[0], IBV_EVENT_QP_REQ_ERR);
  }
}

TEST_F(WindowResponder, UcHasNoSendWithInvalidate) {
  port_.qp_.type = IBV_QPT_UC;
  port_.post_receive(1, transport::kIova, 128);
  transport::Request r = request(transport::Operation::kSendWithInv, 0, 0);
  r.qp_type = IBV_QPT_UC;
  r.invalidate_rkey = kWindow2Key;
  EXPECT_EQ(transport::respond(r, port_, false).syndrome, transport::Syndrome::silence());
  EXPECT_TRUE(port_.invalidated.empty());
}

}  // namespace
}  // namespace softhca
