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
#include <signal.h>
#include <sys/socket.h>
#include <grp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

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
constexpr size_t kTheirsLen = 8192;          // the importer's MR, which the owner imports and sends from
constexpr size_t kTheirsAt = 40000;          // ... into target[kTheirsAt, ...)
constexpr size_t kHeaderLen = 100;           // the owner SENDs a header into the importer's memory
constexpr size_t kRecvOff = 12400;           // ... and the rest into shared[kRecvOff, +kRecvLen)
constexpr size_t kRecvLen = 3000;

// What the importer tells the owner of an MR it made in the shared PD.
struct Lent {
  uint32_t handle;
  uint64_t addr;  // in the importer's address space
};

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

// A forked child that also gets one end of a Unix socket, over which the
// owner passes it the context's cmd_fd: body(socket, rfd, wfd).
class ImporterChild {
 public:
  template <typename Fn>
  explicit ImporterChild(Fn body)
      : child([this, body](int rfd, int wfd) {
          ::close(socks_.fds[0]);
          return body(socks_.fds[1], rfd, wfd);
        }) {
    ::close(socks_.fds[1]);
    socks_.fds[1] = -1;
  }
  bool ok() const { return socks_.fds[0] >= 0 && child.ok(); }
  int sock() const { return socks_.fds[0]; }

 private:
  struct SocketPair {
    int fds[2] = {-1, -1};
    SocketPair() { ::socketpair(AF_UNIX, SOCK_DGRAM, 0, fds); }
    ~SocketPair() {
      for (int fd : fds)
        if (fd >= 0) ::close(fd);
    }
  } socks_;  // before `child`: made before the fork

 public:
  Child child;
};

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

// The importer's side of a test: the owner's context, PD and shared MR
// imported, and a QP of this process in that PD connected to the owner's.
struct Imported {
  Handles h{};
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_mr* shared = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
};

// 0, or the number of the step that failed.
int import_and_connect(int sock, int rfd, int wfd, Imported& out) {
  Handles& h = out.h;
  const int fd = receive_fd(sock, &h, sizeof h);
  if (fd < 0) return 1;
  out.ctx = ibv_import_device(fd);
  if (out.ctx == nullptr) return 2;
  if (out.ctx->cmd_fd != fd) return 3;
  out.pd = ibv_import_pd(out.ctx, h.pd);
  if (out.pd == nullptr || out.pd->handle != h.pd) return 4;
  out.shared = ibv_import_mr(out.pd, h.shared_mr);
  if (out.shared == nullptr || out.shared->lkey != h.shared_lkey || out.shared->rkey != h.shared_lkey ||
      out.shared->length != h.shared_length)
    return 5;
  QpConfig cfg;
  out.cq = ibv_create_cq(out.ctx, 16, nullptr, nullptr, 0);
  if (out.cq == nullptr) return 6;
  out.qp = create_qp(out.pd, out.cq, out.cq, cfg);
  if (out.qp == nullptr) return 7;
  ibv_gid gid{};
  if (ibv_query_gid(out.ctx, 1, 0, &gid) != 0 || bring_up(out.qp, h.qpn, gid, cfg) != 0) return 8;
  if (!write_all(wfd, &out.qp->qp_num, sizeof out.qp->qp_num) || !await_step(rfd, 'G')) return 9;
  return 0;
}

// The owner's side: hands its context to the importer, connects its QP to
// the importer's and gives the go. False if any of that fails.
bool hand_over_and_connect(Child& child, int sock, ibv_context* ctx, const Handles& h, ibv_qp* qp,
                           const ibv_gid& gid) {
  uint32_t peer_qpn = 0;
  return send_fd(sock, ctx->cmd_fd, &h, sizeof h) &&
         read_all(child.rfd, &peer_qpn, sizeof peer_qpn, kChildDeadline) &&
         bring_up(qp, peer_qpn, gid, QpConfig{}) == 0 && signal_step(child.wfd, 'G');
}

// The importer of the first test.
int importer(int sock, int rfd, int wfd) {
  Imported in;
  if (const int step = import_and_connect(sock, rfd, wfd, in); step != 0) return step;
  const Handles& h = in.h;
  ibv_context* ctx = in.ctx;
  ibv_pd* pd = in.pd;
  ibv_mr* shared = in.shared;
  ibv_cq* cq = in.cq;
  ibv_qp* qp = in.qp;
  // Handles nobody made, and an MR through a PD it is not in.
  ibv_pd* spare = ibv_import_pd(ctx, h.spare_pd);
  if (spare == nullptr) return 10;
  errno = 0;
  if (ibv_import_mr(spare, h.shared_mr) != nullptr || errno != EINVAL) return 11;
  errno = 0;
  if (ibv_import_pd(ctx, 0xFFFFFFF0u) != nullptr || errno != EINVAL) return 12;

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

  // An MR of ours in the shared PD, which the owner imports in turn (the
  // context's objects are every holder's) and sends from.
  std::vector<uint8_t> theirs(kTheirsLen);
  fill_pattern(theirs, 9);
  ibv_mr* lent = ibv_reg_mr(pd, theirs.data(), theirs.size(), IBV_ACCESS_LOCAL_WRITE);
  if (lent == nullptr) return 24;
  const Lent note{lent->handle, reinterpret_cast<uint64_t>(theirs.data())};
  if (!write_all(wfd, &note, sizeof note) || !await_step(rfd, 'M')) return 25;
  if (ibv_dereg_mr(lent) != 0) return 26;

  // A receive WQE with SGEs in two processes' memory: a header here, the
  // payload in the owner's shared MR. The owner's SEND fills both.
  std::vector<uint8_t> header(kHeaderLen, 0);
  ibv_mr* header_mr = ibv_reg_mr(pd, header.data(), header.size(), IBV_ACCESS_LOCAL_WRITE);
  if (header_mr == nullptr) return 27;
  ibv_sge rsges[2] = {{reinterpret_cast<uint64_t>(header.data()), static_cast<uint32_t>(kHeaderLen), header_mr->lkey},
                      {h.shared_addr + kRecvOff, static_cast<uint32_t>(kRecvLen), shared->lkey}};
  if (post_recv(qp, 7, rsges, 2) != 0 || !signal_step(wfd, 'V')) return 28;
  ibv_wc rwc{};
  if (!poll_one(cq, &rwc, kChildDeadline) || rwc.status != IBV_WC_SUCCESS || rwc.wr_id != 7 ||
      rwc.byte_len != kHeaderLen + kRecvLen)
    return 29;
  std::vector<uint8_t> sent(kHeaderLen + kRecvLen);
  fill_pattern(sent, 11);
  if (first_mismatch(header, std::span(sent).first(kHeaderLen)) != -1) return 34;
  if (ibv_dereg_mr(header_mr) != 0 || !signal_step(wfd, 'W')) return 35;

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
  errno = 0;
  if (ibv_import_mr(pd, h.doomed_mr) != nullptr || errno != EINVAL) return 44;  // gone from the context
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
  ImporterChild importer_child(importer);
  Child& child = importer_child.child;
  ASSERT_TRUE(importer_child.ok());
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
  ASSERT_TRUE(hand_over_and_connect(child, importer_child.sock(), dev.ctx, h, qp, dev.gid))
      << "child exited with " << child.wait_exit(Millis{100});

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

  // The importer's MR in our PD, imported here and sent from: its bytes,
  // gathered from the importer's memory, land in our target.
  Lent lent{};
  ASSERT_TRUE(read_all(child.rfd, &lent, sizeof lent, kChildDeadline)) << "child exited with " << child.wait_exit(Millis{100});
  ibv_mr* theirs = ibv_import_mr(dev.pd, lent.handle);
  ASSERT_NE(theirs, nullptr) << "errno " << errno;
  EXPECT_EQ(theirs->length, kTheirsLen);
  sge = ibv_sge{lent.addr + 5, static_cast<uint32_t>(kTheirsLen - 10), theirs->lkey};
  wr = make_wr(3, IBV_WR_RDMA_WRITE, &sge, 1);
  wr.wr.rdma.remote_addr = target.addr(kTheirsAt);
  wr.wr.rdma.rkey = target.rkey();
  ASSERT_EQ(post_send(qp, wr), 0);
  ASSERT_TRUE(poll_one(cq, &wc, kChildDeadline));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  std::vector<uint8_t> their_bytes(kTheirsLen);
  fill_pattern(their_bytes, 9);
  EXPECT_EQ(first_mismatch(target.span(kTheirsAt, kTheirsLen - 10), std::span(their_bytes).subspan(5, kTheirsLen - 10)),
            -1);
  ibv_unimport_mr(theirs);
  ASSERT_TRUE(signal_step(child.wfd, 'M'));

  // Our SEND into the importer's receive WQE, whose SGEs are a header of
  // its memory and a range of our shared MR.
  ASSERT_TRUE(await_step(child.rfd, 'V')) << "child exited with " << child.wait_exit(Millis{100});
  Buffer message(dev.pd, kHeaderLen + kRecvLen);
  ASSERT_NE(message.mr(), nullptr);
  fill_pattern(message.span(0, message.size()), 11);
  sge = message.sge(0, static_cast<uint32_t>(message.size()));
  wr = make_wr(4, IBV_WR_SEND, &sge, 1);
  ASSERT_EQ(post_send(qp, wr), 0);
  ASSERT_TRUE(poll_one(cq, &wc, kChildDeadline));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc_str(wc);
  ASSERT_TRUE(await_step(child.rfd, 'W')) << "child exited with " << child.wait_exit(Millis{100});
  EXPECT_EQ(first_mismatch(shared.span(kRecvOff, kRecvLen), message.span(kHeaderLen, kRecvLen)), -1);

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
}

// Device memory is the context's: what one process writes the other reads,
// an MR over it in either process keeps it from being freed, and freeing it
// through an imported handle frees it for its allocator too.
constexpr uint32_t kDmWord1 = 0xC0FFEE01, kDmWord2 = 0xBADC0DE2;

int dm_importer(int sock, int rfd, int wfd) {
  struct {
    uint32_t pd, dm;
  } handles{};
  const int fd = receive_fd(sock, &handles, sizeof handles);
  if (fd < 0) return 1;
  ibv_context* ctx = ibv_import_device(fd);
  if (ctx == nullptr) return 2;
  ibv_dm* dm = ibv_import_dm(ctx, handles.dm);
  ibv_pd* pd = ibv_import_pd(ctx, handles.pd);
  if (dm == nullptr || pd == nullptr) return 3;
  uint32_t seen = 0;
  if (ibv_memcpy_from_dm(&seen, dm, 8, 4) != 0 || seen != kDmWord1) return 4;
  if (ibv_memcpy_to_dm(dm, 16, &kDmWord2, 4) != 0) return 5;
  ibv_mr* mr = ibv_reg_dm_mr(pd, dm, 0, 64, IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE);
  if (mr == nullptr) return 6;
  if (!signal_step(wfd, '1') || !await_step(rfd, '2')) return 7;
  if (ibv_dereg_mr(mr) != 0) return 8;
  if (ibv_free_dm(dm) != 0) return 9;  // for the allocator too
  ibv_unimport_pd(pd);
  if (ibv_close_device(ctx) != 0) return 10;
  return signal_step(wfd, '3') ? 0 : 11;
}

TEST(ImportAcrossProcesses, DeviceMemoryIsTheContextsForEveryProcess) {
  ImporterChild importer_child(dm_importer);
  Child& child = importer_child.child;
  ASSERT_TRUE(importer_child.ok());
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_alloc_dm_attr attr{};
  attr.length = 64;
  ibv_dm* dm = ibv_alloc_dm(dev.ctx, &attr);
  ASSERT_NE(dm, nullptr);
  ASSERT_EQ(ibv_memcpy_to_dm(dm, 8, &kDmWord1, 4), 0);
  const struct {
    uint32_t pd, dm;
  } handles{dev.pd->handle, dm->handle};
  ASSERT_TRUE(send_fd(importer_child.sock(), dev.ctx->cmd_fd, &handles, sizeof handles));
  ASSERT_TRUE(await_step(child.rfd, '1')) << "child exited with " << child.wait_exit(Millis{100});
  uint32_t seen = 0;
  ASSERT_EQ(ibv_memcpy_from_dm(&seen, dm, 16, 4), 0);
  EXPECT_EQ(seen, kDmWord2);
  EXPECT_EQ(ibv_free_dm(dm), EBUSY);  // the importer's MR is over it
  ASSERT_TRUE(signal_step(child.wfd, '2'));
  ASSERT_TRUE(await_step(child.rfd, '3')) << "child exited with " << child.wait_exit(Millis{100});
  EXPECT_EQ(child.wait_exit(kChildDeadline), 0);
  // Freed by the importer: our handle only lets go; the next DM reads zeros
  // where the old one had words.
  EXPECT_EQ(ibv_free_dm(dm), 0);
  ibv_dm* fresh = ibv_alloc_dm(dev.ctx, &attr);
  ASSERT_NE(fresh, nullptr);
  uint32_t words[16] = {};
  ASSERT_EQ(ibv_memcpy_from_dm(words, fresh, 0, sizeof words), 0);
  EXPECT_EQ(words[2], 0u);
  EXPECT_EQ(words[4], 0u);
  EXPECT_EQ(ibv_free_dm(fresh), 0);
}

// Teardown racing traffic: while the importer READs into the owner's shared
// MR through the imported key (its requester scatters each answer there)
// and the owner WRITEs into that MR through the importer's QP (whose
// responder reaches the owner's memory), the owner deregisters the MR and
// fills it with a sentinel at once. Not one byte of either stream may land
// after ibv_dereg_mr returned.
constexpr size_t kStreamLen = 3 * 4096 + 200;  // partial pages and whole ones
constexpr uint8_t kSentinel = 0xEE;

int streaming_importer(int sock, int rfd, int wfd) {
  Imported in;
  if (const int step = import_and_connect(sock, rfd, wfd, in); step != 0) return step;
  // READs of the owner's target into its shared MR, until one fails.
  uint64_t done = 0;
  for (;;) {
    ibv_sge sge{in.h.shared_addr, static_cast<uint32_t>(kStreamLen), in.shared->lkey};
    ibv_send_wr wr = make_wr(done, IBV_WR_RDMA_READ, &sge, 1);
    wr.wr.rdma.remote_addr = in.h.target_addr;
    wr.wr.rdma.rkey = in.h.target_rkey;
    const int status = run_wr(in.qp, in.cq, wr);
    if (status != IBV_WC_SUCCESS) break;
    if (++done == 20 && !signal_step(wfd, 'R')) return 20;  // streaming: the owner may deregister
  }
  if (done < 20) return 21;
  return signal_step(wfd, 'E') ? 0 : 22;
}

TEST(ImportAcrossProcesses, NoByteLandsInTheOwnersMemoryAfterItsDeregistration) {
  ImporterChild importer_child(streaming_importer);
  Child& child = importer_child.child;
  ASSERT_TRUE(importer_child.ok());
  Device dev;
  ASSERT_TRUE(dev.ok());
  QpConfig cfg;
  ibv_cq* cq = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp* qp = create_qp(dev.pd, cq, cq, cfg);
  ASSERT_NE(qp, nullptr);
  std::vector<uint8_t> shared(kStreamLen, 0);
  ibv_mr* shared_mr = ibv_reg_mr(dev.pd, shared.data(), shared.size(), Buffer::kAllAccess);
  Buffer target(dev.pd, kStreamLen);
  Buffer source(dev.pd, kStreamLen);
  ASSERT_TRUE(shared_mr && target.mr() && source.mr());
  fill_pattern(target.span(0, kStreamLen), 5);
  fill_pattern(source.span(0, kStreamLen), 6);
  const Handles h{dev.pd->handle, 0, shared_mr->handle, shared_mr->lkey, reinterpret_cast<uint64_t>(shared.data()),
                  shared.size(),  0, target.rkey(),     target.addr(),   qp->qp_num};
  ASSERT_TRUE(hand_over_and_connect(child, importer_child.sock(), dev.ctx, h, qp, dev.gid))
      << "child exited with " << child.wait_exit(Millis{100});

  // Our WRITEs into the shared MR through the importer's QP, from a thread
  // of ours, until one fails.
  std::atomic<uint64_t> writes{0};
  const uint32_t shared_rkey = shared_mr->rkey;  // the handle goes at the dereg below
  std::thread writer([&] {
    for (;;) {
      ibv_sge sge = source.sge(0, kStreamLen);
      ibv_send_wr wr = make_wr(1, IBV_WR_RDMA_WRITE, &sge, 1);
      wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(shared.data());
      wr.wr.rdma.rkey = shared_rkey;
      if (run_wr(qp, cq, wr) != IBV_WC_SUCCESS) return;
      writes.fetch_add(1, std::memory_order_relaxed);
    }
  });
  const bool streaming = await_step(child.rfd, 'R');
  const auto until = Clock::now() + kChildDeadline;
  while (writes.load(std::memory_order_relaxed) < 20 && Clock::now() < until) std::this_thread::yield();
  EXPECT_EQ(ibv_dereg_mr(shared_mr), 0);
  std::memset(shared.data(), kSentinel, shared.size());
  // Both streams end: the importer's next READ finds no key, and our WRITEs
  // stop at the first that fails (the importer's QP went to ERROR).
  writer.join();
  EXPECT_TRUE(streaming) << "child exited with " << child.wait_exit(Millis{100});
  EXPECT_TRUE(await_step(child.rfd, 'E'));
  EXPECT_EQ(child.wait_exit(kChildDeadline), 0);
  EXPECT_GE(writes.load(), 20u);
  EXPECT_EQ(first_not(std::span<const uint8_t>(shared), kSentinel), -1);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

// The same fence, made certain over the udp link: the importer READs into
// the owner's shared MR from a third process's memory while that process
// is stopped (SIGSTOP), so the answer is still to come when the owner
// deregisters the MR and fills it with a sentinel; the third process then
// goes on and answers. The answer must not be placed: the READ ends in
// LOC_PROT_ERR. (Over shared memory the importer reads the third process's
// memory itself, and its READ has ended before the owner deregisters.)
struct Endpoint {
  uint32_t qpn, rkey;
  uint64_t addr;
};

int paused_target(int rfd, int wfd) {
  Device dev;
  if (!dev.ok()) return 1;
  QpConfig cfg;
  ibv_cq* cq = ibv_create_cq(dev.ctx, 16, nullptr, nullptr, 0);
  ibv_qp* qp = cq ? create_qp(dev.pd, cq, cq, cfg) : nullptr;
  Buffer memory(dev.pd, kStreamLen);
  if (qp == nullptr || memory.mr() == nullptr) return 2;
  fill_pattern(memory.span(0, kStreamLen), 7);
  const Endpoint mine{qp->qp_num, memory.rkey(), memory.addr()};
  uint32_t peer_qpn = 0;
  if (!write_all(wfd, &mine, sizeof mine) || !read_all(rfd, &peer_qpn, sizeof peer_qpn, kChildDeadline)) return 3;
  if (bring_up(qp, peer_qpn, dev.gid, cfg) != 0 || !signal_step(wfd, 'U')) return 4;
  if (!await_step(rfd, 'Q')) return 5;
  ibv_destroy_qp(qp);
  ibv_destroy_cq(cq);
  return 0;
}

int late_reader(int sock, int rfd, int wfd) {
  Imported in;
  if (const int step = import_and_connect(sock, rfd, wfd, in); step != 0) return step;
  ibv_sge sge{in.h.shared_addr, static_cast<uint32_t>(kStreamLen), in.shared->lkey};
  ibv_send_wr wr = make_wr(1, IBV_WR_RDMA_READ, &sge, 1);
  wr.wr.rdma.remote_addr = in.h.target_addr;
  wr.wr.rdma.rkey = in.h.target_rkey;
  if (post_send(in.qp, wr) != 0) return 20;
  if (!signal_step(wfd, 'P') || !await_step(rfd, 'D')) return 21;
  ibv_wc wc{};
  if (!poll_one(in.cq, &wc, kChildDeadline)) return 22;
  const int32_t status = wc.status;
  return write_all(wfd, &status, sizeof status) ? 0 : 23;
}

TEST(ImportAcrossProcesses, AnAnswerThatComesAfterTheOwnersDeregistrationIsNotPlaced) {
  ImporterChild importer_child(late_reader);
  Child& reader = importer_child.child;
  Child target(paused_target);
  ASSERT_TRUE(importer_child.ok() && target.ok());
  Device dev;
  ASSERT_TRUE(dev.ok());
  std::vector<uint8_t> shared(kStreamLen, 0);
  ibv_mr* shared_mr = ibv_reg_mr(dev.pd, shared.data(), shared.size(), Buffer::kAllAccess);
  ASSERT_NE(shared_mr, nullptr);
  Endpoint far{};
  ASSERT_TRUE(read_all(target.rfd, &far, sizeof far, kChildDeadline)) << "target exited with " << target.wait_exit(Millis{100});
  const Handles h{dev.pd->handle, 0, shared_mr->handle, shared_mr->lkey, reinterpret_cast<uint64_t>(shared.data()),
                  shared.size(),  0, far.rkey,          far.addr,        far.qpn};
  ASSERT_TRUE(send_fd(importer_child.sock(), dev.ctx->cmd_fd, &h, sizeof h));
  uint32_t reader_qpn = 0;
  ASSERT_TRUE(read_all(reader.rfd, &reader_qpn, sizeof reader_qpn, kChildDeadline))
      << "reader exited with " << reader.wait_exit(Millis{100});
  ASSERT_TRUE(write_all(target.wfd, &reader_qpn, sizeof reader_qpn));
  ASSERT_TRUE(await_step(target.rfd, 'U')) << "target exited with " << target.wait_exit(Millis{100});

  ASSERT_EQ(::kill(target.pid(), SIGSTOP), 0);
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(target.pid()), &info, WSTOPPED), 0);
  ASSERT_TRUE(signal_step(reader.wfd, 'G'));
  ASSERT_TRUE(await_step(reader.rfd, 'P')) << "reader exited with " << reader.wait_exit(Millis{100});
  EXPECT_EQ(ibv_dereg_mr(shared_mr), 0);
  std::memset(shared.data(), kSentinel, shared.size());
  ASSERT_EQ(::kill(target.pid(), SIGCONT), 0);
  ASSERT_TRUE(signal_step(reader.wfd, 'D'));
  int32_t status = -1;
  ASSERT_TRUE(read_all(reader.rfd, &status, sizeof status, kChildDeadline))
      << "reader exited with " << reader.wait_exit(Millis{100});
  const char* link = std::getenv("SOFTHCA_LINK");
  if (link != nullptr && std::string(link) == "udp") {
    EXPECT_EQ(status, IBV_WC_LOC_PROT_ERR) << ibv_wc_status_str(static_cast<ibv_wc_status>(status));
  } else {
    EXPECT_TRUE(status == IBV_WC_SUCCESS || status == IBV_WC_LOC_PROT_ERR)
        << ibv_wc_status_str(static_cast<ibv_wc_status>(status));
  }
  EXPECT_EQ(first_not(std::span<const uint8_t>(shared), kSentinel), -1);
  EXPECT_EQ(reader.wait_exit(kChildDeadline), 0);
  ASSERT_TRUE(signal_step(target.wfd, 'Q'));
  EXPECT_EQ(target.wait_exit(kChildDeadline), 0);
}

// A process that shares a context and is killed: its QP and MR in the
// owner's PD die with it, and stop holding the PD.
int holder_then_killed(int sock, int rfd, int wfd) {
  uint32_t pd_handle = 0;
  const int fd = receive_fd(sock, &pd_handle, sizeof pd_handle);
  ibv_context* ctx = fd >= 0 ? ibv_import_device(fd) : nullptr;
  ibv_pd* pd = ctx != nullptr ? ibv_import_pd(ctx, pd_handle) : nullptr;
  if (pd == nullptr) return 1;
  ibv_cq* cq = ibv_create_cq(ctx, 4, nullptr, nullptr, 0);
  ibv_qp* qp = cq != nullptr ? create_qp(pd, cq, cq, QpConfig{}) : nullptr;
  std::vector<uint8_t> bytes(4096);
  ibv_mr* mr = ibv_reg_mr(pd, bytes.data(), bytes.size(), IBV_ACCESS_LOCAL_WRITE);
  if (qp == nullptr || mr == nullptr) return 2;
  if (!signal_step(wfd, 'H')) return 3;
  await_step(rfd, 'Q');  // killed before this comes
  return 4;
}

TEST(ImportAcrossProcesses, AKilledImportersObjectsNoLongerHoldThePd) {
  ImporterChild importer_child(holder_then_killed);
  Child& child = importer_child.child;
  ASSERT_TRUE(importer_child.ok());
  Device dev;
  ASSERT_TRUE(dev.ok());
  ibv_pd* pd = ibv_alloc_pd(dev.ctx);
  ASSERT_NE(pd, nullptr);
  ASSERT_TRUE(send_fd(importer_child.sock(), dev.ctx->cmd_fd, &pd->handle, sizeof pd->handle));
  ASSERT_TRUE(await_step(child.rfd, 'H')) << "child exited with " << child.wait_exit(Millis{100});
  EXPECT_EQ(ibv_dealloc_pd(pd), EBUSY);
  child.kill_now();
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
}

// Another Unix user's process that is handed the fd has a host registry of
// its own, where the owner's PD ids and keys mean nothing: it cannot import
// the context (ENXIO), whatever it is passed.
int other_user_importer(int sock, int, int wfd) {
  if (::setgroups(0, nullptr) != 0 || ::setresgid(65534, 65534, 65534) != 0 || ::setresuid(65534, 65534, 65534) != 0)
    return 1;
  uint32_t pd_handle = 0;
  const int fd = receive_fd(sock, &pd_handle, sizeof pd_handle);
  if (fd < 0) return 2;
  errno = 0;
  ibv_context* ctx = ibv_import_device(fd);
  const int32_t err = ctx == nullptr ? errno : 0;
  return write_all(wfd, &err, sizeof err) ? 0 : 3;
}

TEST(ImportAcrossProcesses, AnotherUsersProcessCannotImport) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user (65534)";
  ImporterChild importer_child(other_user_importer);
  Child& child = importer_child.child;
  ASSERT_TRUE(importer_child.ok());
  Device dev;
  ASSERT_TRUE(dev.ok());
  ASSERT_TRUE(send_fd(importer_child.sock(), dev.ctx->cmd_fd, &dev.pd->handle, sizeof dev.pd->handle));
  int32_t err = -1;
  ASSERT_TRUE(read_all(child.rfd, &err, sizeof err, kChildDeadline)) << "child exited with " << child.wait_exit(Millis{100});
  EXPECT_EQ(err, ENXIO) << std::strerror(err);
  EXPECT_EQ(child.wait_exit(kChildDeadline), 0);
}

}  // namespace
}  // namespace loopback
