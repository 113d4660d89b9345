// Application-shaped test of device enumeration and the device/port/GID/P_Key
// queries: only <infiniband/verbs.h> and our libibverbs.so.1. Checks values and
// the return/errno convention of each verb as rdma-core 44 has it.
#include <endian.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/limits.hpp"  // constants only: what ibv_query_device must report

// Exported by libibverbs but declared only in rdma-core's private driver.h.
extern "C" int ibv_read_sysfs_file(const char* dir, const char* file, char* buf, size_t size);
extern "C" const char* ibv_get_sysfs_path(void);
enum test_gid_type_sysfs { kSysfsIbRoceV1 = 0, kSysfsRoceV2 = 1 };
extern "C" int ibv_query_gid_type(ibv_context* context, uint8_t port_num, unsigned int index,
                                  test_gid_type_sysfs* type);

namespace {

namespace limits = softhca::limits;

constexpr std::array<uint8_t, 16> kLocalhostGid = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};

bool is_zero(const ibv_gid& gid) {
  static const ibv_gid zero{};
  return std::memcmp(&gid, &zero, sizeof gid) == 0;
}

TEST(DeviceList, OneSofthcaDevice) {
  int num = -1;
  ibv_device** list = ibv_get_device_list(&num);
  ASSERT_NE(list, nullptr) << std::strerror(errno);
  ASSERT_EQ(num, 1);
  ASSERT_NE(list[0], nullptr);
  EXPECT_EQ(list[1], nullptr);
  ibv_device* dev = list[0];
  EXPECT_STREQ(dev->name, "softhca0");  // pyverbs reads the struct directly
  EXPECT_STREQ(ibv_get_device_name(dev), "softhca0");
  EXPECT_EQ(dev->node_type, IBV_NODE_CA);
  EXPECT_EQ(dev->transport_type, IBV_TRANSPORT_IB);
  EXPECT_STREQ(dev->ibdev_path, "/sys/class/infiniband/softhca0");
  EXPECT_NE(ibv_get_device_guid(dev), 0u);
  EXPECT_EQ(ibv_get_device_index(dev), 0);

  // A fresh array each call, the same device in it.
  ibv_device** again = ibv_get_device_list(nullptr);
  ASSERT_NE(again, nullptr);
  EXPECT_NE(again, list);
  EXPECT_EQ(again[0], dev);
  EXPECT_EQ(again[1], nullptr);
  ibv_free_device_list(again);
  ibv_free_device_list(list);
}

std::string read_sysfs(const char* dir, const char* file, int* rc = nullptr) {
  char buf[256];
  std::memset(buf, 'x', sizeof buf);
  const int n = ibv_read_sysfs_file(dir, file, buf, sizeof buf);
  if (rc != nullptr) *rc = n;
  return n >= 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

TEST(Sysfs, FakeDeviceTree) {
  ibv_device** list = ibv_get_device_list(nullptr);
  ASSERT_NE(list, nullptr);
  const char* path = list[0]->ibdev_path;
  int rc = 0;

  // ibv_devinfo prints board_id when the read returns > 0.
  EXPECT_EQ(read_sysfs(path, "board_id", &rc), "SOFTHCA-0001");
  EXPECT_EQ(rc, 12);
  EXPECT_FALSE(read_sysfs(path, "fw_ver").empty());
  EXPECT_EQ(read_sysfs(path, "node_type"), "1: CA");
  EXPECT_EQ(read_sysfs(path, "ports/1/state"), "4: ACTIVE");
  EXPECT_EQ(read_sysfs(path, "ports/1/link_layer"), "Ethernet");
  {
    // gids/N is what ibv_query_gid gives, in the kernel's format.
    ibv_context* ctx = ibv_open_device(list[0]);
    ASSERT_NE(ctx, nullptr);
    ibv_gid gid;
    ASSERT_EQ(ibv_query_gid(ctx, 1, 0, &gid), 0);
    ibv_close_device(ctx);
    char text[40];
    std::snprintf(text, sizeof text, "%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x",
                  gid.raw[0], gid.raw[1], gid.raw[2], gid.raw[3], gid.raw[4], gid.raw[5], gid.raw[6], gid.raw[7],
                  gid.raw[8], gid.raw[9], gid.raw[10], gid.raw[11], gid.raw[12], gid.raw[13], gid.raw[14],
                  gid.raw[15]);
    EXPECT_EQ(read_sysfs(path, "ports/1/gids/0"), text);
  }
  EXPECT_EQ(read_sysfs(path, "ports/1/gid_attrs/types/0"), "RoCE v2");
  EXPECT_EQ(read_sysfs(path, "ports/1/pkeys/0"), "0xffff");
  EXPECT_EQ(read_sysfs((std::string(path) + "/").c_str(), "/board_id"), "SOFTHCA-0001");
  // The parent device's locality (UCX reads it): no NUMA node, every CPU local.
  EXPECT_EQ(read_sysfs(path, "device/numa_node"), "-1");
  const long cpus = sysconf(_SC_NPROCESSORS_CONF);
  const std::string mask = read_sysfs(path, "device/local_cpus");
  ASSERT_FALSE(mask.empty());
  long set_bits = 0;
  for (const char c : mask) {
    if (c != ',') set_bits += __builtin_popcount(static_cast<unsigned>(std::stoi(std::string(1, c), nullptr, 16)));
  }
  EXPECT_EQ(set_bits, cpus) << mask;
  EXPECT_NE(mask.front(), '0') << mask;

  // node_guid in sysfs format agrees with ibv_get_device_guid.
  const uint64_t guid = be64toh(ibv_get_device_guid(list[0]));
  char expected[24];
  std::snprintf(expected, sizeof expected, "%04x:%04x:%04x:%04x", unsigned(guid >> 48) & 0xffff,
                unsigned(guid >> 32) & 0xffff, unsigned(guid >> 16) & 0xffff, unsigned(guid) & 0xffff);
  EXPECT_EQ(read_sysfs(path, "node_guid"), expected);

  errno = 0;
  EXPECT_EQ(read_sysfs(path, "no_such_file", &rc), "");
  EXPECT_EQ(rc, -1);
  EXPECT_EQ(errno, ENOENT);
  errno = 0;
  read_sysfs(path, "ports/2/state", &rc);
  EXPECT_EQ(rc, -1);
  EXPECT_EQ(errno, ENOENT);

  // Too small a buffer: fail rather than hand out an unterminated string.
  char small[4];
  EXPECT_EQ(ibv_read_sysfs_file(path, "board_id", small, sizeof small), -1);

  // Other paths are real files.
  EXPECT_EQ(read_sysfs("/proc/sys/kernel", "ostype"), "Linux");
  errno = 0;
  read_sysfs("/nonexistent-softhca-dir", "file", &rc);
  EXPECT_EQ(rc, -1);
  EXPECT_EQ(errno, ENOENT);
  EXPECT_STREQ(ibv_get_sysfs_path(), "/sys");
  ibv_free_device_list(list);
}

class DeviceQuery : public ::testing::Test {
 protected:
  void SetUp() override {
    list_ = ibv_get_device_list(nullptr);
    ASSERT_NE(list_, nullptr);
    ctx_ = ibv_open_device(list_[0]);
    ASSERT_NE(ctx_, nullptr) << "ibv_open_device: " << std::strerror(errno);
  }
  void TearDown() override {
    if (ctx_ != nullptr) {
      EXPECT_EQ(ibv_close_device(ctx_), 0);
    }
    if (list_ != nullptr) ibv_free_device_list(list_);
  }

  // The first index whose GID is empty (one exists unless the host has >= 32 addresses).
  // Where ::ffff:127.0.0.1 is: always in the table, after the interfaces'
  // addresses (index 0 only on a host, or namespace, without any).
  int localhost_gid_index() {
    for (int i = 0; i < limits::kGidTableLen; ++i) {
      ibv_gid gid;
      if (ibv_query_gid(ctx_, 1, i, &gid) == 0 && std::memcmp(gid.raw, kLocalhostGid.data(), 16) == 0) return i;
    }
    return -1;
  }

  int first_empty_gid_index() {
    for (int i = 0; i < limits::kGidTableLen; ++i) {
      ibv_gid gid;
      if (ibv_query_gid(ctx_, 1, i, &gid) == 0 && is_zero(gid)) return i;
    }
    return -1;
  }

  ibv_device** list_ = nullptr;
  ibv_context* ctx_ = nullptr;
};

TEST_F(DeviceQuery, ContextInstallsTheQueryOps) {
  verbs_context* vctx = verbs_get_ctx(ctx_);
  ASSERT_NE(vctx, nullptr);
  EXPECT_NE(verbs_get_ctx_op(ctx_, query_port), nullptr);
  EXPECT_NE(verbs_get_ctx_op(ctx_, query_device_ex), nullptr);
}

TEST_F(DeviceQuery, QueryDevice) {
  ibv_device_attr attr;
  std::memset(&attr, 0xab, sizeof attr);
  ASSERT_EQ(ibv_query_device(ctx_, &attr), 0);
  EXPECT_NE(attr.fw_ver[0], '\0');
  EXPECT_NE(attr.node_guid, 0u);
  EXPECT_EQ(attr.node_guid, ibv_get_device_guid(list_[0]));  // both big-endian
  EXPECT_EQ(attr.sys_image_guid, attr.node_guid);
  EXPECT_EQ(attr.vendor_id, limits::kVendorId);
  EXPECT_EQ(attr.vendor_part_id, limits::kVendorPartId);
  EXPECT_EQ(attr.hw_ver, limits::kHwVersion);
  EXPECT_EQ(attr.max_mr_size, limits::kMaxMrSize);
  EXPECT_EQ(attr.page_size_cap, limits::kPageSizeCap);
  EXPECT_EQ(attr.max_qp, limits::kMaxQp);
  EXPECT_EQ(attr.max_qp_wr, limits::kMaxQpWr);
  EXPECT_EQ(attr.max_sge, limits::kMaxSge);
  EXPECT_EQ(attr.max_sge_rd, limits::kMaxSgeRd);
  EXPECT_EQ(attr.max_cq, limits::kMaxCq);
  EXPECT_EQ(attr.max_cqe, limits::kMaxCqe);
  EXPECT_EQ(attr.max_mr, limits::kMaxMr);
  EXPECT_EQ(attr.max_pd, limits::kMaxPd);
  EXPECT_EQ(attr.max_qp_rd_atom, limits::kMaxQpRdAtom);
  EXPECT_EQ(attr.max_qp_init_rd_atom, limits::kMaxQpInitRdAtom);
  EXPECT_EQ(attr.max_res_rd_atom, limits::kMaxResRdAtom);
  EXPECT_EQ(attr.atomic_cap, IBV_ATOMIC_HCA);
  EXPECT_EQ(attr.max_srq, limits::kMaxSrq);
  EXPECT_EQ(attr.max_srq_wr, limits::kMaxSrqWr);
  EXPECT_EQ(attr.max_srq_sge, limits::kMaxSrqSge);
  EXPECT_EQ(attr.max_ah, limits::kMaxAh);
  EXPECT_EQ(attr.max_mcast_grp, limits::kMaxMcastGrp);
  EXPECT_EQ(attr.max_pkeys, limits::kMaxPkeys);
  EXPECT_EQ(attr.local_ca_ack_delay, limits::kLocalCaAckDelay);
  EXPECT_EQ(attr.phys_port_cnt, 1);
  EXPECT_EQ(attr.max_ee, 0);
  EXPECT_EQ(attr.max_fmr, 0);

  EXPECT_EQ(ibv_query_device(nullptr, &attr), EINVAL);
}

TEST_F(DeviceQuery, QueryDeviceEx) {
  ibv_device_attr_ex ex;
  std::memset(&ex, 0xab, sizeof ex);
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &ex), 0);
  EXPECT_EQ(ex.phys_port_cnt_ex, 1u);
  EXPECT_EQ(ex.orig_attr.phys_port_cnt, 1);
  EXPECT_EQ(ex.orig_attr.vendor_id, limits::kVendorId);
  EXPECT_EQ(ex.comp_mask, 0u);
  // On-demand paging, implicit too (loopback odp_test checks what it does).
  EXPECT_EQ(ex.odp_caps.general_caps, uint64_t{IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT});
  EXPECT_EQ(ex.tso_caps.max_tso, 0u);
  // RSS over receive work queues: raw packet QPs, Toeplitz (loopback raw_test).
  EXPECT_EQ(ex.rss_caps.supported_qpts, 1u << IBV_QPT_RAW_PACKET);
  EXPECT_EQ(ex.rss_caps.rx_hash_function, IBV_RX_HASH_FUNC_TOEPLITZ);
  EXPECT_EQ(ex.rss_caps.max_rwq_indirection_table_size, 256u);
  EXPECT_NE(ex.orig_attr.device_cap_flags & IBV_DEVICE_MANAGED_FLOW_STEERING, 0u);
  // Tag matching SRQs, RC (loopback tag_matching_test checks what they do).
  EXPECT_EQ(ex.tm_caps.flags, uint32_t{IBV_TM_CAP_RC});
  EXPECT_EQ(ex.tm_caps.max_num_tags, limits::kTmMaxNumTags);
  EXPECT_EQ(ex.tm_caps.max_rndv_hdr_size, limits::kTmMaxRndvHdrSize);
  EXPECT_EQ(ex.max_dm_size, uint64_t{limits::kMaxDmSize});
  EXPECT_EQ(ex.device_cap_flags_ex & 0xffffffffu, ex.orig_attr.device_cap_flags);

  ibv_device_attr plain;
  ASSERT_EQ(ibv_query_device(ctx_, &plain), 0);
  EXPECT_EQ(std::memcmp(&plain, &ex.orig_attr, sizeof plain), 0);

  ibv_query_device_ex_input input{};
  ASSERT_EQ(ibv_query_device_ex(ctx_, &input, &ex), 0);
  input.comp_mask = 1;
  EXPECT_EQ(ibv_query_device_ex(ctx_, &input, &ex), EINVAL);
}

TEST_F(DeviceQuery, QueryDeviceExOpWritesOnlyAttrSize) {
  verbs_context* vctx = verbs_get_ctx_op(ctx_, query_device_ex);
  ASSERT_NE(vctx, nullptr);
  struct {
    ibv_device_attr_ex attr;
    unsigned char tail[64];
  } buf;

  // An application built against old headers: only orig_attr.
  std::memset(&buf, 0xab, sizeof buf);
  ASSERT_EQ(vctx->query_device_ex(ctx_, nullptr, &buf.attr, sizeof(ibv_device_attr)), 0);
  const auto* bytes = reinterpret_cast<const unsigned char*>(&buf);
  for (size_t i = sizeof(ibv_device_attr); i < sizeof buf; ++i) ASSERT_EQ(bytes[i], 0xab) << "byte " << i;
  EXPECT_EQ(buf.attr.orig_attr.phys_port_cnt, 1);

  // A newer one: the fields we do not know are zero.
  std::memset(&buf, 0xab, sizeof buf);
  ASSERT_EQ(vctx->query_device_ex(ctx_, nullptr, &buf.attr, sizeof buf.attr + 16), 0);
  EXPECT_EQ(buf.attr.phys_port_cnt_ex, 1u);
  for (size_t i = 0; i < 16; ++i) ASSERT_EQ(buf.tail[i], 0) << "tail byte " << i;
  for (size_t i = 16; i < sizeof buf.tail; ++i) ASSERT_EQ(buf.tail[i], 0xab) << "tail byte " << i;

  EXPECT_EQ(vctx->query_device_ex(ctx_, nullptr, &buf.attr, sizeof(ibv_device_attr) - 1), EINVAL);
  ibv_query_device_ex_input input{};
  input.comp_mask = 2;
  EXPECT_EQ(vctx->query_device_ex(ctx_, &input, &buf.attr, sizeof buf.attr), EINVAL);
}

void expect_port_attr(const ibv_port_attr& p) {
  EXPECT_EQ(p.state, IBV_PORT_ACTIVE);
  EXPECT_EQ(p.max_mtu, IBV_MTU_4096);
  // The active MTU follows the interfaces (engine/device: 1500 -> 1024, lo
  // alone -> 4096; unit-tested there): a valid IB MTU, at most max_mtu.
  EXPECT_GE(p.active_mtu, IBV_MTU_256);
  EXPECT_LE(p.active_mtu, p.max_mtu);
  EXPECT_EQ(p.gid_tbl_len, limits::kGidTableLen);
  EXPECT_EQ(p.max_msg_sz, limits::kMaxMsgSize);
  EXPECT_EQ(p.pkey_tbl_len, limits::kMaxPkeys);
  EXPECT_EQ(p.lid, 0);
  EXPECT_EQ(p.sm_lid, 0);
  EXPECT_EQ(p.lmc, 0);
  EXPECT_EQ(p.active_width, 2);   // 4X
  EXPECT_EQ(p.active_speed, 32);  // 25 Gb/s
  EXPECT_EQ(p.phys_state, 5);     // LinkUp
  EXPECT_EQ(p.link_layer, IBV_LINK_LAYER_ETHERNET);
  EXPECT_TRUE(p.port_cap_flags & IBV_PORT_CM_SUP);
}

TEST_F(DeviceQuery, QueryPortInline) {
  ibv_port_attr port;
  std::memset(&port, 0xab, sizeof port);
  ASSERT_EQ(ibv_query_port(ctx_, 1, &port), 0);
  expect_port_attr(port);
  EXPECT_EQ(port.port_cap_flags2, 0);

  // pyverbs test_query_port_bad_flow: a port that does not exist is EINVAL.
  EXPECT_EQ(ibv_query_port(ctx_, 0, &port), EINVAL);
  EXPECT_EQ(ibv_query_port(ctx_, 2, &port), EINVAL);
  EXPECT_EQ(ibv_query_port(ctx_, 11, &port), EINVAL);
}

TEST_F(DeviceQuery, QueryPortCompatSymbolWrites48Bytes) {
  struct {
    ibv_port_attr attr;
    unsigned char tail[8];
  } buf;
  std::memset(&buf, 0xab, sizeof buf);
  // The parentheses bypass the inline wrapper macro: ibv_query_port@IBVERBS_1.1 itself.
  ASSERT_EQ((ibv_query_port)(ctx_, 1, reinterpret_cast<_compat_ibv_port_attr*>(&buf.attr)), 0);
  const auto* bytes = reinterpret_cast<const unsigned char*>(&buf);
  const size_t compat_size = offsetof(ibv_port_attr, port_cap_flags2);
  ASSERT_EQ(compat_size, 48u);
  for (size_t i = compat_size; i < sizeof buf; ++i) ASSERT_EQ(bytes[i], 0xab) << "byte " << i;
  ibv_port_attr copy{};
  std::memcpy(&copy, &buf.attr, compat_size);
  expect_port_attr(copy);

  EXPECT_EQ((ibv_query_port)(ctx_, 2, reinterpret_cast<_compat_ibv_port_attr*>(&buf.attr)), EINVAL);
}

TEST_F(DeviceQuery, QueryPortOpHonoursLength) {
  verbs_context* vctx = verbs_get_ctx_op(ctx_, query_port);
  ASSERT_NE(vctx, nullptr);
  unsigned char buf[96];
  std::memset(buf, 0xab, sizeof buf);
  ASSERT_EQ(vctx->query_port(ctx_, 1, reinterpret_cast<ibv_port_attr*>(buf), 20), 0);
  for (size_t i = 20; i < sizeof buf; ++i) ASSERT_EQ(buf[i], 0xab) << "byte " << i;
  ibv_port_attr head{};
  std::memcpy(&head, buf, 20);
  EXPECT_EQ(head.state, IBV_PORT_ACTIVE);
  EXPECT_EQ(head.gid_tbl_len, limits::kGidTableLen);

  // A larger (newer) struct: the fields past ours read as zero.
  std::memset(buf, 0xab, sizeof buf);
  ASSERT_EQ(vctx->query_port(ctx_, 1, reinterpret_cast<ibv_port_attr*>(buf), 64), 0);
  for (size_t i = sizeof(ibv_port_attr); i < 64; ++i) ASSERT_EQ(buf[i], 0) << "byte " << i;
  for (size_t i = 64; i < sizeof buf; ++i) ASSERT_EQ(buf[i], 0xab) << "byte " << i;
  EXPECT_EQ(vctx->query_port(ctx_, 3, reinterpret_cast<ibv_port_attr*>(buf), sizeof(ibv_port_attr)), EINVAL);
}

TEST_F(DeviceQuery, QueryGid) {
  ibv_gid gid;
  ASSERT_EQ(ibv_query_gid(ctx_, 1, 0, &gid), 0);
  EXPECT_FALSE(is_zero(gid));
  EXPECT_GE(localhost_gid_index(), 0) << "no ::ffff:127.0.0.1 in the GID table";

  const int empty = first_empty_gid_index();
  ASSERT_GT(empty, 0);
  std::memset(&gid, 0xab, sizeof gid);
  EXPECT_EQ(ibv_query_gid(ctx_, 1, empty, &gid), 0);  // empty index: success, zero GID
  EXPECT_TRUE(is_zero(gid));

  errno = 0;
  EXPECT_EQ(ibv_query_gid(ctx_, 1, limits::kGidTableLen, &gid), -1);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_query_gid(ctx_, 1, -1, &gid), -1);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_query_gid(ctx_, 2, 0, &gid), -1);
  EXPECT_EQ(errno, EINVAL);
}

TEST_F(DeviceQuery, QueryGidEx) {
  ibv_gid_entry entry;
  std::memset(&entry, 0xab, sizeof entry);
  const int localhost = localhost_gid_index();
  ASSERT_GE(localhost, 0);
  ASSERT_EQ(ibv_query_gid_ex(ctx_, 1, static_cast<uint32_t>(localhost), &entry, 0), 0);
  EXPECT_EQ(std::memcmp(entry.gid.raw, kLocalhostGid.data(), 16), 0);
  EXPECT_EQ(entry.gid_index, static_cast<uint32_t>(localhost));
  EXPECT_EQ(entry.port_num, 1u);
  EXPECT_EQ(entry.gid_type, static_cast<uint32_t>(IBV_GID_TYPE_ROCE_V2));

  // pyverbs test_query_gid_ex_bad_flow: an empty index is ENODATA.
  const int empty = first_empty_gid_index();
  ASSERT_GT(empty, 0);
  EXPECT_EQ(ibv_query_gid_ex(ctx_, 1, static_cast<uint32_t>(empty), &entry, 0), ENODATA);

  EXPECT_EQ(ibv_query_gid_ex(ctx_, 1, static_cast<uint32_t>(limits::kGidTableLen), &entry, 0), EINVAL);
  EXPECT_EQ(ibv_query_gid_ex(ctx_, 2, 0, &entry, 0), EINVAL);
  EXPECT_EQ(ibv_query_gid_ex(ctx_, 1, 0, &entry, 1), EINVAL);  // no flags are defined

  // entry_size: too small is EINVAL, a larger (newer) struct gets zeros past ours.
  EXPECT_EQ(_ibv_query_gid_ex(ctx_, 1, 0, &entry, 0, sizeof entry - 1), EINVAL);
  struct {
    ibv_gid_entry entry;
    unsigned char tail[16];
  } big;
  std::memset(&big, 0xab, sizeof big);
  ASSERT_EQ(_ibv_query_gid_ex(ctx_, 1, 0, &big.entry, 0, sizeof big.entry + 8), 0);
  EXPECT_EQ(big.entry.gid_index, 0u);
  for (size_t i = 0; i < 8; ++i) ASSERT_EQ(big.tail[i], 0) << "tail byte " << i;
  for (size_t i = 8; i < sizeof big.tail; ++i) ASSERT_EQ(big.tail[i], 0xab) << "tail byte " << i;
}

TEST_F(DeviceQuery, QueryGidTable) {
  std::vector<ibv_gid_entry> entries(limits::kGidTableLen);
  const ssize_t n = ibv_query_gid_table(ctx_, entries.data(), entries.size(), 0);
  ASSERT_GE(n, 1);
  ASSERT_LE(n, limits::kGidTableLen);
  const int localhost = localhost_gid_index();
  ASSERT_GE(localhost, 0);
  ASSERT_LT(localhost, n);
  EXPECT_EQ(std::memcmp(entries[static_cast<size_t>(localhost)].gid.raw, kLocalhostGid.data(), 16), 0);
  for (ssize_t i = 0; i < n; ++i) {
    const ibv_gid_entry& e = entries[static_cast<size_t>(i)];
    EXPECT_FALSE(is_zero(e.gid));
    EXPECT_EQ(e.port_num, 1u);
    EXPECT_EQ(e.gid_type, static_cast<uint32_t>(IBV_GID_TYPE_ROCE_V2));
    ibv_gid gid;
    ASSERT_EQ(ibv_query_gid(ctx_, 1, static_cast<int>(e.gid_index), &gid), 0);
    EXPECT_EQ(std::memcmp(&gid, &e.gid, sizeof gid), 0);
    ibv_gid_entry one;
    ASSERT_EQ(ibv_query_gid_ex(ctx_, 1, e.gid_index, &one, 0), 0);
    EXPECT_EQ(std::memcmp(&one, &e, sizeof one), 0);
  }

  // pyverbs test_query_gid_table_bad_flow: too small a buffer is -EINVAL.
  EXPECT_EQ(ibv_query_gid_table(ctx_, entries.data(), 0, 0), -EINVAL);
  if (n > 1) {
    EXPECT_EQ(ibv_query_gid_table(ctx_, entries.data(), static_cast<size_t>(n - 1), 0), -EINVAL);
  }
  EXPECT_EQ(ibv_query_gid_table(ctx_, entries.data(), entries.size(), 1), -EINVAL);

  // A larger entry_size strides through the caller's array.
  constexpr size_t kStride = sizeof(ibv_gid_entry) + 8;
  std::vector<unsigned char> wide(kStride * limits::kGidTableLen, 0xab);
  ASSERT_EQ(_ibv_query_gid_table(ctx_, reinterpret_cast<ibv_gid_entry*>(wide.data()), limits::kGidTableLen, 0,
                                 kStride),
            n);
  for (ssize_t i = 0; i < n; ++i) {
    ibv_gid_entry e;
    std::memcpy(&e, wide.data() + static_cast<size_t>(i) * kStride, sizeof e);
    EXPECT_EQ(std::memcmp(&e, &entries[static_cast<size_t>(i)], sizeof e), 0);
    for (size_t b = sizeof e; b < kStride; ++b) ASSERT_EQ(wide[static_cast<size_t>(i) * kStride + b], 0);
  }
}

TEST_F(DeviceQuery, QueryGidType) {
  test_gid_type_sysfs type = kSysfsIbRoceV1;
  ASSERT_EQ(ibv_query_gid_type(ctx_, 1, 0, &type), 0);
  EXPECT_EQ(type, kSysfsRoceV2);
  const int empty = first_empty_gid_index();
  ASSERT_GT(empty, 0);
  type = kSysfsRoceV2;
  ASSERT_EQ(ibv_query_gid_type(ctx_, 1, static_cast<unsigned>(empty), &type), 0);
  EXPECT_EQ(type, kSysfsIbRoceV1);  // an empty GID reports type 0
  errno = 0;
  EXPECT_EQ(ibv_query_gid_type(ctx_, 2, 0, &type), -1);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_query_gid_type(ctx_, 1, static_cast<unsigned>(limits::kGidTableLen), &type), -1);
  EXPECT_EQ(errno, EINVAL);
}

TEST_F(DeviceQuery, QueryPkey) {
  __be16 pkey = 0;
  ASSERT_EQ(ibv_query_pkey(ctx_, 1, 0, &pkey), 0);
  EXPECT_EQ(be16toh(pkey), 0xffff);
  errno = 0;
  EXPECT_EQ(ibv_query_pkey(ctx_, 1, limits::kMaxPkeys, &pkey), -1);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_query_pkey(ctx_, 2, 0, &pkey), -1);
  EXPECT_EQ(errno, EINVAL);

  EXPECT_EQ(ibv_get_pkey_index(ctx_, 1, htobe16(0xffff)), 0);
  errno = 0;
  EXPECT_EQ(ibv_get_pkey_index(ctx_, 1, htobe16(0x7fff)), -1);
  EXPECT_EQ(errno, ENOENT);
  errno = 0;
  EXPECT_EQ(ibv_get_pkey_index(ctx_, 2, htobe16(0xffff)), -1);
  EXPECT_EQ(errno, EINVAL);
}

}  // namespace
