// link::KeyGrant: what the direct path keeps of a key between operations
// must never let through what the per-operation checks it replaces
// (transport::remote_key_allows / local_key_allows, then the window onto the
// owner's file as Attachment::in_backing finds it) would refuse, nor land
// anywhere else; and it should cover what they let through inside the
// window, or it saves nothing.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <cstdint>
#include <random>

#include "link/key_grant.hpp"

namespace softhca::link {
namespace {

using host::PeerBackings;
using host::SharedSpan;
using transport::KeyKind;
using transport::MemoryKey;

// Attachment::in_backing with a window that is not grown: where `addr`
// (an owner address) lands, or nullptr.
char* in_window(const SharedSpan& span, uint64_t addr, uint64_t length, const PeerBackings::View& window) {
  if (!span.holds(addr, length)) return nullptr;
  const uint64_t offset = span.offset_of(addr);
  if (window.base == nullptr || offset + length > window.length) return nullptr;
  return window.base + offset;
}

// ShmChannel::remote_range, one operation at a time.
char* remote_reference(const MemoryKey& key, const SharedSpan& span, uint32_t pd, uint32_t qpn, uint32_t needed,
                       uint64_t addr, uint64_t length, const PeerBackings::View& window) {
  if (transport::is_on_demand(key) || !transport::remote_key_allows(key, pd, qpn, needed, addr, length))
    return nullptr;
  return in_window(span, reinterpret_cast<uint64_t>(transport::owner_address(key, addr)), length, window);
}

// QueuePair::direct_local_range: the owner's own address where the range is
// not in the file.
char* local_reference(const MemoryKey& key, const SharedSpan& span, uint32_t pd, uint32_t needed, uint64_t addr,
                      uint64_t length, const PeerBackings::View& window) {
  if (transport::is_on_demand(key) || !transport::local_key_allows(key, pd, needed, addr, length)) return nullptr;
  auto* at = static_cast<char*>(transport::owner_address(key, addr));
  if (char* in_file = in_window(span, reinterpret_cast<uint64_t>(at), length, window)) return in_file;
  return at;
}

// ShmChannel::send_direct, one receive SGE at a time: the whole SGE within
// the key, the bytes written through the window only.
char* receive_reference(const MemoryKey& key, const SharedSpan& span, uint32_t pd, uint32_t needed, uint64_t addr,
                        uint64_t length, const PeerBackings::View& window) {
  if (transport::is_on_demand(key) || !transport::local_key_allows(key, pd, needed, addr, length)) return nullptr;
  return in_window(span, reinterpret_cast<uint64_t>(transport::owner_address(key, addr)), length, window);
}

constexpr uint32_t kPd = 7;
constexpr uint32_t kQpn = 0x1234;
char g_file[1 << 16];  // stands in for the window's mapping; only addresses are compared

MemoryKey region(uint64_t iova, uint64_t length, uint64_t host_addr, uint32_t access) {
  return MemoryKey{0x100, kPd, access, iova, length, host_addr, KeyKind::kRegion, 0};
}

TEST(KeyGrant, CoversTheKeyInsideTheWindowAndLandsWhereTheChecksLand) {
  // A 16 KiB MR at iova 0x10000 (owner address 0x7000'0000), its pages at
  // file offset 0x2000, a window of 0x5000 bytes: the grant stops where the
  // window does (0x3000 of the span).
  const MemoryKey key = region(0x10000, 0x4000, 0x7000'0000, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  const SharedSpan span{0x7000'0000, 0x4000, 0x2000};
  const PeerBackings::View window{g_file, 0x5000};
  const KeyGrant g = remote_grant(key, span, 42, kPd, kQpn, window);
  ASSERT_EQ(g.key, key.key);
  EXPECT_EQ(g.seq, 42u);
  EXPECT_EQ(g.lo, 0x10000u);
  EXPECT_EQ(g.hi, 0x13000u);
  EXPECT_EQ(g.find(key.key, IBV_ACCESS_REMOTE_WRITE, 0x10000, 8), g_file + 0x2000);
  EXPECT_EQ(g.find(key.key, IBV_ACCESS_REMOTE_READ, 0x12ff8, 8), g_file + 0x4ff8);
  EXPECT_EQ(g.owner_address(0x10010), 0x7000'0010u);
  EXPECT_EQ(g.find(key.key, IBV_ACCESS_REMOTE_WRITE, 0x12ff8, 9), nullptr);   // past the window
  EXPECT_EQ(g.find(key.key, IBV_ACCESS_REMOTE_ATOMIC, 0x10000, 8), nullptr);  // not granted
  EXPECT_EQ(g.find(key.key + 1, IBV_ACCESS_REMOTE_WRITE, 0x10000, 8), nullptr);
  EXPECT_EQ(g.find(key.key, IBV_ACCESS_REMOTE_WRITE, 0xfff8, 8), nullptr);    // below the key
  EXPECT_EQ(g.find(key.key, IBV_ACCESS_REMOTE_WRITE, UINT64_MAX - 4, 8), nullptr);
}

TEST(KeyGrant, GrantsNothingTheChecksWouldRefuseWhole) {
  const SharedSpan span{0x7000'0000, 0x4000, 0};
  const PeerBackings::View window{g_file, 0x4000};
  MemoryKey key = region(0x10000, 0x4000, 0x7000'0000, IBV_ACCESS_REMOTE_WRITE);
  EXPECT_EQ(remote_grant(key, span, 2, kPd + 1, kQpn, window).key, 0u);  // another PD
  key.access |= IBV_ACCESS_ON_DEMAND;
  EXPECT_EQ(remote_grant(key, span, 2, kPd, kQpn, window).key, 0u);  // pages checked per use
  key = region(0x10000, 0x4000, 0x7000'0000, IBV_ACCESS_REMOTE_WRITE);
  key.kind = KeyKind::kWindow2;
  key.qpn = kQpn + 1;
  EXPECT_EQ(remote_grant(key, span, 2, kPd, kQpn, window).key, 0u);  // a type 2 window of another QP
  EXPECT_EQ(local_grant(key, span, 2, kPd, window).key, 0u);         // an lkey never names a window
  EXPECT_EQ(receive_grant(key, span, 2, kPd, window).key, 0u);       // ... nor does a receive's
  key = region(0x10000, 0x4000, 0x7000'0000, IBV_ACCESS_REMOTE_WRITE);
  EXPECT_EQ(remote_grant(key, SharedSpan{}, 2, kPd, kQpn, window).key, 0u);  // not in the file
  EXPECT_EQ(receive_grant(key, SharedSpan{}, 2, kPd, window).key, 0u);  // another process's: the file or nothing
  EXPECT_EQ(remote_grant(key, span, 2, kPd, kQpn, PeerBackings::View{}).key, 0u);  // no window
  key.length = 0;
  EXPECT_EQ(remote_grant(key, span, 2, kPd, kQpn, window).key, 0u);
}

TEST(KeyGrant, LocalKeyNotInTheFileIsReachedAtItsOwnAddress) {
  const MemoryKey key = region(0x5000, 0x1000, 0x5000, IBV_ACCESS_LOCAL_WRITE);
  const KeyGrant g = local_grant(key, SharedSpan{}, 4, kPd, PeerBackings::View{});
  ASSERT_EQ(g.key, key.key);
  EXPECT_EQ(g.find(key.key, IBV_ACCESS_LOCAL_WRITE, 0x5800, 16), reinterpret_cast<char*>(0x5800));
  EXPECT_EQ(g.find(key.key, 0, 0x5ff0, 17), nullptr);
}

// Random keys, spans, windows and references: wherever the grant answers,
// the checks answer the same address; inside key, span and window, with the
// PD and access right, the grant answers.
TEST(KeyGrant, NeverWiderThanTheChecksAndCoversWhatTheyAllowInTheWindow) {
  std::mt19937_64 rng(20261127);
  auto pick = [&](uint64_t n) { return rng() % n; };
  const uint32_t accesses[] = {IBV_ACCESS_REMOTE_WRITE, IBV_ACCESS_REMOTE_READ, IBV_ACCESS_REMOTE_ATOMIC,
                               IBV_ACCESS_LOCAL_WRITE, 0};
  int answered = 0;
  for (int round = 0; round < 4000; ++round) {
    const uint64_t host_addr = 0x7000'0000 + pick(0x1000) * 8;
    const uint64_t iova = pick(4) == 0 ? host_addr : pick(1ULL << 40);
    const uint64_t length = 1 + pick(0x3000);
    MemoryKey key = region(iova, length, host_addr, 0);
    for (uint32_t a : accesses)
      if (pick(2)) key.access |= a;
    if (pick(10) == 0) key.access |= IBV_ACCESS_ON_DEMAND;
    const uint32_t kind = static_cast<uint32_t>(pick(3));
    key.kind = static_cast<KeyKind>(kind);
    key.qpn = pick(2) ? kQpn : kQpn + 1;
    SharedSpan span{};
    if (pick(5) != 0) {  // pages in the file: the whole range, or a part around it
      const uint64_t before = pick(3) == 0 ? pick(0x800) : 0;
      span = SharedSpan{host_addr - before + pick(0x400), before + length - pick(0x400) + pick(0x800), pick(0x2000)};
    }
    const PeerBackings::View window = pick(6) == 0 ? PeerBackings::View{} : PeerBackings::View{g_file, pick(0x6000)};
    const uint32_t pd = pick(8) == 0 ? kPd + 1 : kPd;
    const uint32_t seq = static_cast<uint32_t>(pick(1000)) * 2;
    const KeyGrant remote = remote_grant(key, span, seq, pd, kQpn, window);
    const KeyGrant local = local_grant(key, span, seq, pd, window);
    const KeyGrant receive = receive_grant(key, span, seq, pd, window);
    for (int q = 0; q < 40; ++q) {
      const uint64_t addr = iova - 0x100 + pick(length + 0x200);
      const uint64_t n = 1 + pick(q % 4 == 0 ? 0x1000 : 64);
      const uint32_t needed = accesses[pick(5)];
      char* expect = remote_reference(key, span, kPd, kQpn, needed, addr, n, window);
      if (char* got = remote.find(key.key, needed, addr, n)) {
        ++answered;
        ASSERT_EQ(got, expect) << "remote grant wider than the checks: round " << round << " addr " << addr;
        EXPECT_EQ(remote.owner_address(addr), reinterpret_cast<uint64_t>(transport::owner_address(key, addr)));
      } else if (expect != nullptr && pd == kPd) {
        ADD_FAILURE() << "the checks let through what the grant misses: round " << round << " addr " << addr;
      }
      expect = local_reference(key, span, kPd, needed, addr, n, window);
      if (char* got = local.find(key.key, needed, addr, n)) {
        ++answered;
        ASSERT_EQ(got, expect) << "local grant wider than the checks: round " << round << " addr " << addr;
      }
      expect = receive_reference(key, span, kPd, needed, addr, n, window);
      if (char* got = receive.find(key.key, needed, addr, n)) {
        ++answered;
        ASSERT_EQ(got, expect) << "receive grant wider than the checks: round " << round << " addr " << addr;
      } else if (expect != nullptr && pd == kPd) {
        ADD_FAILURE() << "the checks let a receive through that the grant misses: round " << round << " addr "
                      << addr;
      }
    }
  }
  EXPECT_GT(answered, 10000);  // the grants do answer, often
}

}  // namespace
}  // namespace softhca::link
