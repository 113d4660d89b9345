// Importing a context from another process: the parent (the owner) opens
// the context, makes a PD and MRs in it and hands its cmd_fd to a forked
// child (the importer) over a Unix socket (SCM_RIGHTS), as a program that
// shares a context between processes does. The child imports the context,
// the PD and the MRs, connects a QP of its own in that PD to the parent's,
// and uses the parent's memory through the imported keys: as local SGEs of
// its WRITE, READ and atomic, and as the target of the parent's WRITE to
// the child's QP. Then the rules that bind the two processes: a PD that
// either process still uses cannot be deallocated by the other, an MR
// deregistered through an imported handle is gone for its owner too, and
// once the owner deregisters an MR no operation of the importer reaches it.
//
// The child never uses gtest: it reports through its exit status (0 = good,
// otherwise the number of the step that failed) and the pipes.
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "child_process.hpp"
#include "loopback.hpp"

namespace loopback {
namespace {

constexpr Millis kChildDeadline{15000};

// What the owner tells the importer, with the cmd_fd.
struct Handles {
  uint32_t pd;           // the PD both processes' QPs use
  uint32_t spare_pd;     // a PD the owner makes nothing in
  uint32_t shared_mr;    // the owner's memory that the importer uses
  uint32_t shared_lkey;
  uint64_t shared_addr;  // in the owner's address space
  uint64_t shared_length;
  uint32_t doomed_mr;    // an MR of the owner that the importer deregisters
  uint32_t target_rkey;  // the owner's other MR, a target of the importer's operations
  uint64_t target_addr;
  uint32_t qpn;
};

// The regions of the shared MR (not page aligned: a heap buffer, so its
// ends are partial pages that stay out of the owner's shared file and its
// middle is whole pages in it: both ways of reaching the owner's memory).
constexpr size_t kSharedLen = 5 * 4096 + 300;
constexpr size_t kWriteLen = 3 * 4096 + 77;  // the importer WRITEs shared[0, kWriteLen) to target[0, ...)
constexpr size_t kReadOff = 4096 - 100;      // ... READs target[kReadSrc, +kReadLen) into shared[kReadOff, ...)
constexpr size_t kReadLen = 5000;
constexpr size_t kReadSrc = 16384;
constexpr size_t kAtomicOff = 4096 * 5 + 8;  // ... FETCH_ADDs target's word at kAtomicSrc into shared[kAtomicOff]
constexpr size_t kAtomicSrc = 32768;
constexpr uint64_t kAdd = 0x1234;
constexpr size_t kBackOff = 2 * 4096 - 50;   // the owner WRITEs into shared[kBackOff, +kBackLen) through the importer's QP
constexpr size_t kBackLen = 3000;
constexpr size_t kTargetLen = 65536;

bool send_fd(int sock, int fd, const void* data, size_t size) {
  iovec iov{const_cast<void*>(data), size};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  return ::sendmsg(sock, &msg, 0) == static_cast<ssize_t>(size);
}

int receive_fd(int sock, void* data, size_t size) {
  if (!fd_readable(sock, kChildDeadline)) return -1;
  iovec iov{data, size};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  if (::recvmsg(sock, &msg, 0) != static_cast<ssize_t>(size)) return -1;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (c == nullptr || c->cmsg_type != SCM_RIGHTS) return -1;
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
  return fd;
}

bool signal_step(int fd, char step) { return write_all(fd, &step, 1); }
bool await_step(int fd, char step) {
  char got = 0;
  return read_all(fd, &got, 1, kChildDeadline) && got == step;
}

// One signaled WR, and its completion's status (or -1 if none came).
int run_wr(ibv_qp* qp, ibv_cq* cq, ibv_send_wr& wr) {
  if (post_send(qp, wr) != 0) return -1;
  ibv_wc wc{};
  if (!poll_one(cq, &wc, kChildDeadline)) return -1;
  return wc.status;
}

// The importer.
int importer(int sock, int rfd, int wfd) {
  Handles h{};
  const int fd = receive_fd(sock, &h, sizeof h);
  if (fd < 0) return 1;
  ibv_context* ctx = ibv_import_device(fd);
  if (ctx == nullptr) return 2;
  if (ctx->cmd_fd != fd) return 3;
  ibv_pd* pd = ibv_import_pd(ctx, h.pd);
  if (pd == nullptr || pd->handle != h.pd) return 4;
  ibv_mr* shared = ibv_import_mr(pd, h.shared_mr);
  if (shared == nullptr || shared->lkey != h.shared_lkey || shared->rkey != h.shared_lkey ||
      shared->length != h.shared_length)
    return 5;
  // Handles nobody made, and an MR through a PD it is not in.
  ibv_pd* spare = ibv_import_pd(ctx, h.spare_pd);
  if (spare == nullptr) return 6;
  errno = 0;
  if (ibv_import_mr(spare, h.shared_mr) != nullptr || errno != EINVAL) return 7;
  errno = 0;
  if (ibv_import_pd(ctx, 0xFFFFFFF0u) != nullptr || errno != EINVAL) return 8;

  // A QP of this process in the owner's PD, connected to the owner's QP.
  QpConfig cfg;
  ibv_cq* cq = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
  if (cq == nullptr) return 10;
  ibv_qp* qp = create_qp(pd, cq, cq, cfg);
  if (qp == nullptr) return 11;
  ibv_gid gid{};
  if (ibv_query_gid(ctx, 1, 0, &gid) != 0 || bring_up(qp, h.qpn, gid, cfg) != 0) return 12;
  if (!write_all(wfd, &qp->qp_num, sizeof qp->qp_num) || !await_step(rfd, 'G')) return 13;

  // The owner's memory as local SGEs: gathered (WRITE), scattered (READ),
  // and an atomic's original value.
  ibv_sge sge{h.shared_addr, static_cast<uint32_t>(kWriteLen), shared->lkey};
  ibv_send_wr wr = make_wr(1, IBV_WR_RDMA_WRITE, &sge, 1);
  wr.wr.rdma.remote_addr = h.target_addr;
  wr.wr.rdma.rkey = h.target_rkey;
  if (run_wr(qp, cq, wr) != IBV_WC_SUCCESS) return 20;
  sge = ibv_sge{h.shared_addr + kReadOff, static_cast<uint32_t>(kReadLen), shared->lkey};
  wr = make_wr(2, IBV_WR_RDMA_READ, &sge, 1);
  wr.wr.rdma.remote_addr = h.target_addr + kReadSrc;
  wr.wr.rdma.rkey = h.target_rkey;
  if (run_wr(qp, cq, wr) != IBV_WC_SUCCESS) return 21;
  sge = ibv_sge{h.shared_addr + kAtomicOff, 8, shared->lkey};
  wr = make_wr(3, IBV_WR_ATOMIC_FETCH_AND_ADD, &sge, 1);
  wr.wr.atomic.remote_addr = h.target_addr + kAtomicSrc;
  wr.wr.atomic.rkey = h.target_rkey;
  wr.wr.atomic.compare_add = kAdd;
  if (run_wr(qp, cq, wr) != IBV_WC_SUCCESS) return 22;
  // The owner checks those, and WRITEs into its shared MR through our QP.
  if (!signal_step(wfd, '1') || !await_step(rfd, '2')) return 23;

  // An MR of ours in the owner's spare PD: the owner cannot deallocate the
  // PD while it is there.
  std::vector<uint8_t> mine(4096, 0);
  ibv_mr* own = ibv_reg_mr(spare, mine.data(), mine.size(), IBV_ACCESS_LOCAL_WRITE);
  if (own == nullptr) return 30;
  if (!signal_step(wfd, '3') || !await_step(rfd, '4')) return 31;
  if (ibv_dereg_mr(own) != 0) return 32;
  ibv_unimport_pd(spare);
  if (!signal_step(wfd, '5')) return 33;

  // Deregistering through an imported handle deregisters the owner's MR.
  ibv_mr* doomed = ibv_import_mr(pd, h.doomed_mr);
  if (doomed == nullptr) return 40;
  if (ibv_dereg_mr(doomed) != 0) return 41;
  // And the PD: ours cannot go while our QP uses it.
  if (ibv_dealloc_pd(pd) != EBUSY) return 42;
  if (!signal_step(wfd, '6') || !await_step(rfd, '7')) return 43;

  // The owner deregistered the shared MR: its key no longer reaches the
  // owner's memory from here.
  sge = ibv_sge{h.shared_addr, 64, shared->lkey};
  wr = make_wr(4, IBV_WR_RDMA_WRITE, &sge, 1);
  wr.wr.rdma.remote_addr = h.target_addr;
  wr.wr.rdma.rkey = h.target_rkey;
  if (run_wr(qp, cq, wr) != IBV_WC_LOC_PROT_ERR) return 50;
  ibv_unimport_mr(shared);

  if (ibv_destroy_qp(qp) != 0 || ibv_destroy_cq(cq) != 0) return 60;
  ibv_unimport_pd(pd);
  if (ibv_close_device(ctx) != 0) return 61;
  return signal_step(wfd, '8') ? 0 : 62;
}

TEST(ImportAcrossProcesses, TheImporterUsesTheOwnersPdAndMemory) {
  int socks[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_DGRAM, 0, socks), 0);
  Child child([&](int rfd, int wfd) {
    ::close(socks[0]);
    return importer(socks[1], rfd, wfd);
  });
  ::close(socks[1]);
  ASSERT_TRUE(child.ok());
  Device dev;  // opened after the fork
  ASSERT_TRUE(dev.ok());
  ibv_pd* spare = ibv_alloc_pd(dev.ctx);
  ASSERT_NE(spare, nullptr);
  QpConfig cfg;
  ibv_cq* cq = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp* qp = create_qp(dev.pd, cq, cq, cfg);
  ASSERT_NE(qp, nullptr);
  // The shared and doomed MRs are deregistered by hand below (a Buffer
  // would deregister them again).
  std::vector<uint8_t> shared_bytes(kSharedLen), doomed_bytes(4096);
  ibv_mr* shared_mr = ibv_reg_mr(dev.pd, shared_bytes.data(), kSharedLen, Buffer::kAllAccess);
  ibv_mr* doomed = ibv_reg_mr(dev.pd, doomed_bytes.data(), doomed_bytes.size(), Buffer::kAllAccess);
  Buffer target(dev.pd, kTargetLen);
  Buffer source(dev.pd, kBackLen);
  ASSERT_TRUE(shared_mr && doomed && target.mr() && source.mr());
  struct {
    std::vector<uint8_t>& bytes;
    ibv_mr* mr_;
    std::span<uint8_t> span(size_t offset, size_t length) { return {bytes.data() + offset, length}; }
    uint8_t* data() { return bytes.data(); }
    uint64_t addr(size_t offset = 0) { return reinterpret_cast<uint64_t>(bytes.data() + offset); }
    uint32_t lkey() const { return mr_->lkey; }
    uint32_t rkey() const { return mr_->rkey; }
    size_t size() const { return bytes.size(); }
    ibv_mr* mr() const { return mr_; }
  } shared{shared_bytes, shared_mr};
  fill_pattern(shared.span(0, kSharedLen), 1);
  fill_pattern(target.span(0, kTargetLen), 2);
  uint64_t word_before = 0;
  std::memcpy(&word_before, target.data() + kAtomicSrc, 8);

  const Handles h{dev.pd->handle, spare->handle, shared.mr()->handle, shared.lkey(), shared.addr(),
                  shared.size(),  doomed->handle,  target.rkey(),       target.addr(),  qp->qp_num};
  ASSERT_TRUE(send_fd(socks[0], dev.ctx->cmd_fd, &h, sizeof h));
  uint32_t peer_qpn = 0;
  ASSERT_TRUE(read_all(child.rfd, &peer_qpn, sizeof peer_qpn, kChildDeadline))
      << "child exited with " << child.wait_exit(Millis{100});
  ASSERT_EQ(bring_up(qp, peer_qpn, dev.gid, cfg), 0);
  ASSERT_TRUE(signal_step(child.wfd, 'G'));

  // The importer's WRITE took our shared bytes, its READ and its atomic
  // put theirs into our shared MR.
  ASSERT_TRUE(await_step(child.rfd, '1')) << "child exited with " << child.wait_exit(Millis{100});
  std::vector<uint8_t> expect(kSharedLen);
  fill_pattern(expect, 1);
  EXPECT_EQ(first_mismatch(target.span(0, kWriteLen), std::span(expect).first(kWriteLen)), -1);
  std::vector<uint8_t> target_bytes(kTargetLen);
  fill_pattern(target_bytes, 2);
  EXPECT_EQ(first_mismatch(shared.span(kReadOff, kReadLen), std::span(target_bytes).subspan(kReadSrc, kReadLen)), -1);
  uint64_t original = 0, word_after = 0;
  std::memcpy(&original, shared.data() + kAtomicOff, 8);
  std::memcpy(&word_after, target.data() + kAtomicSrc, 8);
  EXPECT_EQ(original, word_before);
  EXPECT_EQ(word_after, word_before + kAdd);
  // Bytes of the shared MR that nothing wrote are as they were.
  EXPECT_EQ(first_mismatch(shared.span(kReadOff + kReadLen, 100), std::span(expect).subspan(kReadOff + kReadLen, 100)),
            -1);

  // Our WRITE into our own shared MR, through the importer's QP: its
  // responder reaches this process's memory under our key.
  fill_pattern(source.span(0, kBackLen), 3);
  ibv_sge sge = source.sge(0, kBackLen);
  ibv_send_wr wr = make_wr(1, IBV_WR_RDMA_WRITE, &sge, 1);
  wr.wr.rdma.remote_addr = shared.addr(kBackOff);
  wr.wr.rdma.rkey = shared.rkey();
  ASSERT_EQ(post_send(qp, wr), 0);
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(cq, &wc, kChildDeadline));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  EXPECT_EQ(first_mismatch(shared.span(kBackOff, kBackLen), source.span(0, kBackLen)), -1);
  ASSERT_TRUE(signal_step(child.wfd, '2'));

  // The importer's MR in our spare PD keeps it from going; once it is gone the PD goes.
  ASSERT_TRUE(await_step(child.rfd, '3')) << "child exited with " << child.wait_exit(Millis{100});
  EXPECT_EQ(ibv_dealloc_pd(spare), EBUSY);
  ASSERT_TRUE(signal_step(child.wfd, '4'));
  ASSERT_TRUE(await_step(child.rfd, '5')) << "child exited with " << child.wait_exit(Millis{100});
  EXPECT_EQ(ibv_dealloc_pd(spare), 0);

  // The importer deregistered our doomed MR and tried its own PD.
  ASSERT_TRUE(await_step(child.rfd, '6')) << "child exited with " << child.wait_exit(Millis{100});
  // Our PD too is in use (by the importer's QP and our own objects).
  EXPECT_EQ(ibv_dealloc_pd(dev.pd), EBUSY);
  // We deregister the shared MR; the importer's next use of it fails.
  ASSERT_EQ(ibv_dereg_mr(shared.mr()), 0);
  ASSERT_TRUE(signal_step(child.wfd, '7'));
  ASSERT_TRUE(await_step(child.rfd, '8')) << "child exited with " << child.wait_exit(Millis{100});
  EXPECT_EQ(child.wait_exit(kChildDeadline), 0);

  // Our key of the doomed MR is no key any more: as a local SGE it is a
  // protection error. Our handle still deregisters.
  sge = ibv_sge{reinterpret_cast<uint64_t>(doomed_bytes.data()), 64, doomed->lkey};
  wr = make_wr(2, IBV_WR_RDMA_WRITE, &sge, 1);
  wr.wr.rdma.remote_addr = target.addr();
  wr.wr.rdma.rkey = target.rkey();
  ASSERT_EQ(post_send(qp, wr), 0);
  ASSERT_TRUE(poll_one(cq, &wc, kChildDeadline));
  EXPECT_EQ(wc.status, IBV_WC_LOC_PROT_ERR) << wc_str(wc);
  EXPECT_EQ(ibv_dereg_mr(doomed), 0);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  ::close(socks[0]);
}

}  // namespace
}  // namespace loopback
