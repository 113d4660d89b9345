// Every verb's error paths, as an application sees them: the return value and
// errno of each, by the convention rdma-core 44 gives the verb:
//   int verbs      -> the positive errno, and errno set to the same value
//                     (programs print strerror(errno) after one, as UCX does);
//   ibv_post_*     -> the same, with *bad_wr naming the first WR not posted;
//   pointer verbs  -> NULL with errno set;
//   -1 verbs       -> -1 with errno set (ibv_query_gid, ibv_get_cq_event, ...);
//   -errno verbs   -> _ibv_query_gid_table (errno set as well);
//   ibv_rereg_mr   -> IBV_REREG_MR_ERR_INPUT / _CMD with errno set.
// errno is set to a sentinel before each call, so a path that forgets errno
// shows as the sentinel. Only <infiniband/verbs.h> and our libibverbs.so.1.
#include <endian.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

constexpr int kSentinel = 0x5e47;  // no errno value is this large

std::string errno_name(int err) { return err == kSentinel ? "(errno untouched)" : std::strerror(err); }

// An int verb failed with `expected`: returned it and left it in errno.
void expect_int_error(const char* what, int expected, const std::function<int()>& call) {
  errno = kSentinel;
  const int ret = call();
  const int err = errno;
  EXPECT_EQ(ret, expected) << what << " returned " << ret;
  EXPECT_EQ(err, expected) << what << ": errno is " << err << " " << errno_name(err);
}

// A pointer verb failed: NULL, errno `expected`.
template <typename T>
void expect_null(const char* what, int expected, const std::function<T*()>& call) {
  errno = kSentinel;
  T* ret = call();
  const int err = errno;
  EXPECT_EQ(ret, nullptr) << what;
  EXPECT_EQ(err, expected) << what << ": errno is " << err << " " << errno_name(err);
}

// A verb of the -1 + errno kind failed with `expected`.
void expect_minus_one(const char* what, int expected, const std::function<long()>& call) {
  errno = kSentinel;
  const long ret = call();
  const int err = errno;
  EXPECT_EQ(ret, -1) << what;
  EXPECT_EQ(err, expected) << what << ": errno is " << err << " " << errno_name(err);
}

class ErrnoConventions : public ::testing::Test {
 protected:
  void SetUp() override {
    int num = 0;
    ibv_device** list = ibv_get_device_list(&num);
    ASSERT_NE(list, nullptr);
    ASSERT_GE(num, 1);
    ctx_ = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    ASSERT_NE(ctx_, nullptr);
    ASSERT_EQ(ibv_query_device(ctx_, &dev_), 0);
    pd_ = ibv_alloc_pd(ctx_);
    ASSERT_NE(pd_, nullptr);
    cq_ = ibv_create_cq(ctx_, 16, nullptr, nullptr, 0);
    ASSERT_NE(cq_, nullptr);
  }
  void TearDown() override {
    if (cq_) ibv_destroy_cq(cq_);
    if (pd_) ibv_dealloc_pd(pd_);
    if (ctx_) ibv_close_device(ctx_);
  }

  ibv_qp* create_qp(ibv_qp_type type = IBV_QPT_RC, ibv_srq* srq = nullptr) {
    ibv_qp_init_attr init{};
    init.send_cq = cq_;
    init.recv_cq = cq_;
    init.srq = srq;
    init.qp_type = type;
    init.cap.max_send_wr = 4;
    init.cap.max_recv_wr = srq ? 0 : 4;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = srq ? 0 : 1;
    ibv_qp* qp = ibv_create_qp(pd_, &init);
    if (qp != nullptr) max_recv_wr_ = init.cap.max_recv_wr;
    return qp;
  }
  int to_init(ibv_qp* qp, ibv_qp_type type = IBV_QPT_RC) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    if (type == IBV_QPT_UD) {
      a.qkey = 0x11;
      return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
    }
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE;
    return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  }

  ibv_context* ctx_ = nullptr;
  ibv_device_attr dev_{};
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  uint32_t max_recv_wr_ = 0;
};

TEST_F(ErrnoConventions, DeviceVerbs) {
  ibv_device foreign{};  // not one of ours
  expect_null<const char>("ibv_get_device_name(NULL)", EINVAL, [] { return ibv_get_device_name(nullptr); });
  expect_null<ibv_context>("ibv_open_device(foreign)", ENODEV, [&] { return ibv_open_device(&foreign); });
  errno = kSentinel;
  EXPECT_EQ(ibv_get_device_guid(&foreign), 0u);
  EXPECT_EQ(errno, EINVAL) << "ibv_get_device_guid(foreign)";
  expect_minus_one("ibv_get_device_index(foreign)", EINVAL, [&] { return ibv_get_device_index(&foreign); });
}

TEST_F(ErrnoConventions, QueryVerbs) {
  ibv_port_attr port{};
  expect_int_error("ibv_query_port(port 2)", EINVAL, [&] { return ibv_query_port(ctx_, 2, &port); });
  // (ibv_query_device_ex's only error, an unknown input comp_mask, is
  // answered by the inline wrapper in <infiniband/verbs.h>, without errno,
  // before any library code runs.)
  ibv_values_ex values{};
  values.comp_mask = 1u << 7;
  expect_int_error("ibv_query_rt_values_ex(unknown comp_mask)", EINVAL,
                   [&] { return ibv_query_rt_values_ex(ctx_, &values); });
  ibv_gid gid{};
  expect_minus_one("ibv_query_gid(index -1)", EINVAL, [&] { return ibv_query_gid(ctx_, 1, -1, &gid); });
  expect_minus_one("ibv_query_gid(port 2)", EINVAL, [&] { return ibv_query_gid(ctx_, 2, 0, &gid); });
  ibv_gid_entry entry{};
  expect_int_error("ibv_query_gid_ex(index past the table)", EINVAL,
                   [&] { return ibv_query_gid_ex(ctx_, 1, 1u << 20, &entry, 0); });
  expect_int_error("ibv_query_gid_ex(unknown flags)", EINVAL,
                   [&] { return ibv_query_gid_ex(ctx_, 1, 0, &entry, 1); });
  errno = kSentinel;
  EXPECT_EQ(ibv_query_gid_table(ctx_, &entry, 0, 0), -EINVAL) << "ibv_query_gid_table(no room)";
  EXPECT_EQ(errno, EINVAL) << "ibv_query_gid_table(no room)";
  __be16 pkey = 0;
  expect_minus_one("ibv_query_pkey(index past the table)", EINVAL,
                   [&] { return ibv_query_pkey(ctx_, 1, dev_.max_pkeys, &pkey); });
  expect_minus_one("ibv_get_pkey_index(absent P_Key)", ENOENT, [&] { return ibv_get_pkey_index(ctx_, 1, 0x1234); });
}

TEST_F(ErrnoConventions, ProtectionDomainsAndMemoryRegions) {
  std::vector<uint8_t> bytes(4096);
  expect_null<ibv_mr>("ibv_reg_mr(length 0)", EINVAL, [&] { return ibv_reg_mr(pd_, bytes.data(), 0, 0); });
  // Remote write needs local write (the kernel's rule).
  expect_null<ibv_mr>("ibv_reg_mr(REMOTE_WRITE alone)", EINVAL,
                      [&] { return ibv_reg_mr(pd_, bytes.data(), bytes.size(), IBV_ACCESS_REMOTE_WRITE); });
  ibv_mr* mr = ibv_reg_mr(pd_, bytes.data(), bytes.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  expect_int_error("ibv_dealloc_pd(with an MR)", EBUSY, [&] { return ibv_dealloc_pd(pd_); });
  // ibv_rereg_mr: IBV_REREG_MR_ERR_INPUT for what libibverbs refuses itself,
  // IBV_REREG_MR_ERR_CMD for what the provider refuses; errno says why.
  const auto expect_rereg = [&](const char* what, int code, int err, int flags, ibv_pd* pd, void* addr,
                                size_t length, int access) {
    errno = kSentinel;
    const int ret = ibv_rereg_mr(mr, flags, pd, addr, length, access);
    const int got = errno;
    EXPECT_EQ(ret, code) << what;
    EXPECT_EQ(got, err) << what << ": errno is " << errno_name(got);
  };
  expect_rereg("ibv_rereg_mr(unknown flag)", IBV_REREG_MR_ERR_INPUT, EINVAL, IBV_REREG_MR_FLAGS_SUPPORTED + 1,
               nullptr, nullptr, 0, 0);
  expect_rereg("ibv_rereg_mr(CHANGE_TRANSLATION without a range)", IBV_REREG_MR_ERR_INPUT, EINVAL,
               IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, nullptr, 0, 0);
  expect_rereg("ibv_rereg_mr(access without CHANGE_ACCESS)", IBV_REREG_MR_ERR_INPUT, EINVAL,
               IBV_REREG_MR_CHANGE_PD, pd_, nullptr, 0, IBV_ACCESS_LOCAL_WRITE);
  expect_rereg("ibv_rereg_mr(CHANGE_PD to NULL)", IBV_REREG_MR_ERR_CMD, EINVAL, IBV_REREG_MR_CHANGE_PD, nullptr,
               nullptr, 0, 0);
  expect_rereg("ibv_rereg_mr(REMOTE_WRITE alone)", IBV_REREG_MR_ERR_CMD, EINVAL, IBV_REREG_MR_CHANGE_ACCESS,
               nullptr, nullptr, 0, IBV_ACCESS_REMOTE_WRITE);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  expect_null<ibv_mr>("ibv_reg_dmabuf_mr", EOPNOTSUPP,
                      [&] { return ibv_reg_dmabuf_mr(pd_, 0, 4096, 0, -1, IBV_ACCESS_LOCAL_WRITE); });
  // A handle no PD of this context has (imports: loopback import_test).
  expect_null<ibv_pd>("ibv_import_pd", EINVAL, [&] { return ibv_import_pd(ctx_, 0xFFFFFFF0u); });
}

TEST_F(ErrnoConventions, CompletionQueuesAndChannels) {
  expect_null<ibv_cq>("ibv_create_cq(cqe 0)", EINVAL, [&] { return ibv_create_cq(ctx_, 0, nullptr, nullptr, 0); });
  expect_null<ibv_cq>("ibv_create_cq(cqe past max_cqe)", EINVAL,
                      [&] { return ibv_create_cq(ctx_, dev_.max_cqe + 1, nullptr, nullptr, 0); });
  expect_null<ibv_cq>("ibv_create_cq(comp_vector past num_comp_vectors)", EINVAL,
                      [&] { return ibv_create_cq(ctx_, 4, nullptr, nullptr, ctx_->num_comp_vectors); });
  ibv_cq_init_attr_ex ex{};
  ex.cqe = 4;
  ex.wc_flags = IBV_WC_EX_WITH_FLOW_TAG;  // never produced: refused
  expect_null<ibv_cq_ex>("ibv_create_cq_ex(unsupported wc_flags)", EOPNOTSUPP,
                         [&] { return ibv_create_cq_ex(ctx_, &ex); });
  expect_int_error("ibv_resize_cq(past max_cqe)", EINVAL, [&] { return ibv_resize_cq(cq_, dev_.max_cqe + 1); });

  ibv_comp_channel* channel = ibv_create_comp_channel(ctx_);
  ASSERT_NE(channel, nullptr);
  ibv_cq* cq = ibv_create_cq(ctx_, 4, nullptr, channel, 0);
  ASSERT_NE(cq, nullptr);
  expect_int_error("ibv_destroy_comp_channel(with a CQ)", EBUSY, [&] { return ibv_destroy_comp_channel(channel); });
  // No event yet on a non-blocking channel: -1 with EAGAIN, as read(2) gives it.
  const int flags = fcntl(channel->fd, F_GETFL);
  ASSERT_EQ(fcntl(channel->fd, F_SETFL, flags | O_NONBLOCK), 0);
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  expect_minus_one("ibv_get_cq_event(nothing pending)", EAGAIN,
                   [&] { return ibv_get_cq_event(channel, &ev_cq, &ev_ctx); });
  ibv_qp_init_attr init{};
  init.send_cq = cq;
  init.recv_cq = cq;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = init.cap.max_recv_wr = init.cap.max_send_sge = init.cap.max_recv_sge = 1;
  ibv_qp* qp = ibv_create_qp(pd_, &init);
  ASSERT_NE(qp, nullptr);
  expect_int_error("ibv_destroy_cq(used by a QP)", EBUSY, [&] { return ibv_destroy_cq(cq); });
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_destroy_comp_channel(channel), 0);
}

TEST_F(ErrnoConventions, AsyncEvents) {
  const int flags = fcntl(ctx_->async_fd, F_GETFL);
  ASSERT_EQ(fcntl(ctx_->async_fd, F_SETFL, flags | O_NONBLOCK), 0);
  ibv_async_event event{};
  expect_minus_one("ibv_get_async_event(nothing pending)", EAGAIN, [&] { return ibv_get_async_event(ctx_, &event); });
}

TEST_F(ErrnoConventions, QueuePairCreation) {
  ibv_qp_init_attr init{};
  init.send_cq = cq_;
  init.recv_cq = cq_;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = static_cast<uint32_t>(dev_.max_qp_wr) + 1;
  init.cap.max_recv_wr = 1;
  expect_null<ibv_qp>("ibv_create_qp(max_send_wr past max_qp_wr)", EINVAL, [&] { return ibv_create_qp(pd_, &init); });
  init.cap.max_send_wr = 1;
  init.cap.max_send_sge = static_cast<uint32_t>(dev_.max_sge) + 1;
  expect_null<ibv_qp>("ibv_create_qp(max_send_sge past max_sge)", EINVAL, [&] { return ibv_create_qp(pd_, &init); });
  init.cap.max_send_sge = 1;
  init.qp_type = IBV_QPT_DRIVER;
  expect_null<ibv_qp>("ibv_create_qp(DRIVER)", EOPNOTSUPP, [&] { return ibv_create_qp(pd_, &init); });
  init.qp_type = IBV_QPT_RC;
  init.send_cq = nullptr;
  expect_null<ibv_qp>("ibv_create_qp(no send CQ)", EINVAL, [&] { return ibv_create_qp(pd_, &init); });

  ibv_qp_init_attr_ex ex{};
  ex.send_cq = ex.recv_cq = cq_;
  ex.qp_type = IBV_QPT_RC;
  ex.cap.max_send_wr = ex.cap.max_recv_wr = ex.cap.max_send_sge = ex.cap.max_recv_sge = 1;
  ex.comp_mask = 0;  // no PD
  expect_null<ibv_qp>("ibv_create_qp_ex(no PD)", EINVAL, [&] { return ibv_create_qp_ex(ctx_, &ex); });
  ex.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
  ex.pd = pd_;
  ex.create_flags = IBV_QP_CREATE_SCATTER_FCS;
  expect_null<ibv_qp>("ibv_create_qp_ex(unsupported create_flags)", EOPNOTSUPP,
                      [&] { return ibv_create_qp_ex(ctx_, &ex); });

  ibv_qp* qp = create_qp();
  ASSERT_NE(qp, nullptr);
  expect_null<ibv_qp_ex>("ibv_qp_to_qp_ex(no SEND_OPS_FLAGS)", EOPNOTSUPP, [&] { return ibv_qp_to_qp_ex(qp); });
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
}

TEST_F(ErrnoConventions, QueuePairStates) {
  ibv_qp* qp = create_qp();
  ASSERT_NE(qp, nullptr);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTS;
  expect_int_error("ibv_modify_qp(RESET -> RTS)", EINVAL, [&] { return ibv_modify_qp(qp, &a, IBV_QP_STATE); });
  a = {};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 2;
  expect_int_error("ibv_modify_qp(INIT on port 2)", EINVAL,
                   [&] {
                     return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
                   });
  a.port_num = 1;
  expect_int_error("ibv_modify_qp(INIT without its required attributes)", EINVAL,
                   [&] { return ibv_modify_qp(qp, &a, IBV_QP_STATE); });

  ibv_sge sge{};
  ibv_send_wr swr{};
  swr.opcode = IBV_WR_SEND;
  swr.sg_list = &sge;
  swr.num_sge = 1;
  ibv_send_wr* bad_send = nullptr;
  expect_int_error("ibv_post_send(RESET)", EINVAL, [&] { return ibv_post_send(qp, &swr, &bad_send); });
  EXPECT_EQ(bad_send, &swr);
  ibv_recv_wr rwr{};
  ibv_recv_wr* bad_recv = nullptr;
  expect_int_error("ibv_post_recv(RESET)", EINVAL, [&] { return ibv_post_recv(qp, &rwr, &bad_recv); });
  EXPECT_EQ(bad_recv, &rwr);

  ASSERT_EQ(to_init(qp), 0);
  // INIT -> RTR through an empty GID index: ENODATA, as the kernel (5.10+) answers.
  ibv_port_attr port{};
  ASSERT_EQ(ibv_query_port(ctx_, 1, &port), 0);
  int empty = -1;
  for (int i = 1; i < port.gid_tbl_len && empty < 0; ++i) {
    ibv_gid gid{};
    const ibv_gid zero{};
    if (ibv_query_gid(ctx_, 1, i, &gid) == 0 && std::memcmp(&gid, &zero, sizeof gid) == 0) empty = i;
  }
  if (empty >= 0) {
    ibv_qp_attr r{};
    r.qp_state = IBV_QPS_RTR;
    r.path_mtu = IBV_MTU_1024;
    r.dest_qp_num = qp->qp_num;
    r.ah_attr.is_global = 1;
    r.ah_attr.grh.sgid_index = static_cast<uint8_t>(empty);
    r.ah_attr.port_num = 1;
    expect_int_error("ibv_modify_qp(RTR through an empty GID index)", ENODATA, [&] {
      return ibv_modify_qp(qp, &r,
                           IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    });
  }

  // A full receive queue: the WR that does not fit is ENOMEM, the ones before it are posted.
  std::vector<ibv_recv_wr> chain(max_recv_wr_ + 1);
  for (size_t i = 0; i < chain.size(); ++i) chain[i].next = i + 1 < chain.size() ? &chain[i + 1] : nullptr;
  expect_int_error("ibv_post_recv(one past max_recv_wr)", ENOMEM,
                   [&] { return ibv_post_recv(qp, chain.data(), &bad_recv); });
  EXPECT_EQ(bad_recv, &chain.back());
  ibv_recv_wr too_many_sges{};
  too_many_sges.num_sge = 2;  // max_recv_sge is 1
  ibv_sge sges[2]{};
  too_many_sges.sg_list = sges;
  expect_int_error("ibv_post_recv(num_sge past max_recv_sge)", EINVAL,
                   [&] { return ibv_post_recv(qp, &too_many_sges, &bad_recv); });
  EXPECT_EQ(bad_recv, &too_many_sges);

  // Multicast: UD QPs only, multicast GIDs only; detaching an absent group.
  ibv_gid group{};
  group.raw[0] = 0xff;
  group.raw[15] = 1;
  expect_int_error("ibv_attach_mcast(RC QP)", EINVAL, [&] { return ibv_attach_mcast(qp, &group, 0); });
  EXPECT_EQ(ibv_destroy_qp(qp), 0);

  ibv_qp* ud = create_qp(IBV_QPT_UD);
  ASSERT_NE(ud, nullptr);
  ibv_gid unicast{};
  unicast.raw[15] = 1;
  expect_int_error("ibv_attach_mcast(unicast GID)", EINVAL, [&] { return ibv_attach_mcast(ud, &unicast, 0); });
  expect_int_error("ibv_detach_mcast(not attached)", EINVAL, [&] { return ibv_detach_mcast(ud, &group, 0); });
  EXPECT_EQ(ibv_destroy_qp(ud), 0);
}

// The new post-send API: ibv_wr_complete answers for the whole batch.
TEST_F(ErrnoConventions, WrComplete) {
  ibv_qp_init_attr_ex ex{};
  ex.send_cq = ex.recv_cq = cq_;
  ex.qp_type = IBV_QPT_RC;
  ex.cap.max_send_wr = ex.cap.max_recv_wr = ex.cap.max_send_sge = ex.cap.max_recv_sge = 1;
  ex.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  ex.pd = pd_;
  ex.send_ops_flags = IBV_QP_EX_WITH_SEND;
  ibv_qp* qp = ibv_create_qp_ex(ctx_, &ex);
  ASSERT_NE(qp, nullptr);
  ibv_qp_ex* qpx = ibv_qp_to_qp_ex(qp);
  ASSERT_NE(qpx, nullptr);
  uint8_t byte = 0;
  ibv_wr_start(qpx);
  ibv_wr_send(qpx);
  ibv_wr_set_sge(qpx, 0, reinterpret_cast<uint64_t>(&byte), 1);
  expect_int_error("ibv_wr_complete(QP in RESET)", EINVAL, [&] { return ibv_wr_complete(qpx); });
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
}

TEST_F(ErrnoConventions, SharedReceiveQueues) {
  ibv_srq_init_attr init{};
  init.attr.max_wr = static_cast<uint32_t>(dev_.max_srq_wr) + 1;
  init.attr.max_sge = 1;
  expect_null<ibv_srq>("ibv_create_srq(max_wr past max_srq_wr)", EINVAL, [&] { return ibv_create_srq(pd_, &init); });
  init.attr.max_wr = 2;
  ibv_srq* srq = ibv_create_srq(pd_, &init);
  ASSERT_NE(srq, nullptr);
  const uint32_t granted = init.attr.max_wr;
  ibv_srq_attr attr{};
  attr.srq_limit = granted + 1;
  expect_int_error("ibv_modify_srq(limit past max_wr)", EINVAL, [&] { return ibv_modify_srq(srq, &attr, IBV_SRQ_LIMIT); });
  std::vector<ibv_recv_wr> chain(granted + 1);
  for (size_t i = 0; i < chain.size(); ++i) chain[i].next = i + 1 < chain.size() ? &chain[i + 1] : nullptr;
  ibv_recv_wr* bad = nullptr;
  expect_int_error("ibv_post_srq_recv(one past max_wr)", ENOMEM,
                   [&] { return ibv_post_srq_recv(srq, chain.data(), &bad); });
  EXPECT_EQ(bad, &chain.back());
  ibv_qp* qp = create_qp(IBV_QPT_RC, srq);
  ASSERT_NE(qp, nullptr);
  expect_int_error("ibv_destroy_srq(used by a QP)", EBUSY, [&] { return ibv_destroy_srq(srq); });
  ibv_recv_wr rwr{};
  expect_int_error("ibv_post_recv(QP with an SRQ)", EINVAL, [&] { return ibv_post_recv(qp, &rwr, &bad); });
  EXPECT_EQ(bad, &rwr);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
}

TEST_F(ErrnoConventions, AddressHandles) {
  ibv_ah_attr attr{};
  attr.port_num = 1;
  attr.is_global = 0;  // RoCE routes by GID: a GRH is required
  expect_null<ibv_ah>("ibv_create_ah(no GRH)", EINVAL, [&] { return ibv_create_ah(pd_, &attr); });
  attr.is_global = 1;
  attr.port_num = 2;
  expect_null<ibv_ah>("ibv_create_ah(port 2)", EINVAL, [&] { return ibv_create_ah(pd_, &attr); });
  attr.port_num = 1;
  attr.grh.sgid_index = 255;
  expect_null<ibv_ah>("ibv_create_ah(sgid_index past the table)", EINVAL, [&] { return ibv_create_ah(pd_, &attr); });

  // A completion whose GRH names a destination that is none of our GIDs.
  ibv_wc wc{};
  wc.wc_flags = IBV_WC_GRH;
  ibv_grh grh{};
  grh.version_tclass_flow = htobe32(6u << 28);
  grh.dgid.raw[0] = 0x20;
  grh.dgid.raw[1] = 0x01;
  grh.dgid.raw[2] = 0x0d;
  grh.dgid.raw[3] = 0xb8;  // 2001:db8::/32, documentation only
  ibv_ah_attr out{};
  expect_minus_one("ibv_init_ah_from_wc(port 2)", EINVAL,
                   [&] { return ibv_init_ah_from_wc(ctx_, 2, &wc, &grh, &out); });
  expect_minus_one("ibv_init_ah_from_wc(foreign destination)", EINVAL,
                   [&] { return ibv_init_ah_from_wc(ctx_, 1, &wc, &grh, &out); });
  expect_null<ibv_ah>("ibv_create_ah_from_wc(foreign destination)", EINVAL,
                      [&] { return ibv_create_ah_from_wc(pd_, &wc, &grh, 1); });
}

TEST_F(ErrnoConventions, DomainsAndUnsupportedObjects) {
  ibv_td_init_attr td_attr{};
  td_attr.comp_mask = 1;
  expect_null<ibv_td>("ibv_alloc_td(unknown comp_mask)", EINVAL, [&] { return ibv_alloc_td(ctx_, &td_attr); });
  td_attr.comp_mask = 0;
  ibv_td* td = ibv_alloc_td(ctx_, &td_attr);
  ASSERT_NE(td, nullptr);
  ibv_parent_domain_init_attr pd_attr{};
  expect_null<ibv_pd>("ibv_alloc_parent_domain(no PD)", EINVAL,
                      [&] { return ibv_alloc_parent_domain(ctx_, &pd_attr); });
  pd_attr.pd = pd_;
  pd_attr.td = td;
  ibv_pd* parent = ibv_alloc_parent_domain(ctx_, &pd_attr);
  ASSERT_NE(parent, nullptr);
  expect_int_error("ibv_dealloc_td(used by a parent domain)", EBUSY, [&] { return ibv_dealloc_td(td); });
  EXPECT_EQ(ibv_dealloc_pd(parent), 0);
  EXPECT_EQ(ibv_dealloc_td(td), 0);

  expect_null<ibv_mw>("ibv_alloc_mw(type 3)", EINVAL, [&] { return ibv_alloc_mw(pd_, static_cast<ibv_mw_type>(3)); });
  ibv_qp* qp = create_qp();
  ASSERT_NE(qp, nullptr);
  ibv_flow_attr flow_attr{};
  flow_attr.size = sizeof flow_attr;
  flow_attr.port = 1;
  // Flows steer to raw packet QPs only (tests/loopback/raw_test.cpp has the rest).
  expect_null<ibv_flow>("ibv_create_flow(RC QP)", EOPNOTSUPP, [&] { return ibv_create_flow(qp, &flow_attr); });
  ibv_ece ece{};
  expect_int_error("ibv_query_ece", EOPNOTSUPP, [&] { return ibv_query_ece(qp, &ece); });
  expect_int_error("ibv_set_ece", EOPNOTSUPP, [&] { return ibv_set_ece(qp, &ece); });
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  // XRC domains exist; without the file and flags rdma-core asks for, EINVAL.
  ibv_xrcd_init_attr xrcd_attr{};
  expect_null<ibv_xrcd>("ibv_open_xrcd", EINVAL, [&] { return ibv_open_xrcd(ctx_, &xrcd_attr); });
}

}  // namespace
