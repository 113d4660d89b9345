// Two processes: a forked child opens its own context (after the fork), the
// two exchange QPN, rkey and address over pipes, then RDMA_WRITE, RDMA_READ and
// SEND go both ways with byte checks. And a child SIGKILLed while connected:
// the parent's next operation ends in IBV_WC_RETRY_EXC_ERR, never a hang.
//
// The child never uses gtest: it reports through its exit status (0 = good,
// otherwise the number of the step that failed) and through the pipes.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>

#include "child_process.hpp"
#include "loopback.hpp"
#include "xrc.hpp"

// The system's random source as softhca's host registry reads it
// (getrandom: QPNs and keys are drawn from it), with a recording and a
// replay for the stale-connection test: this definition in the executable
// comes before libc's for every library the process loads, ours included.
// Outside those two windows it is the system call itself.
namespace draws {
std::atomic<bool> recording{false};
std::atomic<bool> replaying{false};
std::atomic<int> recorded_count{0};
unsigned char recorded[8];
}  // namespace draws

extern "C" ssize_t getrandom(void* buffer, size_t length, unsigned int flags) {
  if (length == sizeof draws::recorded && draws::replaying.load()) {
    std::memcpy(buffer, draws::recorded, length);
    return static_cast<ssize_t>(length);
  }
  const long got = ::syscall(SYS_getrandom, buffer, length, flags);
  if (got == static_cast<long>(sizeof draws::recorded) && draws::recording.load()) {
    std::memcpy(draws::recorded, buffer, sizeof draws::recorded);
    draws::recorded_count.fetch_add(1);
  }
  return got;
}

namespace loopback {
namespace {

struct Endpoint {
  uint32_t qpn;
  uint32_t rkey;
  uint64_t addr;
};

constexpr Millis kChildDeadline{15000};

// The one RC QP of a side of these tests, with a CQ of its own (16 entries)
// for both queues; nullptr (and no CQ left behind) when either fails.
ibv_qp* rc_qp_with_cq(Device& dev, const QpConfig& cfg, ibv_cq** cq) {
  *cq = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);
  if (*cq == nullptr) return nullptr;
  ibv_qp* qp = create_qp(dev.pd, *cq, *cq, cfg);
  if (qp == nullptr) {
    ibv_destroy_cq(*cq);
    *cq = nullptr;
  }
  return qp;
}

// Buffer layout of the data test.
constexpr size_t kWriteLen = 65536;      // parent writes into the child's [0, 64K)
constexpr size_t kReadOff = 65536;       // parent reads the child's [64K, 128K)
constexpr size_t kReadLen = 65536;
constexpr size_t kSendOff = 131072;      // the child's receive buffer
constexpr size_t kSendLen = 65539;
constexpr size_t kBackOff = 262144;      // the child writes into the parent's [256K, 288K)
constexpr size_t kBackLen = 32768;
constexpr size_t kBufLen = 327680;

// The child side of the data exchange.
int data_child(int rfd, int wfd) {
  Device dev;
  if (!dev.ok()) return 10;
  QpConfig cfg;
  ibv_cq* cq = ibv_create_cq(dev.ctx, 64, nullptr, nullptr, 0);
  if (!cq) return 11;
  ibv_qp* qp = create_qp(dev.pd, cq, cq, cfg);
  if (!qp) return 12;
  Buffer buf(dev.pd, kBufLen);
  if (!buf.mr()) return 13;
  fill_pattern(buf.span(kReadOff, kReadLen), 2);
  if (qp_to_init(qp, cfg) != 0) return 15;  // receives may be posted from INIT on
  ibv_sge rsge = buf.sge(kSendOff, kSendLen + 100);
  if (post_recv(qp, 1, &rsge, 1) != 0) return 14;
  const Endpoint mine{qp->qp_num, buf.rkey(), buf.addr()};
  Endpoint peer{};
  if (!write_all(wfd, &mine, sizeof mine) || !read_all(rfd, &peer, sizeof peer, kChildDeadline)) return 16;
  if (qp_to_rtr(qp, peer.qpn, dev.gid, cfg) != 0 || qp_to_rts(qp, cfg) != 0) return 17;
  if (!write_all(wfd, "R", 1)) return 18;

  // The parent's WRITE, READ and SEND; the SEND comes last, so when its
  // receive completes the WRITE is in place.
  ibv_wc wc{};
  if (!poll_one(cq, &wc, kChildDeadline)) return 20;
  if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV || wc.byte_len != kSendLen || wc.src_qp != peer.qpn)
    return 21;
  std::vector<uint8_t> expect(kWriteLen);
  fill_pattern(expect, 1);
  uint32_t verdict = 0;
  if (first_mismatch(buf.span(0, kWriteLen), expect) != -1) verdict |= 1;
  expect.resize(kSendLen);
  fill_pattern(expect, 3);
  if (first_mismatch(buf.span(kSendOff, kSendLen), expect) != -1) verdict |= 2;
  std::vector<uint8_t> read_region(kReadLen);
  fill_pattern(read_region, 2);
  if (first_mismatch(buf.span(kReadOff, kReadLen), read_region) != -1) verdict |= 4;  // READ must not change it

  // Back the other way: a WRITE into the parent, then SEND_WITH_IMM carrying the verdict.
  fill_pattern(buf.span(0, kBackLen), 4);
  ibv_sge sge = buf.sge(0, kBackLen);
  ibv_send_wr write = make_wr(2, IBV_WR_RDMA_WRITE, &sge, 1);
  write.wr.rdma.remote_addr = peer.addr + kBackOff;
  write.wr.rdma.rkey = peer.rkey;
  ibv_send_wr send = make_wr(3, IBV_WR_SEND_WITH_IMM, nullptr, 0);
  send.imm_data = htonl(verdict);
  write.next = &send;
  ibv_send_wr* bad = nullptr;
  if (ibv_post_send(qp, &write, &bad) != 0) return 30;
  auto wcs = poll_n(cq, 2, kChildDeadline);
  if (wcs.size() != 2 || wcs[0].status != IBV_WC_SUCCESS || wcs[1].status != IBV_WC_SUCCESS) return 31;

  char quit = 0;
  if (!read_all(rfd, &quit, 1, kChildDeadline) || quit != 'Q') return 40;
  if (ibv_destroy_qp(qp) != 0 || ibv_destroy_cq(cq) != 0) return 41;
  return 0;
}

TEST(TwoProcesses, WriteReadSendBothWays) {
  Child child(data_child);
  ASSERT_TRUE(child.ok());
  Device dev;  // opened after the fork: the child has its own
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  ibv_cq* cq = ibv_create_cq(dev.ctx, 64, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp* qp = create_qp(dev.pd, cq, cq, cfg);
  ASSERT_NE(qp, nullptr);
  {
    Buffer buf(dev.pd, kBufLen);
    ASSERT_NE(buf.mr(), nullptr);
    ASSERT_EQ(qp_to_init(qp, cfg), 0);
    ASSERT_EQ(post_recv(qp, 9, nullptr, 0), 0);  // for the child's SEND_WITH_IMM
    const Endpoint mine{qp->qp_num, buf.rkey(), buf.addr()};
    Endpoint peer{};
    ASSERT_TRUE(write_all(child.wfd, &mine, sizeof mine));
    ASSERT_TRUE(read_all(child.rfd, &peer, sizeof peer, kDeadline)) << "child exited with " << child.wait_exit(Millis{100});
    ASSERT_EQ(qp_to_rtr(qp, peer.qpn, dev.gid, cfg), 0);
    ASSERT_EQ(qp_to_rts(qp, cfg), 0);
    char ready = 0;
    ASSERT_TRUE(read_all(child.rfd, &ready, 1, kDeadline));
    ASSERT_EQ(ready, 'R');

    // WRITE into the child.
    fill_pattern(buf.span(0, kWriteLen), 1);
    ibv_sge wsge = buf.sge(0, kWriteLen);
    ibv_send_wr wr = make_wr(1, IBV_WR_RDMA_WRITE, &wsge, 1);
    wr.wr.rdma.remote_addr = peer.addr;
    wr.wr.rdma.rkey = peer.rkey;
    ASSERT_EQ(post_send(qp, wr), 0);
    ibv_wc wc{};
    ASSERT_TRUE(poll_one(cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
    // READ from the child, scattered over two SGEs.
    ibv_sge rsges[2] = {buf.sge(kReadOff, 1000), buf.sge(kReadOff + 1000, kReadLen - 1000)};
    wr = make_wr(2, IBV_WR_RDMA_READ, rsges, 2);
    wr.wr.rdma.remote_addr = peer.addr + kReadOff;
    wr.wr.rdma.rkey = peer.rkey;
    ASSERT_EQ(post_send(qp, wr), 0);
    ASSERT_TRUE(poll_one(cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
    EXPECT_EQ(wc.opcode, IBV_WC_RDMA_READ);
    EXPECT_EQ(wc.byte_len, kReadLen);
    std::vector<uint8_t> expect(kReadLen);
    fill_pattern(expect, 2);
    EXPECT_EQ(first_mismatch(buf.span(kReadOff, kReadLen), expect), -1);
    // SEND to the child.
    fill_pattern(buf.span(kSendOff, kSendLen), 3);
    ibv_sge ssge = buf.sge(kSendOff, kSendLen);
    wr = make_wr(3, IBV_WR_SEND, &ssge, 1);
    ASSERT_EQ(post_send(qp, wr), 0);
    ASSERT_TRUE(poll_one(cq, &wc));
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);

    // The child's WRITE and its verdict.
    ASSERT_TRUE(poll_one(cq, &wc, kChildDeadline)) << "child exited with " << child.wait_exit(Millis{100});
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
    EXPECT_EQ(wc.wr_id, 9u);
    EXPECT_EQ(wc.opcode, IBV_WC_RECV);
    EXPECT_EQ(wc.src_qp, peer.qpn);
    ASSERT_NE(wc.wc_flags & IBV_WC_WITH_IMM, 0u);
    EXPECT_EQ(ntohl(wc.imm_data), 0u) << "child saw wrong bytes (1: WRITE, 2: SEND, 4: READ source)";
    expect.resize(kBackLen);
    fill_pattern(expect, 4);
    EXPECT_EQ(first_mismatch(buf.span(kBackOff, kBackLen), expect), -1);
    ASSERT_TRUE(write_all(child.wfd, "Q", 1));
    EXPECT_EQ(child.wait_exit(kChildDeadline), 0);
  }
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

// Where a registered range lives, from /proc/self/maps: the path of the
// mapping that holds `addr` ("" for anonymous memory).
std::string mapping_of(const void* addr) {
  FILE* maps = std::fopen("/proc/self/maps", "r");
  if (maps == nullptr) return "?";
  char line[512];
  std::string found = "?";
  const auto a = reinterpret_cast<uintptr_t>(addr);
  while (std::fgets(line, sizeof line, maps)) {
    unsigned long begin = 0, end = 0;
    int path_at = 0;
    if (std::sscanf(line, "%lx-%lx %*s %*s %*s %*s %n", &begin, &end, &path_at) < 2) continue;
    if (a < begin || a >= end) continue;
    found = path_at > 0 ? std::string(line + path_at) : std::string();
    while (!found.empty() && (found.back() == '\n' || found.back() == ' ')) found.pop_back();
    break;
  }
  std::fclose(maps);
  return found;
}

// With SOFTHCA_SHARED_MR at its default, registering heap memory moves its
// pages into the process's shared file (so peers copy into it without a
// system call), keeps its bytes, and deregistering moves them back. Where
// malloc put the buffer depends on what the process freed before: glibc
// raises its mmap threshold after large frees, so in a process that ran
// other tests first 1 MiB comes from the brk heap, not a mapping of its own.
TEST(SharedMr, HeapMemoryMovesIntoTheSharedFileWhileRegistered) {
  if (const char* v = std::getenv("SOFTHCA_SHARED_MR"); v != nullptr && std::string(v) == "off")
    GTEST_SKIP() << "SOFTHCA_SHARED_MR=off";
  Device dev;
  ASSERT_TRUE(dev.ok());
  std::vector<uint8_t> bytes(1 << 20);
  fill_pattern(bytes, 7);
  const std::string before = mapping_of(bytes.data() + 4096);
  EXPECT_TRUE(before == "" || before == "[heap]") << before;
  ibv_mr* mr = ibv_reg_mr(dev.pd, bytes.data(), bytes.size(), Buffer::kAllAccess);
  ASSERT_NE(mr, nullptr);
  EXPECT_NE(mapping_of(bytes.data() + 4096).find("softhca-registered"), std::string::npos)
      << mapping_of(bytes.data() + 4096);
  std::vector<uint8_t> expect(bytes.size());
  fill_pattern(expect, 7);
  EXPECT_EQ(first_mismatch(bytes, expect), -1);
  ASSERT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(mapping_of(bytes.data() + 4096), before);
  EXPECT_EQ(first_mismatch(bytes, expect), -1);
}

// ---------------------------------------------------------------------------
// Deregistration fences a peer's RDMA WRITE: the target deregisters a 64 MiB
// MR while a peer's 64 MiB WRITE into it is under way, then reuses the
// memory. Nothing of the WRITE may land after ibv_dereg_mr returned, and the
// initiator sees REM_ACCESS_ERR (or SUCCESS, had the WRITE finished first).

constexpr size_t kFenceLen = 64u << 20;
constexpr uint8_t kWritten = 0xAB;  // what the peer writes
constexpr uint8_t kReused = 0x5A;   // what the target stores after dereg

// The initiator: one 64 MiB WRITE into the parent on its cue, then its
// completion status back through the pipe.
int fence_writer_child(int rfd, int wfd) {
  Device dev;
  if (!dev.ok()) return 10;
  QpConfig cfg;
  cfg.retry_cnt = 1;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = rc_qp_with_cq(dev, cfg, &cq);
  if (!qp) return 11;
  Buffer src(dev.pd, kFenceLen, Buffer::kAllAccess, kWritten);
  if (!src.mr()) return 13;
  const Endpoint mine{qp->qp_num, src.rkey(), src.addr()};
  Endpoint peer{};
  if (!write_all(wfd, &mine, sizeof mine) || !read_all(rfd, &peer, sizeof peer, kChildDeadline)) return 16;
  if (bring_up(qp, peer.qpn, dev.gid, cfg) != 0) return 17;
  char go = 0;
  if (!read_all(rfd, &go, 1, kChildDeadline) || go != 'G') return 18;
  ibv_sge sge = src.sge(0, static_cast<uint32_t>(kFenceLen));
  ibv_send_wr wr = make_wr(1, IBV_WR_RDMA_WRITE, &sge, 1);
  wr.wr.rdma.remote_addr = peer.addr;
  wr.wr.rdma.rkey = peer.rkey;
  if (post_send(qp, wr) != 0) return 19;
  ibv_wc wc{};
  if (!poll_one(cq, &wc, kChildDeadline)) return 20;
  const int32_t status = wc.status;
  if (!write_all(wfd, &status, sizeof status)) return 21;
  char quit = 0;
  if (!read_all(rfd, &quit, 1, kChildDeadline) || quit != 'Q') return 40;
  ibv_destroy_qp(qp);
  ibv_destroy_cq(cq);
  return 0;
}

class DeregFence : public ::testing::TestWithParam<int> {};

TEST_P(DeregFence, NoWriteLandsAfterDeregReturns) {
  Child child(fence_writer_child);
  ASSERT_TRUE(child.ok());
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = rc_qp_with_cq(dev, cfg, &cq);
  ASSERT_NE(qp, nullptr);
  std::vector<uint8_t> target(kFenceLen, 0);
  ibv_mr* mr = ibv_reg_mr(dev.pd, target.data(), target.size(), Buffer::kAllAccess);
  ASSERT_NE(mr, nullptr);
  const Endpoint mine{qp->qp_num, mr->rkey, reinterpret_cast<uint64_t>(target.data())};
  Endpoint peer{};
  ASSERT_TRUE(write_all(child.wfd, &mine, sizeof mine));
  ASSERT_TRUE(read_all(child.rfd, &peer, sizeof peer, kDeadline)) << "child exited with " << child.wait_exit(Millis{100});
  ASSERT_EQ(bring_up(qp, peer.qpn, dev.gid, cfg), 0);
  ASSERT_TRUE(write_all(child.wfd, "G", 1));
  // Deregister as soon as the WRITE is seen landing.
  const auto until = Clock::now() + kChildDeadline;
  while (__atomic_load_n(&target[0], __ATOMIC_ACQUIRE) != kWritten)
    ASSERT_LT(Clock::now(), until) << "the WRITE never started";
  ASSERT_EQ(ibv_dereg_mr(mr), 0);
  std::memset(target.data(), kReused, target.size());
  int32_t status = -1;
  ASSERT_TRUE(read_all(child.rfd, &status, sizeof status, kChildDeadline)) << "child exited with " << child.wait_exit(Millis{100});
  EXPECT_TRUE(status == IBV_WC_REM_ACCESS_ERR || status == IBV_WC_SUCCESS)
      << "initiator status " << ibv_wc_status_str(static_cast<ibv_wc_status>(status));
  EXPECT_EQ(first_not(target, kReused), -1) << "the peer's WRITE landed after ibv_dereg_mr returned";
  ASSERT_TRUE(write_all(child.wfd, "Q", 1));
  EXPECT_EQ(child.wait_exit(kChildDeadline), 0);
  drain_async_events(dev.ctx);  // QP_ACCESS_ERR when the WRITE was cut
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

INSTANTIATE_TEST_SUITE_P(Runs, DeregFence, ::testing::Range(0, 3));

// The same fence for a memory window, across processes: the child writes
// 16 KiB WRITEs one at a time through a type 2 window of the parent until
// one fails; the parent invalidates the window (LOCAL_INV, or deallocates
// it) while they land, and reuses the memory as soon as that returned. No
// byte of the child's may land after, and its first WRITE after fails with
// REM_ACCESS_ERR.

constexpr size_t kWindowLen = 16 * 1024;

int window_writer_child(int rfd, int wfd) {
  Device dev;
  if (!dev.ok()) return 10;
  QpConfig cfg;
  cfg.retry_cnt = 1;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = rc_qp_with_cq(dev, cfg, &cq);
  if (!qp) return 11;
  Buffer src(dev.pd, kWindowLen, Buffer::kAllAccess, kWritten);
  if (!src.mr()) return 13;
  const Endpoint mine{qp->qp_num, src.rkey(), src.addr()};
  Endpoint peer{};
  if (!write_all(wfd, &mine, sizeof mine) || !read_all(rfd, &peer, sizeof peer, kChildDeadline)) return 16;
  if (bring_up(qp, peer.qpn, dev.gid, cfg) != 0) return 17;
  char go = 0;
  if (!read_all(rfd, &go, 1, kChildDeadline) || go != 'G') return 18;
  ibv_sge sge = src.sge(0, static_cast<uint32_t>(kWindowLen));
  ibv_send_wr wr = make_wr(1, IBV_WR_RDMA_WRITE, &sge, 1);
  wr.wr.rdma.remote_addr = peer.addr;
  wr.wr.rdma.rkey = peer.rkey;
  int32_t status = IBV_WC_SUCCESS;
  for (int i = 0; i < 1000000 && status == IBV_WC_SUCCESS; ++i) {
    if (post_send(qp, wr) != 0) return 19;
    ibv_wc wc{};
    if (!poll_one(cq, &wc, kChildDeadline)) return 20;
    status = wc.status;
    // The cue that WRITEs land (the parent must not read the memory they
    // land in to see it: over the udp link its own thread writes there).
    if (i == 9 && status == IBV_WC_SUCCESS && !write_all(wfd, "W", 1)) return 22;
  }
  if (!write_all(wfd, &status, sizeof status)) return 21;
  char quit = 0;
  if (!read_all(rfd, &quit, 1, kChildDeadline) || quit != 'Q') return 40;
  ibv_destroy_qp(qp);
  ibv_destroy_cq(cq);
  return 0;
}

// The same fence for device memory: the child writes 16 KiB WRITEs one at a
// time into an MR over the parent's DM until one fails; the parent
// deregisters that MR while they land and overwrites the DM as soon as the
// call returned. No byte of the child's may land after.
TEST(DeviceMemoryFence, NoWriteLandsInTheDmAfterItsMrWent) {
  Child child(window_writer_child);
  ASSERT_TRUE(child.ok());
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = rc_qp_with_cq(dev, cfg, &cq);
  ASSERT_NE(qp, nullptr);
  ibv_alloc_dm_attr dm_attr{};
  dm_attr.length = kWindowLen;
  ibv_dm* dm = ibv_alloc_dm(dev.ctx, &dm_attr);
  ASSERT_NE(dm, nullptr) << "errno " << errno;
  ibv_mr* mr = ibv_reg_dm_mr(dev.pd, dm, 0, kWindowLen,
                             IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_NE(mr, nullptr) << "errno " << errno;
  Endpoint peer{};
  ASSERT_TRUE(read_all(child.rfd, &peer, sizeof peer, kDeadline)) << "child exited with " << child.wait_exit(Millis{100});
  ASSERT_EQ(bring_up(qp, peer.qpn, dev.gid, cfg), 0);
  const Endpoint mine{qp->qp_num, mr->rkey, 0};  // zero-based
  ASSERT_TRUE(write_all(child.wfd, &mine, sizeof mine));
  ASSERT_TRUE(write_all(child.wfd, "G", 1));
  char landing = 0;
  ASSERT_TRUE(read_all(child.rfd, &landing, 1, kChildDeadline)) << "the WRITEs never started";
  ASSERT_EQ(landing, 'W');
  ASSERT_EQ(ibv_dereg_mr(mr), 0);
  const std::vector<uint8_t> reused(kWindowLen, kReused);
  ASSERT_EQ(ibv_memcpy_to_dm(dm, 0, reused.data(), reused.size()), 0);
  int32_t status = -1;
  ASSERT_TRUE(read_all(child.rfd, &status, sizeof status, kChildDeadline)) << "child exited with " << child.wait_exit(Millis{100});
  EXPECT_EQ(status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(static_cast<ibv_wc_status>(status));
  std::vector<uint8_t> seen(kWindowLen);
  ASSERT_EQ(ibv_memcpy_from_dm(seen.data(), dm, 0, seen.size()), 0);
  EXPECT_EQ(first_not(seen, kReused), -1) << "a WRITE landed in the DM after its MR was deregistered";
  ASSERT_TRUE(write_all(child.wfd, "Q", 1));
  EXPECT_EQ(child.wait_exit(kChildDeadline), 0);
  drain_async_events(dev.ctx);
  EXPECT_EQ(ibv_free_dm(dm), 0);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

// On-demand paging across processes: an ODP MR names addresses, not pages.
// The child registers an explicit ODP MR and then replaces the pages under
// it (mmap MAP_FIXED): the parent's next WRITE must land in the new pages,
// where the child sees it, as on a NIC whose page tables follow the
// process's. Then the child maps the range PROT_NONE: the next WRITE fails
// with REM_ACCESS_ERR and neither process faults.
constexpr size_t kOdpLen = 2 * 4096;

int odp_remap_child(int rfd, int wfd) {
  Device dev;
  if (!dev.ok()) return 10;
  QpConfig cfg;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = rc_qp_with_cq(dev, cfg, &cq);
  if (!qp) return 11;
  void* base = ::mmap(nullptr, kOdpLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return 13;
  ibv_mr* mr = ibv_reg_mr(dev.pd, base, kOdpLen, Buffer::kAllAccess | IBV_ACCESS_ON_DEMAND);
  if (mr == nullptr) return 14;
  const Endpoint mine{qp->qp_num, mr->rkey, reinterpret_cast<uint64_t>(base)};
  Endpoint peer{};
  if (!write_all(wfd, &mine, sizeof mine) || !read_all(rfd, &peer, sizeof peer, kChildDeadline)) return 16;
  if (bring_up(qp, peer.qpn, dev.gid, cfg) != 0) return 17;
  if (!write_all(wfd, "R", 1)) return 18;
  // Each round: the parent wrote pattern `round` and says so; we check it.
  for (uint8_t round = 1; round <= 2; ++round) {
    char done = 0;
    if (!read_all(rfd, &done, 1, kChildDeadline) || done != 'W') return 20 + round;
    // Read through the kernel: over the udp link this process's own link
    // thread wrote the bytes, ordered before this read only by the peer's
    // message, which TSan cannot see (it would report a race).
    std::vector<uint8_t> seen(kOdpLen);
    const iovec from{base, kOdpLen}, to{seen.data(), kOdpLen};
    if (::process_vm_readv(::getpid(), &to, 1, &from, 1, 0) != static_cast<ssize_t>(kOdpLen)) return 29;
    for (size_t i = 0; i < kOdpLen; ++i)
      if (seen[i] != round) return 30 + round;
    // Fresh zero pages at the same addresses, under the same MR. A raw
    // system call, for the reason above: TSan counts mmap(2) as a write to
    // the range, which the link thread's next WRITE would seem to race.
    const int prot = round == 1 ? PROT_READ | PROT_WRITE : PROT_NONE;
    if (::syscall(SYS_mmap, base, kOdpLen, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) !=
        reinterpret_cast<long>(base))
      return 40 + round;
    if (!write_all(wfd, "M", 1)) return 42;
  }
  char quit = 0;
  if (!read_all(rfd, &quit, 1, kChildDeadline) || quit != 'Q') return 50;
  drain_async_events(dev.ctx);
  if (ibv_dereg_mr(mr) != 0) return 51;
  ibv_destroy_qp(qp);
  ibv_destroy_cq(cq);
  return 0;
}

TEST(OdpAcrossProcesses, WritesFollowThePagesMappedNowAndFailWhereNoneAre) {
  Child child(odp_remap_child);
  ASSERT_TRUE(child.ok());
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.retry_cnt = 1;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = rc_qp_with_cq(dev, cfg, &cq);
  ASSERT_NE(qp, nullptr);
  Buffer src(dev.pd, kOdpLen);
  ASSERT_NE(src.mr(), nullptr);
  Endpoint peer{};
  ASSERT_TRUE(read_all(child.rfd, &peer, sizeof peer, kChildDeadline)) << "child exited with " << child.wait_exit(Millis{100});
  const Endpoint mine{qp->qp_num, src.rkey(), src.addr()};
  ASSERT_TRUE(write_all(child.wfd, &mine, sizeof mine));
  ASSERT_EQ(bring_up(qp, peer.qpn, dev.gid, cfg), 0);
  char ready = 0;
  ASSERT_TRUE(read_all(child.rfd, &ready, 1, kChildDeadline)) << "child exited with " << child.wait_exit(Millis{100});
  auto write_round = [&](uint8_t value) {
    std::memset(src.span(0, kOdpLen).data(), value, kOdpLen);
    ibv_sge sge = src.sge(0, static_cast<uint32_t>(kOdpLen));
    ibv_send_wr wr = make_wr(value, IBV_WR_RDMA_WRITE, &sge, 1);
    wr.wr.rdma.remote_addr = peer.addr;
    wr.wr.rdma.rkey = peer.rkey;
    ibv_wc wc{};
    if (post_send(qp, wr) != 0 || !poll_one(cq, &wc, kChildDeadline)) return IBV_WC_GENERAL_ERR;
    return wc.status;
  };
  for (uint8_t round = 1; round <= 2; ++round) {
    ASSERT_EQ(write_round(round), IBV_WC_SUCCESS) << "round " << int{round};
    ASSERT_TRUE(write_all(child.wfd, "W", 1));
    char mapped = 0;
    ASSERT_TRUE(read_all(child.rfd, &mapped, 1, kChildDeadline))
        << "round " << int{round} << ": child exited with " << child.wait_exit(Millis{100});
  }
  // The range is PROT_NONE now: nothing to write into.
  EXPECT_EQ(write_round(3), IBV_WC_REM_ACCESS_ERR);
  ASSERT_TRUE(write_all(child.wfd, "Q", 1));
  EXPECT_EQ(child.wait_exit(kChildDeadline), 0);
  drain_async_events(dev.ctx);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

enum class WindowRevoke { kLocalInvalidate, kDealloc, kSendWithInvalidate };

class WindowFenceProcesses : public ::testing::TestWithParam<WindowRevoke> {};

TEST_P(WindowFenceProcesses, NoWriteLandsAfterTheWindowWent) {
  const WindowRevoke how = GetParam();
  Child child(window_writer_child);
  ASSERT_TRUE(child.ok());
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = rc_qp_with_cq(dev, cfg, &cq);
  ASSERT_NE(qp, nullptr);
  std::vector<uint8_t> target(kWindowLen, 0);
  ibv_mr* mr = ibv_reg_mr(dev.pd, target.data(), target.size(), Buffer::kAllAccess | IBV_ACCESS_MW_BIND);
  ASSERT_NE(mr, nullptr);
  ibv_mw* mw = ibv_alloc_mw(dev.pd, IBV_MW_TYPE_2);
  ASSERT_NE(mw, nullptr);
  Endpoint peer{};
  ASSERT_TRUE(read_all(child.rfd, &peer, sizeof peer, kDeadline)) << "child exited with " << child.wait_exit(Millis{100});
  ASSERT_EQ(bring_up(qp, peer.qpn, dev.gid, cfg), 0);
  ibv_send_wr bind = make_wr(7, IBV_WR_BIND_MW, nullptr, 0);
  bind.bind_mw.mw = mw;
  bind.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
  bind.bind_mw.bind_info = ibv_mw_bind_info{mr, reinterpret_cast<uint64_t>(target.data()), kWindowLen,
                                            IBV_ACCESS_REMOTE_WRITE};
  ASSERT_EQ(post_send(qp, bind), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(cq, &wc));
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  const Endpoint mine{qp->qp_num, bind.bind_mw.rkey, reinterpret_cast<uint64_t>(target.data())};
  ASSERT_TRUE(write_all(child.wfd, &mine, sizeof mine));
  ASSERT_TRUE(write_all(child.wfd, "G", 1));
  char landing = 0;
  ASSERT_TRUE(read_all(child.rfd, &landing, 1, kChildDeadline)) << "the WRITEs never started";
  ASSERT_EQ(landing, 'W');
  // A pair of this process's own, for the SEND WITH INVALIDATE: its
  // responder runs here, and the poll of its receive completion fences.
  QpPair own(dev, QpConfig{});
  ASSERT_TRUE(own.ok());
  if (how == WindowRevoke::kDealloc) {
    ASSERT_EQ(ibv_dealloc_mw(mw), 0);
    mw = nullptr;
  } else if (how == WindowRevoke::kSendWithInvalidate) {
    ibv_sge none{};
    ASSERT_EQ(post_recv(own.b, 9, &none, 0), 0);
    ibv_send_wr send = make_wr(9, IBV_WR_SEND_WITH_INV, nullptr, 0);
    send.invalidate_rkey = bind.bind_mw.rkey;
    ASSERT_EQ(post_send(own.a, send), 0);
    ASSERT_TRUE(poll_one(own.b_recv_cq, &wc));
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
    ASSERT_TRUE(wc.wc_flags & IBV_WC_WITH_INV);
  } else {
    ibv_send_wr inv = make_wr(8, IBV_WR_LOCAL_INV, nullptr, 0);
    inv.invalidate_rkey = bind.bind_mw.rkey;
    ASSERT_EQ(post_send(qp, inv), 0);
    ASSERT_TRUE(poll_one(cq, &wc));
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  }
  std::memset(target.data(), kReused, target.size());
  int32_t status = -1;
  ASSERT_TRUE(read_all(child.rfd, &status, sizeof status, kChildDeadline)) << "child exited with " << child.wait_exit(Millis{100});
  EXPECT_EQ(status, IBV_WC_REM_ACCESS_ERR) << ibv_wc_status_str(static_cast<ibv_wc_status>(status));
  EXPECT_EQ(first_not(target, kReused), -1) << "a WRITE landed through the window after it went";
  ASSERT_TRUE(write_all(child.wfd, "Q", 1));
  EXPECT_EQ(child.wait_exit(kChildDeadline), 0);
  drain_async_events(dev.ctx);
  if (mw != nullptr) {
    EXPECT_EQ(ibv_dealloc_mw(mw), 0);
  }
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

INSTANTIATE_TEST_SUITE_P(Revoke, WindowFenceProcesses,
                         ::testing::Values(WindowRevoke::kLocalInvalidate, WindowRevoke::kDealloc,
                                           WindowRevoke::kSendWithInvalidate),
                         [](const auto& info) {
                           switch (info.param) {
                             case WindowRevoke::kLocalInvalidate: return "LocalInvalidate";
                             case WindowRevoke::kDealloc: return "Dealloc";
                             case WindowRevoke::kSendWithInvalidate: return "SendWithInvalidate";
                           }
                           return "?";
                         });

// The same race inside one process: a thread keeps writing 64 KiB WRITEs into
// an MR while the main thread deregisters it and reuses the memory. Under
// TSan a write landing after dereg would also be reported as a data race
// with the reuse.
// A thread that posts `wr` (its wr_id numbered) on `qp` one at a time, each
// signaled and polled, until an operation fails: `completed` counts the
// successes, `last_status` is the status of the last completion.
class PostingThread {
 public:
  PostingThread(ibv_qp* qp, ibv_cq* cq, ibv_send_wr wr)
      : thread_([this, qp, cq, wr]() mutable {
          for (int i = 0; i < 1000000; ++i) {
            wr.wr_id = static_cast<uint64_t>(i);
            if (post_send(qp, wr) != 0) return;
            ibv_wc wc{};
            if (!poll_one(cq, &wc)) return;
            last_status = wc.status;
            if (wc.status != IBV_WC_SUCCESS) return;
            ++completed;
          }
        }) {}
  ~PostingThread() { join(); }
  void join() {
    if (thread_.joinable()) thread_.join();
  }
  // Whether ten operations succeeded in time.
  bool got_going() {
    const auto until = Clock::now() + kDeadline;
    while (completed.load() < 10 && Clock::now() < until) std::this_thread::yield();
    return completed.load() >= 10;
  }
  std::atomic<int> completed{0};
  std::atomic<int> last_status{-1};

 private:
  std::thread thread_;
};

TEST(DeregFenceThreads, WriterThreadStopsAtDereg) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  QpPair pair(dev, cfg, 64);
  ASSERT_TRUE(pair.ok());
  constexpr size_t kLen = 64 * 1024;
  std::vector<uint8_t> target(kLen, 0);
  ibv_mr* mr = ibv_reg_mr(dev.pd, target.data(), target.size(), Buffer::kAllAccess);
  ASSERT_NE(mr, nullptr);
  Buffer src(dev.pd, kLen, Buffer::kAllAccess, kWritten);
  ibv_sge sge = src.sge(0, kLen);
  ibv_send_wr wr = make_wr(0, IBV_WR_RDMA_WRITE, &sge, 1);
  wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(target.data());
  wr.wr.rdma.rkey = mr->rkey;  // copied: the writer must not read *mr, which dereg frees
  PostingThread writer(pair.a, pair.a_send_cq, wr);
  ASSERT_TRUE(writer.got_going()) << "the writer did not get going";
  ASSERT_EQ(ibv_dereg_mr(mr), 0);
  std::memset(target.data(), kReused, target.size());
  writer.join();
  EXPECT_EQ(writer.last_status.load(), IBV_WC_REM_ACCESS_ERR) << "the writer's first WRITE after dereg";
  EXPECT_EQ(first_not(target, kReused), -1) << "a WRITE landed after ibv_dereg_mr returned";
  drain_async_events(dev.ctx);
}

// The same race against ibv_destroy_qp: a thread keeps sending to QP b, whose
// receives are all posted, while the main thread destroys b and at once
// creates a QP (and its receive queue) in the memory b's shared state and
// queue just gave back. The sender must never reach b once destroy
// returned: none of the new QP's receives is consumed, its CQ stays empty,
// and the sender's operations end in RETRY_EXC_ERR (nobody answers). Under
// TSan a sender still writing into b's old memory would also race with the
// new QP's initialisation.
TEST(DestroyFenceThreads, SenderThreadNeverReachesADestroyedQp) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.timeout = 8;  // 1 ms: the sender gives up soon after b is gone
  cfg.retry_cnt = 1;
  QpPair pair(dev, cfg);
  ASSERT_TRUE(pair.ok());
  constexpr uint32_t kLen = 64;
  Buffer src(dev.pd, kLen, Buffer::kAllAccess, kWritten);
  Buffer landing(dev.pd, 64 * kLen, Buffer::kAllAccess, 0);
  for (uint32_t i = 0; i < cfg.max_recv_wr; ++i) {
    ibv_sge rsge = landing.sge(0, kLen);
    ASSERT_EQ(post_recv(pair.b, i, &rsge, 1), 0);
  }
  ibv_sge sge = src.sge(0, kLen);
  PostingThread sender(pair.a, pair.a_send_cq, make_wr(0, IBV_WR_SEND, &sge, 1));
  ASSERT_TRUE(sender.got_going()) << "the sender did not get going";
  pair.destroy_b();
  // A new QP on b's CQs, in the memory b gave back, as receptive as it can
  // be: receives posted, connected to the sender's QPN.
  ibv_qp* reborn = create_qp(dev.pd, pair.b_send_cq, pair.b_recv_cq, cfg);
  ASSERT_NE(reborn, nullptr);
  ASSERT_EQ(bring_up(reborn, pair.a->qp_num, dev.gid, cfg), 0);
  Buffer fresh(dev.pd, kLen, Buffer::kAllAccess, kReused);
  for (uint64_t i = 0; i < 8; ++i) {
    ibv_sge rsge = fresh.sge(0, kLen);
    ASSERT_EQ(post_recv(reborn, 1000 + i, &rsge, 1), 0);
  }
  sender.join();
  EXPECT_EQ(sender.last_status.load(), IBV_WC_RETRY_EXC_ERR) << "the sender's first SEND after destroy";
  EXPECT_EQ(first_not(fresh.span(0, kLen), kReused), -1) << "a SEND reached the QP created after destroy";
  // b's own receives were flushed or consumed; none may be the new QP's.
  ibv_wc wc{};
  while (ibv_poll_cq(pair.b_recv_cq, 1, &wc) == 1) EXPECT_LT(wc.wr_id, 1000u) << "a receive of the new QP completed";
  drain_async_events(dev.ctx);
  EXPECT_EQ(ibv_destroy_qp(reborn), 0);
}

// A TGT QP with two handles, an INI QP writing through it non-stop (a WRITE
// to an XRC TGT QP lands in memory of the named SRQ's PD): the creator's
// handle goes and the writes go on; the last handle goes and, once
// ibv_destroy_qp returned, no write lands any more (the host's TGT QP
// waits out the initiators inside it, as a process's QP does).
TEST(DestroyFenceThreads, NoWriteLandsThroughATgtQpAfterItsLastHandleGoes) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_xrcd* xrcd = xrc::open_xrcd(dev.ctx, -1, O_CREAT);
  ASSERT_NE(xrcd, nullptr);
  ibv_cq* cq = ibv_create_cq(dev.ctx, 64, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_srq* srq = xrc::create_xrc_srq(dev.ctx, dev.pd, xrcd, cq);
  ibv_qp* tgt = xrc::create_tgt(dev.ctx, xrcd);
  ibv_qp* ini = xrc::create_ini(dev.ctx, dev.pd, cq);
  ASSERT_TRUE(srq != nullptr && tgt != nullptr && ini != nullptr);
  const uint32_t qpn = tgt->qp_num;
  ibv_qp* opened = xrc::open_tgt(dev.ctx, xrcd, qpn);
  ASSERT_NE(opened, nullptr) << "errno " << errno;
  uint32_t srqn = 0;
  ASSERT_EQ(ibv_get_srq_num(srq, &srqn), 0);
  ASSERT_EQ(xrc::to_init(tgt, IBV_ACCESS_REMOTE_WRITE), 0);
  ASSERT_EQ(xrc::to_rtr(tgt, ini->qp_num, dev.gid, true), 0);
  ASSERT_EQ(xrc::to_init(ini, 0), 0);
  ASSERT_EQ(xrc::to_rtr(ini, qpn, dev.gid, false), 0);
  ASSERT_EQ(xrc::ini_to_rts(ini), 0);
  constexpr size_t kLen = 64 * 1024;
  Buffer target(dev.pd, kLen), src(dev.pd, kLen, Buffer::kAllAccess, kWritten);
  ibv_sge sge = src.sge(0, kLen);
  ibv_send_wr wr = make_wr(0, IBV_WR_RDMA_WRITE, &sge, 1);
  wr.wr.rdma.remote_addr = target.addr();
  wr.wr.rdma.rkey = target.rkey();
  wr.qp_type.xrc.remote_srqn = srqn;
  {
    PostingThread writer(ini, cq, wr);
    ASSERT_TRUE(writer.got_going()) << "the writer did not get going";
    ASSERT_EQ(ibv_destroy_qp(tgt), 0);  // the creator's handle: the QP stays
    const int before = writer.completed.load();
    const auto until = Clock::now() + kDeadline;
    while (writer.completed.load() < before + 10 && Clock::now() < until) std::this_thread::yield();
    ASSERT_GE(writer.completed.load(), before + 10) << "the writes stopped with the creator's handle";
    ASSERT_EQ(ibv_destroy_qp(opened), 0);  // the last one
    std::memset(target.data(), kReused, kLen);
    writer.join();
    EXPECT_EQ(writer.last_status.load(), IBV_WC_RETRY_EXC_ERR) << "the writer's first WRITE after destroy";
  }
  EXPECT_EQ(first_not(target.span(0, kLen), kReused), -1) << "a WRITE landed after the last handle went";
  errno = 0;
  EXPECT_EQ(xrc::open_tgt(dev.ctx, xrcd, qpn), nullptr);
  EXPECT_EQ(errno, EINVAL);
  drain_async_events(dev.ctx);
  EXPECT_EQ(ibv_destroy_qp(ini), 0);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_close_xrcd(xrcd), 0);
}

// ---------------------------------------------------------------------------
// A stale connection does not reach a new QP that took its peer's QPN. On
// RoCE the responder's PSN check drops a stale requester's packets; on the
// shm link the QP slot's incarnation does, and the requester ends in
// RETRY_EXC_ERR. QPNs are drawn at random (issue #40), so a QPN comes back
// by a chance of one in 16 million per creation: the target replays the
// draw that gave its first QP its number (draws::replay, below), which
// puts the next QP in the same slot and page. The test runs on a private
// registry (SOFTHCA_RUNTIME_DIR), so that only its own two processes take
// QPNs.

constexpr Millis kStaleDeadline{60000};

int stale_target_child(int rfd, int wfd) {
  Device dev;
  if (!dev.ok()) return 10;
  QpConfig cfg;
  ibv_cq* cq = ibv_create_cq(dev.ctx, 64, nullptr, nullptr, 0);
  if (!cq) return 11;
  draws::recording.store(true);
  ibv_qp* b = create_qp(dev.pd, cq, cq, cfg);
  draws::recording.store(false);
  if (!b) return 12;
  if (draws::recorded_count.load() != 1) return 27;  // creating a QP draws once, for its QPN
  Buffer buf(dev.pd, 4096);
  if (!buf.mr()) return 13;
  const uint32_t old_qpn = b->qp_num;
  uint32_t peer_qpn = 0;
  if (!write_all(wfd, &old_qpn, sizeof old_qpn) || !read_all(rfd, &peer_qpn, sizeof peer_qpn, kChildDeadline)) return 14;
  if (bring_up(b, peer_qpn, dev.gid, cfg) != 0) return 15;
  ibv_sge rsge = buf.sge(0, 64);
  if (post_recv(b, 1, &rsge, 1) != 0) return 16;
  if (!write_all(wfd, "R", 1)) return 17;
  ibv_wc wc{};
  if (!poll_one(cq, &wc, kChildDeadline) || wc.status != IBV_WC_SUCCESS) return 18;
  // Destroy the peer's QP and create one from the same draw: its number.
  if (ibv_destroy_qp(b) != 0) return 19;
  draws::replaying.store(true);
  ibv_qp* reborn = create_qp(dev.pd, cq, cq, cfg);
  draws::replaying.store(false);
  if (!reborn) return 20;
  if (reborn->qp_num != old_qpn) return 22;
  // As receptive as it can be: connected to the stale requester's QPN itself,
  // with receives posted.
  if (bring_up(reborn, peer_qpn, dev.gid, cfg) != 0) return 23;
  for (int i = 0; i < 4; ++i)
    if (post_recv(reborn, 100 + static_cast<uint64_t>(i), &rsge, 1) != 0) return 24;
  if (!write_all(wfd, "N", 1)) return 25;
  char done = 0;
  if (!read_all(rfd, &done, 1, kStaleDeadline) || done != 'D') return 26;
  // The stale requester's retries all ran before it completed: nothing came.
  if (ibv_poll_cq(cq, 1, &wc) != 0) return 30;
  ibv_destroy_qp(reborn);
  ibv_destroy_cq(cq);
  return 0;
}

// A runtime directory of the test's own (SOFTHCA_RUNTIME_DIR), so that only
// the test's processes take QPNs there; unset and removed with the object.
class PrivateRuntimeDir {
 public:
  explicit PrivateRuntimeDir(const char* name) : path_(std::string("/dev/shm/softhca-") + name + "-XXXXXX") {
    ok_ = ::mkdtemp(path_.data()) != nullptr && ::setenv("SOFTHCA_RUNTIME_DIR", path_.c_str(), 1) == 0;
  }
  ~PrivateRuntimeDir() {
    ::unsetenv("SOFTHCA_RUNTIME_DIR");
    std::error_code error;
    std::filesystem::remove_all(path_, error);
    if (error) ADD_FAILURE() << "cannot remove " << path_ << ": " << error.message();
  }
  PrivateRuntimeDir(const PrivateRuntimeDir&) = delete;
  PrivateRuntimeDir& operator=(const PrivateRuntimeDir&) = delete;
  bool ok() const { return ok_; }

 private:
  std::string path_;
  bool ok_ = false;
};

TEST(StaleConnection, NewQpWithTheSameQpnReceivesNothing) {
  PrivateRuntimeDir dir("stale-test");
  ASSERT_TRUE(dir.ok());
  {
    Child child(stale_target_child);
    ASSERT_TRUE(child.ok());
    Device dev;
    ASSERT_TRUE(dev.ok());
    QpConfig cfg;
    cfg.timeout = 8;  // 1 ms
    cfg.retry_cnt = 2;
    ibv_cq* cq = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);
    ASSERT_NE(cq, nullptr);
    ibv_qp* a = create_qp(dev.pd, cq, cq, cfg);
    ASSERT_NE(a, nullptr);
    {
      Buffer buf(dev.pd, 64);
      uint32_t peer_qpn = 0;
      ASSERT_TRUE(read_all(child.rfd, &peer_qpn, sizeof peer_qpn, kDeadline)) << "child exited with " << child.wait_exit(Millis{100});
      ASSERT_TRUE(write_all(child.wfd, &a->qp_num, sizeof a->qp_num));
      ASSERT_EQ(bring_up(a, peer_qpn, dev.gid, cfg), 0);
      char ready = 0;
      ASSERT_TRUE(read_all(child.rfd, &ready, 1, kDeadline));
      ASSERT_EQ(ready, 'R');
      ibv_sge sge = buf.sge(0, 8);
      ibv_send_wr wr = make_wr(1, IBV_WR_SEND, &sge, 1);
      ASSERT_EQ(post_send(a, wr), 0);
      ibv_wc wc{};
      ASSERT_TRUE(poll_one(cq, &wc));
      ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
      ASSERT_TRUE(read_all(child.rfd, &ready, 1, kStaleDeadline)) << "child exited with " << child.wait_exit(Millis{100});
      ASSERT_EQ(ready, 'N');
      wr = make_wr(2, IBV_WR_SEND, &sge, 1);
      ASSERT_EQ(post_send(a, wr), 0);
      ASSERT_TRUE(poll_one(cq, &wc));
      EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR) << wc_str(wc);
      ASSERT_TRUE(write_all(child.wfd, "D", 1));
      EXPECT_EQ(child.wait_exit(kStaleDeadline), 0) << "30: the new QP received the stale SEND";
    }
    EXPECT_EQ(ibv_destroy_qp(a), 0);
    EXPECT_EQ(ibv_destroy_cq(cq), 0);
  }
}

// A host is a network namespace: a process that moved to a namespace of its
// own is another machine, even with /dev/shm and the runtime directory
// shared. Its QPs are not in our registry, so a connection to one of its
// QPNs reaches nothing (RETRY_EXC_ERR), and it receives nothing. On one
// shared registry the child's QPNs would follow ours and the SEND would land.

int other_host_child(int rfd, int wfd) {
  // Forked before the parent has threads (TSan cannot start threads in the
  // child of a multi-threaded process); the parent says when its QP exists.
  char go = 0;
  if (!read_all(rfd, &go, 1, kChildDeadline) || go != 'G') return 9;
  if (::unshare(CLONE_NEWNET) != 0) {
    // Not allowed here (no CAP_SYS_ADMIN, no user namespaces): tell the parent to skip.
    write_all(wfd, "S", 1);
    return 0;
  }
  Device dev;
  if (!dev.ok()) return 10;
  QpConfig cfg;
  ibv_cq* cq = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);
  if (!cq) return 11;
  ibv_qp* first = create_qp(dev.pd, cq, cq, cfg);
  ibv_qp* target = create_qp(dev.pd, cq, cq, cfg);
  if (!first || !target) return 12;
  Buffer buf(dev.pd, 4096);
  if (!buf.mr()) return 13;
  uint32_t peer_qpn = 0;
  if (!write_all(wfd, "H", 1) || !write_all(wfd, &target->qp_num, sizeof target->qp_num) ||
      !read_all(rfd, &peer_qpn, sizeof peer_qpn, kChildDeadline))
    return 14;
  if (bring_up(target, peer_qpn, dev.gid, cfg) != 0) return 15;
  ibv_sge rsge = buf.sge(0, 64);
  if (post_recv(target, 1, &rsge, 1) != 0) return 16;
  if (!write_all(wfd, "R", 1)) return 17;
  char done = 0;
  if (!read_all(rfd, &done, 1, kChildDeadline) || done != 'D') return 18;
  ibv_wc wc{};
  if (ibv_poll_cq(cq, 1, &wc) != 0) return 30;
  ibv_destroy_qp(target);
  ibv_destroy_qp(first);
  ibv_destroy_cq(cq);
  return 0;
}

TEST(TwoHosts, AProcessInAnotherNetworkNamespaceIsAnotherHost) {
  PrivateRuntimeDir dir("netns-test");
  ASSERT_TRUE(dir.ok());
  bool skipped = false;
  {
    Child child(other_host_child);
    ASSERT_TRUE(child.ok());
    Device dev;  // our QP takes the first QPN of our host
    ASSERT_TRUE(dev.ok());
    QpConfig cfg;
    cfg.timeout = 8;  // 1 ms
    cfg.retry_cnt = 2;
    ibv_cq* cq = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);
    ASSERT_NE(cq, nullptr);
    ibv_qp* a = create_qp(dev.pd, cq, cq, cfg);
    ASSERT_NE(a, nullptr);
    ASSERT_TRUE(write_all(child.wfd, "G", 1));
    {
      char hello = 0;
      ASSERT_TRUE(read_all(child.rfd, &hello, 1, kDeadline)) << "child exited with " << child.wait_exit(Millis{100});
      if (hello == 'S') {
        skipped = true;
      } else {
        ASSERT_EQ(hello, 'H');
        uint32_t target_qpn = 0;
        ASSERT_TRUE(read_all(child.rfd, &target_qpn, sizeof target_qpn, kDeadline));
        ASSERT_NE(target_qpn, a->qp_num);
        ASSERT_TRUE(write_all(child.wfd, &a->qp_num, sizeof a->qp_num));
        char ready = 0;
        ASSERT_TRUE(read_all(child.rfd, &ready, 1, kDeadline)) << "child exited with " << child.wait_exit(Millis{100});
        ASSERT_EQ(ready, 'R');
        ASSERT_EQ(bring_up(a, target_qpn, dev.gid, cfg), 0);
        Buffer buf(dev.pd, 64);
        ibv_sge sge = buf.sge(0, 8);
        ibv_send_wr wr = make_wr(1, IBV_WR_SEND, &sge, 1);
        ASSERT_EQ(post_send(a, wr), 0);
        ibv_wc wc{};
        ASSERT_TRUE(poll_one(cq, &wc));
        EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR) << wc_str(wc);
        ASSERT_TRUE(write_all(child.wfd, "D", 1));
        EXPECT_EQ(child.wait_exit(kDeadline), 0) << "30: the other host's QP received our SEND";
      }
    }
    EXPECT_EQ(ibv_destroy_qp(a), 0);
    EXPECT_EQ(ibv_destroy_cq(cq), 0);
  }
  if (skipped) GTEST_SKIP() << "unshare(CLONE_NEWNET) is not permitted here";
}

// ---------------------------------------------------------------------------
// XRC across processes: this process's TGT QP delivers into an SRQ of a child
// that opened the same XRC domain file (the SRQ's memory, ring and CQ are the
// child's), until the child destroys the SRQ while a thread here keeps
// sending to it. Once ibv_destroy_srq returned, nothing may land in the
// child's receive buffers (they stay registered), and the sender's next
// message finds no SRQ: REM_INV_REQ_ERR.

constexpr uint32_t kXrcRecvs = 64;
constexpr uint32_t kXrcMsg = 32 * 1024;  // long copies: a stale sender would be caught in one

int xrc_srq_child(int rfd, int wfd, const std::string& domain_file) {
  Device dev;
  if (!dev.ok()) return 10;
  const int fd = ::open(domain_file.c_str(), O_RDONLY);
  if (fd < 0) return 11;
  ibv_xrcd* xrcd = xrc::open_xrcd(dev.ctx, fd, O_CREAT);
  ibv_cq* cq = ibv_create_cq(dev.ctx, 2 * kXrcRecvs, nullptr, nullptr, 0);
  if (xrcd == nullptr || cq == nullptr) return 12;
  ibv_srq* srq = xrc::create_xrc_srq(dev.ctx, dev.pd, xrcd, cq, kXrcRecvs);
  if (srq == nullptr) return 13;
  Buffer buf(dev.pd, kXrcRecvs * kXrcMsg, Buffer::kAllAccess, 0);
  for (uint32_t i = 0; i < kXrcRecvs; ++i) {
    ibv_sge sge = buf.sge(i * kXrcMsg, kXrcMsg);
    ibv_recv_wr wr{};
    wr.wr_id = i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    if (ibv_post_srq_recv(srq, &wr, &bad) != 0) return 14;
  }
  uint32_t srqn = 0;
  if (ibv_get_srq_num(srq, &srqn) != 0 || !write_all(wfd, &srqn, sizeof srqn)) return 15;
  // Phase 1: eight messages arrive, in order, whole.
  const auto wcs = poll_n(cq, 8, kChildDeadline);
  if (wcs.size() != 8) return 20;
  for (uint32_t i = 0; i < 8; ++i) {
    if (wcs[i].status != IBV_WC_SUCCESS || wcs[i].wr_id != i || wcs[i].byte_len != kXrcMsg) return 21;
    if (first_not(buf.span(i * kXrcMsg, kXrcMsg), kWritten) != -1) return 22;
  }
  if (!write_all(wfd, "1", 1)) return 23;
  // Phase 2: the parent's sender runs; the SRQ goes under it.
  char go = 0;
  if (!read_all(rfd, &go, 1, kChildDeadline) || go != 'G') return 30;
  if (ibv_destroy_srq(srq) != 0) return 31;
  std::memset(buf.data(), kReused, buf.size());
  if (!write_all(wfd, "D", 1)) return 32;
  char quit = 0;
  if (!read_all(rfd, &quit, 1, kChildDeadline) || quit != 'Q') return 40;
  if (first_not(buf.span(0, buf.size()), kReused) != -1) return 41;  // a message landed after destroy
  ibv_destroy_cq(cq);
  ibv_close_xrcd(xrcd);
  ::close(fd);
  return 0;
}

// A file that names an XRC domain for a test's two processes (the parent
// and its child open it): made at the start, removed at the end.
struct DomainFile {
  DomainFile() : fd(::mkstemp(path)) {}
  ~DomainFile() {
    if (fd < 0) return;
    ::close(fd);
    ::unlink(path);
  }
  DomainFile(const DomainFile&) = delete;
  DomainFile& operator=(const DomainFile&) = delete;
  char path[32] = "/tmp/softhca-xrc-domain-XXXXXX";
  int fd;
};

TEST(XrcAcrossProcesses, TgtQpDeliversIntoAnotherProcessesSrqUntilItIsDestroyed) {
  DomainFile file;
  ASSERT_GE(file.fd, 0);
  const std::string domain_file = file.path;
  Child child([&](int r, int w) { return xrc_srq_child(r, w, domain_file); });
  ASSERT_TRUE(child.ok());
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_xrcd* xrcd = xrc::open_xrcd(dev.ctx, file.fd, O_CREAT);
  ASSERT_NE(xrcd, nullptr);
  ibv_cq* cq = ibv_create_cq(dev.ctx, 64, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp* tgt = xrc::create_tgt(dev.ctx, xrcd);
  ibv_qp* ini = xrc::create_ini(dev.ctx, dev.pd, cq);
  ASSERT_TRUE(tgt != nullptr && ini != nullptr);
  ASSERT_EQ(xrc::to_init(tgt, 0), 0);
  ASSERT_EQ(xrc::to_init(ini, 0), 0);
  ASSERT_EQ(xrc::to_rtr(tgt, ini->qp_num, dev.gid, true), 0);
  ASSERT_EQ(xrc::to_rtr(ini, tgt->qp_num, dev.gid, false), 0);
  ASSERT_EQ(xrc::ini_to_rts(ini), 0);
  uint32_t srqn = 0;
  ASSERT_TRUE(read_all(child.rfd, &srqn, sizeof srqn, kDeadline)) << "child exited with " << child.wait_exit(Millis{100});
  {
    Buffer src(dev.pd, kXrcMsg, Buffer::kAllAccess, kWritten);
    ibv_sge sge = src.sge(0, kXrcMsg);
    ibv_send_wr wr = make_wr(0, IBV_WR_SEND, &sge, 1);
    wr.qp_type.xrc.remote_srqn = srqn;
    for (int i = 0; i < 8; ++i) {
      ASSERT_EQ(post_send(ini, wr), 0);
      ibv_wc wc{};
      ASSERT_TRUE(poll_one(cq, &wc));
      ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
    }
    char phase = 0;
    ASSERT_TRUE(read_all(child.rfd, &phase, 1, kDeadline)) << "child exited with " << child.wait_exit(Millis{100});
    ASSERT_EQ(phase, '1');
    PostingThread sender(ini, cq, wr);
    ASSERT_TRUE(sender.got_going()) << "the sender did not get going";
    ASSERT_TRUE(write_all(child.wfd, "G", 1));
    char destroyed = 0;
    ASSERT_TRUE(read_all(child.rfd, &destroyed, 1, kDeadline)) << "child exited with " << child.wait_exit(Millis{100});
    ASSERT_EQ(destroyed, 'D');
    sender.join();
    EXPECT_EQ(sender.last_status.load(), IBV_WC_REM_INV_REQ_ERR) << "the sender's first SEND after the SRQ went";
  }
  ASSERT_TRUE(write_all(child.wfd, "Q", 1));
  EXPECT_EQ(child.wait_exit(kDeadline), 0) << "41: a message landed after ibv_destroy_srq returned";
  drain_async_events(dev.ctx);
  EXPECT_EQ(ibv_destroy_qp(ini), 0);
  EXPECT_EQ(ibv_destroy_qp(tgt), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_close_xrcd(xrcd), 0);
}

// ---------------------------------------------------------------------------
// ibv_open_qp across processes: a TGT QP is the host's, and lives while any
// process holds a handle to it, whatever becomes of the process that made it.

enum class CreatorEnd { kDestroysItsHandle, kExitsHoldingIt, kKilled };

struct CreatorParam {
  CreatorEnd end;
  const char* name;
};

// Makes a TGT QP in the domain of `domain_file`, says its number, takes the
// parent's INI QP number and moves the TGT QP to RTR towards it (so over
// the udp link this process serves the QP's peer), says 'R', and on 'E'
// ends as `end` says.
int tgt_creator_child(int rfd, int wfd, const std::string& domain_file, CreatorEnd end) {
  Device dev;
  if (!dev.ok()) return 10;
  const int fd = ::open(domain_file.c_str(), O_RDWR);
  if (fd < 0) return 11;
  ibv_xrcd* xrcd = xrc::open_xrcd(dev.ctx, fd, O_CREAT);
  if (!xrcd) return 12;
  ibv_qp* tgt = xrc::create_tgt(dev.ctx, xrcd);
  if (!tgt) return 13;
  uint32_t ini_qpn = 0;
  if (!write_all(wfd, &tgt->qp_num, sizeof tgt->qp_num) || !read_all(rfd, &ini_qpn, sizeof ini_qpn, kChildDeadline))
    return 14;
  if (xrc::to_init(tgt, 0) != 0 || xrc::to_rtr(tgt, ini_qpn, dev.gid, true) != 0) return 15;
  if (!write_all(wfd, "R", 1)) return 16;
  char go = 0;
  if (!read_all(rfd, &go, 1, kChildDeadline) || go != 'E') return 20;
  switch (end) {
    case CreatorEnd::kDestroysItsHandle:
      if (ibv_destroy_qp(tgt) != 0) return 21;
      if (ibv_close_xrcd(xrcd) != 0) return 22;
      ::close(fd);
      return 0;
    case CreatorEnd::kExitsHoldingIt:
      ::_exit(0);  // no destructor, no library teardown: as a process that exits without cleaning up
    case CreatorEnd::kKilled:
      if (!write_all(wfd, "K", 1)) return 23;
      read_all(rfd, &go, 1, kChildDeadline);  // bounded wait for SIGKILL
      return 24;
  }
  return 25;
}

class OpenedTgtQp : public ::testing::TestWithParam<CreatorParam> {};

TEST_P(OpenedTgtQp, OutlivesTheHandleAndProcessThatMadeIt) {
  DomainFile file;
  ASSERT_GE(file.fd, 0);
  const std::string domain_file = file.path;
  const CreatorEnd end = GetParam().end;
  Child child([&](int r, int w) { return tgt_creator_child(r, w, domain_file, end); });
  ASSERT_TRUE(child.ok());
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_xrcd* xrcd = xrc::open_xrcd(dev.ctx, file.fd, O_CREAT);
  ASSERT_NE(xrcd, nullptr);
  ibv_cq* cq = ibv_create_cq(dev.ctx, 64, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_srq* srq = xrc::create_xrc_srq(dev.ctx, dev.pd, xrcd, cq);
  ibv_qp* ini = xrc::create_ini(dev.ctx, dev.pd, cq);
  ASSERT_TRUE(srq != nullptr && ini != nullptr);
  uint32_t srqn = 0;
  ASSERT_EQ(ibv_get_srq_num(srq, &srqn), 0);
  uint32_t qpn = 0;
  ASSERT_TRUE(read_all(child.rfd, &qpn, sizeof qpn, kDeadline)) << "child exited with " << child.wait_exit(Millis{100});
  ibv_qp* opened = xrc::open_tgt(dev.ctx, xrcd, qpn);
  ASSERT_NE(opened, nullptr) << "errno " << errno;
  ASSERT_TRUE(write_all(child.wfd, &ini->qp_num, sizeof ini->qp_num));
  char ready = 0;
  ASSERT_TRUE(read_all(child.rfd, &ready, 1, kDeadline)) << "child exited with " << child.wait_exit(Millis{100});
  ASSERT_EQ(ready, 'R');
  // The state the creator set is the opened handle's too.
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  ASSERT_EQ(ibv_query_qp(opened, &attr, IBV_QP_STATE | IBV_QP_DEST_QPN, &init), 0);
  EXPECT_EQ(attr.qp_state, IBV_QPS_RTR);
  EXPECT_EQ(attr.dest_qp_num, ini->qp_num);
  ASSERT_EQ(xrc::to_init(ini, 0), 0);
  ASSERT_EQ(xrc::to_rtr(ini, qpn, dev.gid, false), 0);
  ASSERT_EQ(xrc::ini_to_rts(ini), 0);

  Buffer from(dev.pd, 64, Buffer::kAllAccess, kWritten), to(dev.pd, 64 * 8);
  auto send_through = [&](uint32_t n) {
    ASSERT_EQ(xrc::post_srq_recv(srq, n, to.sge(n * 64, 64)), 0);
    ibv_sge sge = from.sge(0, 64);
    ibv_send_wr wr = make_wr(n, IBV_WR_SEND, &sge, 1);
    wr.qp_type.xrc.remote_srqn = srqn;
    ASSERT_EQ(post_send(ini, wr), 0);
    const auto wcs = poll_n(cq, 2);
    ASSERT_EQ(wcs.size(), 2u) << "message " << n;
    for (const ibv_wc& wc : wcs) {
      EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << "message " << n << ": " << wc_str(wc);
      EXPECT_EQ(wc.wr_id, n);
    }
    EXPECT_EQ(first_not(to.span(n * 64, 64), kWritten), -1) << "message " << n;
  };
  send_through(0);
  send_through(1);
  decltype(ibv_async_event::element) element{};
  ASSERT_TRUE(wait_async_event(dev.ctx, IBV_EVENT_COMM_EST, &element));
  EXPECT_EQ(element.qp, opened);

  // The creator's process lets go: its handle, or all of it.
  ASSERT_TRUE(write_all(child.wfd, "E", 1));
  if (end == CreatorEnd::kKilled) {
    char k = 0;
    ASSERT_TRUE(read_all(child.rfd, &k, 1, kDeadline));
    ::kill(child.pid(), SIGKILL);
    EXPECT_EQ(child.wait_exit(kDeadline), -1);
  } else {
    EXPECT_EQ(child.wait_exit(kDeadline), 0);
  }
  // The QP goes on: over the udp link this process's handle takes over the
  // peer where the creator's stopped.
  for (uint32_t n = 2; n < 8; ++n) send_through(n);
  ASSERT_EQ(ibv_query_qp(opened, &attr, IBV_QP_STATE, &init), 0);
  EXPECT_EQ(attr.qp_state, IBV_QPS_RTR);

  // The last live handle destroys it: its number opens nothing now.
  drain_async_events(dev.ctx);
  ASSERT_EQ(ibv_destroy_qp(opened), 0);
  errno = 0;
  EXPECT_EQ(xrc::open_tgt(dev.ctx, xrcd, qpn), nullptr);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(ibv_destroy_qp(ini), 0);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_close_xrcd(xrcd), 0);
}

INSTANTIATE_TEST_SUITE_P(Creator, OpenedTgtQp,
                         ::testing::Values(CreatorParam{CreatorEnd::kDestroysItsHandle, "DestroysItsHandle"},
                                           CreatorParam{CreatorEnd::kExitsHoldingIt, "ExitsHoldingIt"},
                                           CreatorParam{CreatorEnd::kKilled, "Killed"}),
                         [](const auto& info) { return std::string(info.param.name); });

// ---------------------------------------------------------------------------
// A peer that dies while connected.

struct KillParam {
  int child_receives;  // receive WQEs the child leaves posted
  ibv_wr_opcode opcode;
  const char* name;
  // Before the operation, a new process opens the device: the registry
  // reclaims the dead peer's slot, and the newcomer may take it over.
  bool newcomer = false;
};

// A process that, told to, opens the device, says so, and waits for the
// parent. Forked while the parent has no threads yet (TSan forbids thread
// creation in a child forked from a threaded parent), so it waits for its cue.
int newcomer_child(int rfd, int wfd) {
  char go;
  if (!read_all(rfd, &go, 1, Millis{30000})) return 17;
  Device dev;
  if (!dev.ok()) return 10;
  if (!write_all(wfd, "R", 1)) return 16;
  char c;
  read_all(rfd, &c, 1, Millis{30000});
  return 0;
}

int victim_child(int rfd, int wfd, int receives) {
  Device dev;
  if (!dev.ok()) return 10;
  QpConfig cfg;
  ibv_cq* cq = ibv_create_cq(dev.ctx, 64, nullptr, nullptr, 0);
  ibv_qp* qp = cq ? create_qp(dev.pd, cq, cq, cfg) : nullptr;
  if (!qp) return 11;
  Buffer buf(dev.pd, 4096);
  ibv_sge sge = buf.sge(0, 4096);
  if (qp_to_init(qp, cfg) != 0) return 13;
  for (int i = 0; i < receives; ++i)
    if (post_recv(qp, i, &sge, 1) != 0) return 12;
  const Endpoint mine{qp->qp_num, buf.rkey(), buf.addr()};
  Endpoint peer{};
  if (!write_all(wfd, &mine, sizeof mine) || !read_all(rfd, &peer, sizeof peer, kChildDeadline)) return 14;
  if (qp_to_rtr(qp, peer.qpn, dev.gid, cfg) != 0 || qp_to_rts(qp, cfg) != 0) return 15;
  if (!write_all(wfd, "R", 1)) return 16;
  // Wait to be killed (bounded, in case the parent is gone).
  char c;
  read_all(rfd, &c, 1, Millis{30000});
  return 50;
}

class PeerKilled : public ::testing::TestWithParam<KillParam> {};

TEST_P(PeerKilled, NextOperationIsRetryExceeded) {
  const KillParam param = GetParam();
  Child child([&](int rfd, int wfd) { return victim_child(rfd, wfd, param.child_receives); });
  ASSERT_TRUE(child.ok());
  std::optional<Child> newcomer;
  if (param.newcomer) {
    newcomer.emplace(newcomer_child);
    ASSERT_TRUE(newcomer->ok());
  }
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  cfg.timeout = 8;  // 1 ms
  cfg.retry_cnt = 2;
  cfg.rnr_retry = 7;  // RNR forever: only a missing responder can end it
  ibv_cq* cq = ibv_create_cq(dev.ctx, 64, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp* qp = create_qp(dev.pd, cq, cq, cfg);
  ASSERT_NE(qp, nullptr);
  {
    Buffer buf(dev.pd, 4096);
    ASSERT_EQ(qp_to_init(qp, cfg), 0);
    const Endpoint mine{qp->qp_num, buf.rkey(), buf.addr()};
    Endpoint peer{};
    ASSERT_TRUE(write_all(child.wfd, &mine, sizeof mine));
    ASSERT_TRUE(read_all(child.rfd, &peer, sizeof peer, kDeadline)) << "child exited with " << child.wait_exit(Millis{100});
    ASSERT_EQ(qp_to_rtr(qp, peer.qpn, dev.gid, cfg), 0);
    ASSERT_EQ(qp_to_rts(qp, cfg), 0);
    char ready = 0;
    ASSERT_TRUE(read_all(child.rfd, &ready, 1, kDeadline));

    ibv_sge sge = buf.sge(0, 64);
    auto make = [&](uint64_t wr_id) {
      ibv_send_wr wr = make_wr(wr_id, param.opcode, &sge, 1);
      wr.wr.rdma.remote_addr = peer.addr;
      wr.wr.rdma.rkey = peer.rkey;
      return wr;
    };
    ibv_wc wc{};
    // While the child lives, an operation goes through.
    if (param.opcode != IBV_WR_SEND || param.child_receives > 1) {
      ibv_send_wr wr = make(1);
      ASSERT_EQ(post_send(qp, wr), 0);
      ASSERT_TRUE(poll_one(cq, &wc));
      ASSERT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
    }
    child.kill_now();
    if (newcomer) {
      ASSERT_TRUE(write_all(newcomer->wfd, "G", 1));
      ASSERT_TRUE(read_all(newcomer->rfd, &ready, 1, kDeadline)) << "newcomer exited with "
                                                                  << newcomer->wait_exit(Millis{100});
    }

    ibv_send_wr wr = make(2);
    const auto start = Clock::now();
    ASSERT_EQ(post_send(qp, wr), 0);
    ASSERT_TRUE(poll_one(cq, &wc)) << "the operation to a dead peer never completed";
    EXPECT_LT(Clock::now() - start, Millis{3000});
    EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR) << wc_str(wc);
    EXPECT_EQ(wc.wr_id, 2u);
    EXPECT_EQ(qp_state(qp), IBV_QPS_ERR);
  }
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

INSTANTIATE_TEST_SUITE_P(Cases, PeerKilled,
                         ::testing::Values(KillParam{4, IBV_WR_SEND, "SendReceivesPosted"},
                                           KillParam{0, IBV_WR_SEND, "SendNoReceive"},
                                           KillParam{0, IBV_WR_RDMA_WRITE, "Write"},
                                           KillParam{0, IBV_WR_RDMA_READ, "Read"},
                                           KillParam{0, IBV_WR_RDMA_WRITE, "WriteAfterANewProcessCame", true}),
                         [](const ::testing::TestParamInfo<KillParam>& info) { return info.param.name; });

}  // namespace
}  // namespace loopback
