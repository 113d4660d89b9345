// hostile_peer: the two honest ends of an RC connection that a third host
// on the same Ethernet attacks (tests/system/hostile_host.sh and
// hostile_probe.py): they set it up, tell the driver what an attacker who
// sniffed the handshake would know, wait while the attack runs, and then
// check that nothing the attacker sent reached the server's memory.
//
//   hostile_peer --server --local ADDR --info FILE --go FILE [--port P] [--timeout S]
//   hostile_peer --client SERVER --local ADDR --go FILE [--port P] [--timeout S]
//
// ADDR is this host's IPv4 address: the GID index is the one whose GID is
// ::ffff:ADDR. The two exchange QPNs, PSNs and GIDs over TCP (port P,
// default 18515) and connect two RC QP pairs by hand:
//   main:    the attacked one. The server's 4 KiB MR (REMOTE_WRITE and
//            REMOTE_READ) holds a known pattern.
//   control: a separate pair with a 4 KiB MR of zeros on the server, which
//            the attacker writes with the client's address forged: the
//            positive control that shows its packets are well-formed.
// Once both are in RTS, the server writes one line to FILE (--info):
//   qpn=0x.. client_qpn=0x.. psn=0x.. rkey=0x.. addr=0x..
//   ctl_qpn=0x.. ctl_psn=0x.. ctl_rkey=0x.. ctl_addr=0x..
// (psn: the client's first SQ PSN, which the server's QP expects next) and,
// for the record, the QPNs and rkeys of 4 more QPs and 8 more MRs. Both then
// wait (bounded) for a byte on --go, a FIFO the driver holds open. Then the client RDMA WRITEs
// 64 bytes to offset 0 of the main MR and RDMA READs all 4 KiB of it back:
// both must complete with IBV_WC_SUCCESS and the READ must show the
// client's 64 bytes at 0 and the pattern everywhere else. The server checks
// its own buffer the same way, and its control MR: the two 64-byte control
// writes (P_Key 0xFFFF at offset 0, 0x7FFF at 64) and zeros elsewhere.
// Each exits 0 only when all of its checks hold, and says why otherwise.
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "integrity/oob.hpp"

namespace {

using integrity::Channel;
using integrity::Clock;
using integrity::Msg;
using integrity::MsgType;

constexpr size_t kRegion = 4096;
constexpr size_t kLegitBytes = 64;
constexpr size_t kControlBytes = 64;
constexpr int kExtraQps = 4;
constexpr int kExtraMrs = 8;

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "hostile_peer: %s\n", why.c_str());
  std::exit(1);
}

// The server's pattern: what every byte of the main MR holds until the
// client writes.
uint8_t pattern_at(size_t i) { return static_cast<uint8_t>((i * 13 + 0x5A) & 0xFF); }

// An 8-byte tag repeated over n bytes: the client's data and the control
// writes (hostile_probe.py writes "CTRLFFFF" and "CTRL7FFF").
std::vector<uint8_t> tagged(const char (&tag)[9], size_t n) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(tag[i % 8]);
  return out;
}

std::vector<uint8_t> expected_main() {
  std::vector<uint8_t> want(kRegion);
  for (size_t i = 0; i < kRegion; ++i) want[i] = pattern_at(i);
  const auto legit = tagged("LEGITWR!", kLegitBytes);
  std::memcpy(want.data(), legit.data(), kLegitBytes);
  return want;
}

std::vector<uint8_t> expected_control() {
  std::vector<uint8_t> want(kRegion, 0);
  const auto full = tagged("CTRLFFFF", kControlBytes);
  const auto limited = tagged("CTRL7FFF", kControlBytes);
  std::memcpy(want.data(), full.data(), kControlBytes);
  std::memcpy(want.data() + kControlBytes, limited.data(), kControlBytes);
  return want;
}

// "" when `got` is `want`; otherwise the runs of differing bytes (the first
// few), each with its first bytes as text (the attacker's tags are ASCII).
std::string differences(const uint8_t* got, const std::vector<uint8_t>& want) {
  std::string out;
  size_t runs = 0, bytes = 0;
  for (size_t i = 0; i < want.size();) {
    if (got[i] == want[i]) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < want.size() && got[end] != want[end]) ++end;
    bytes += end - i;
    if (++runs <= 6) {
      char head[64];
      std::snprintf(head, sizeof head, "%s[%zu, %zu) reads '", out.empty() ? "" : "; ", i, end);
      out += head;
      for (size_t k = i; k < std::min(end, i + 16); ++k)
        out += std::isprint(got[k]) ? static_cast<char>(got[k]) : '.';
      out += "'";
    }
    i = end;
  }
  if (runs == 0) return {};
  return std::to_string(bytes) + " bytes differ in " + std::to_string(runs) + (runs == 1 ? " run: " : " runs: ") + out;
}

struct Options {
  bool server = false;
  std::string peer;  // the client's: the server's address
  std::string local;
  std::string info;
  std::string go;
  uint16_t port = 18515;
  int timeout_s = 30;
};

ibv_gid gid_of_ipv4(const std::string& text) {
  ibv_gid gid{};
  in_addr v4{};
  if (inet_pton(AF_INET, text.c_str(), &v4) != 1) die("not an IPv4 address: " + text);
  gid.raw[10] = gid.raw[11] = 0xff;
  std::memcpy(gid.raw + 12, &v4, 4);
  return gid;
}

// One end: the device, its MRs and the two RC QPs.
struct End {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  int gid_index = -1;
  ibv_gid gid{};
  ibv_mtu mtu = IBV_MTU_1024;
  std::vector<uint8_t> main_buf = std::vector<uint8_t>(kRegion);
  std::vector<uint8_t> control_buf = std::vector<uint8_t>(kRegion);
  ibv_mr* main_mr = nullptr;
  ibv_mr* control_mr = nullptr;
  ibv_qp* main_qp = nullptr;
  ibv_qp* control_qp = nullptr;
  uint32_t main_psn = 0, control_psn = 0;

  explicit End(const std::string& local, int access) {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (list == nullptr || n == 0) die("no RDMA device");
    ctx = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    if (ctx == nullptr) die("cannot open the device");
    ibv_port_attr port{};
    if (ibv_query_port(ctx, 1, &port)) die("ibv_query_port");
    mtu = port.active_mtu;
    const ibv_gid want = gid_of_ipv4(local);
    for (int i = 0; i < port.gid_tbl_len && gid_index < 0; ++i) {
      ibv_gid g{};
      if (ibv_query_gid(ctx, 1, i, &g) == 0 && std::memcmp(g.raw, want.raw, 16) == 0) gid_index = i;
    }
    if (gid_index < 0) die("no GID of the device is ::ffff:" + local);
    gid = want;
    pd = ibv_alloc_pd(ctx);
    cq = pd ? ibv_create_cq(ctx, 16, nullptr, nullptr, 0) : nullptr;
    if (cq == nullptr) die("cannot make a PD and CQ");
    main_mr = ibv_reg_mr(pd, main_buf.data(), kRegion, access);
    control_mr = ibv_reg_mr(pd, control_buf.data(), kRegion, access);
    if (main_mr == nullptr || control_mr == nullptr) die("ibv_reg_mr");
    main_qp = make_qp();
    control_qp = make_qp();
    std::random_device entropy;
    main_psn = entropy() & 0xFFFFFF;
    control_psn = entropy() & 0xFFFFFF;
  }

  ibv_qp* make_qp() {
    ibv_qp_init_attr init{};
    init.send_cq = init.recv_cq = cq;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = init.cap.max_recv_wr = 4;
    init.cap.max_send_sge = init.cap.max_recv_sge = 1;
    ibv_qp* qp = ibv_create_qp(pd, &init);
    if (qp == nullptr) die("ibv_create_qp");
    return qp;
  }

  // INIT, RTR towards the peer's QP `dest` whose first PSN is `rq_psn`, RTS.
  void connect(ibv_qp* qp, uint32_t own_psn, uint32_t dest, uint32_t rq_psn, const ibv_gid& peer) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.pkey_index = 0;
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
      die("modify to INIT");
    a = {};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = mtu;
    a.dest_qp_num = dest;
    a.rq_psn = rq_psn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = peer;
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(gid_index);
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = 1;
    if (ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
      die("modify to RTR");
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = own_psn;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    if (ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                          IBV_QP_MAX_QP_RD_ATOMIC))
      die("modify to RTS");
  }
};

Msg hello_of(const End& e) {
  Msg m;
  m.type = MsgType::kHello;
  m.w[0] = e.main_qp->qp_num;
  m.w[1] = e.main_psn;
  m.w[2] = e.control_qp->qp_num;
  m.w[3] = e.control_psn;
  std::memcpy(&m.w[4], e.gid.raw, 16);
  m.w[6] = e.main_mr->rkey;
  m.w[7] = reinterpret_cast<uintptr_t>(e.main_buf.data());
  m.w[8] = e.control_mr->rkey;
  m.w[9] = reinterpret_cast<uintptr_t>(e.control_buf.data());
  return m;
}

Msg expect(Channel& ch, MsgType type, Clock::time_point deadline) {
  auto m = ch.recv(deadline);
  if (!m) die(m.error());
  if (m->type != type) die("unexpected message on the TCP channel");
  return *m;
}

// Blocks until the driver writes a byte to --go, a FIFO it holds open
// (hostile_host.sh): the attack is over. Bounded by the deadline; a driver
// that went away (end of file) is a failure too.
void wait_for_go(const Options& o, Clock::time_point deadline) {
  const int fd = ::open(o.go.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) die("cannot open the go-signal " + o.go);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) die("no go-signal (" + o.go + ") in time");
    pollfd p{fd, POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(left));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) die("poll on the go-signal failed");
    if (n == 0) continue;  // the deadline, checked above
    char byte = 0;
    const ssize_t got = ::read(fd, &byte, 1);
    if (got == 1) break;
    if (got == 0) die("the driver closed the go-signal without a go");
    if (errno != EAGAIN && errno != EINTR) die("cannot read the go-signal");
  }
  ::close(fd);
}

// Posts one signaled RDMA operation and waits (bounded) for its completion.
std::string run_op(End& e, ibv_wr_opcode op, uint8_t* local, uint32_t length, uint64_t remote, uint32_t rkey) {
  ibv_mr* mr = local == e.main_buf.data() ? e.main_mr : e.control_mr;
  ibv_sge sge{reinterpret_cast<uintptr_t>(local), length, mr->lkey};
  ibv_send_wr wr{};
  wr.opcode = op;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = remote;
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  if (int err = ibv_post_send(e.main_qp, &wr, &bad)) return std::string("ibv_post_send: ") + std::strerror(err);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  ibv_wc wc{};
  for (;;) {
    const int n = ibv_poll_cq(e.cq, 1, &wc);
    if (n < 0) return "ibv_poll_cq failed";
    if (n == 1) break;
    if (Clock::now() >= deadline) return "no completion within 10 s";
  }
  if (wc.status != IBV_WC_SUCCESS) return std::string("completion status ") + ibv_wc_status_str(wc.status);
  return {};
}

int run_server(const Options& o) {
  const auto deadline = Clock::now() + std::chrono::seconds(o.timeout_s);
  End e(o.local, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  for (size_t i = 0; i < kRegion; ++i) e.main_buf[i] = pattern_at(i);
  // For the record: the numbers a host hands out, which an attacker who
  // did not see the handshake would have to guess.
  std::vector<ibv_qp*> extra_qps;
  std::string record = "hostile_peer: 4 more QPNs";
  for (int i = 0; i < kExtraQps; ++i) {
    extra_qps.push_back(e.make_qp());
    record += " " + std::to_string(extra_qps.back()->qp_num);
  }
  std::vector<ibv_mr*> extra_mrs;
  record += "; 8 more rkeys";
  for (int i = 0; i < kExtraMrs; ++i) {
    extra_mrs.push_back(ibv_reg_mr(e.pd, e.control_buf.data(), kRegion, IBV_ACCESS_LOCAL_WRITE));
    if (extra_mrs.back() == nullptr) die("ibv_reg_mr");
    char key[16];
    std::snprintf(key, sizeof key, " 0x%08x", extra_mrs.back()->rkey);
    record += key;
  }

  auto ch = integrity::accept_one(o.port, deadline);
  if (!ch) die(ch.error());
  const Msg peer = expect(*ch, MsgType::kHello, deadline);
  ibv_gid peer_gid{};
  std::memcpy(peer_gid.raw, &peer.w[4], 16);
  const auto main_dest = static_cast<uint32_t>(peer.w[0]), main_rq = static_cast<uint32_t>(peer.w[1]);
  const auto ctl_dest = static_cast<uint32_t>(peer.w[2]), ctl_rq = static_cast<uint32_t>(peer.w[3]);
  e.connect(e.main_qp, e.main_psn, main_dest, main_rq, peer_gid);
  e.connect(e.control_qp, e.control_psn, ctl_dest, ctl_rq, peer_gid);
  if (auto err = ch->send(hello_of(e)); !err.empty()) die(err);
  expect(*ch, MsgType::kReady, deadline);  // the client's QPs are in RTS too

  char line[512];
  std::snprintf(line, sizeof line,
                "qpn=0x%06x client_qpn=0x%06x psn=0x%06x rkey=0x%08x addr=0x%llx "
                "ctl_qpn=0x%06x ctl_psn=0x%06x ctl_rkey=0x%08x ctl_addr=0x%llx\n",
                e.main_qp->qp_num, main_dest, main_rq, e.main_mr->rkey,
                static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(e.main_buf.data())), e.control_qp->qp_num,
                ctl_rq, e.control_mr->rkey,
                static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(e.control_buf.data())));
  std::printf("hostile_peer: server %s%s\n", line, record.c_str());
  std::fflush(stdout);
  // --info is a FIFO the driver reads: one write of the whole line.
  FILE* f = std::fopen(o.info.c_str(), "w");
  if (f == nullptr || std::fputs(line, f) < 0 || std::fclose(f) != 0) die("cannot write " + o.info);

  wait_for_go(o, deadline);
  const Msg done = expect(*ch, MsgType::kDone, deadline);
  // The client's writes have completed (it waited for their completions),
  // so the buffer is final.
  int status = 0;
  if (done.w[0] != 1) {
    std::printf("hostile_peer: server: the client failed: %s\n", done.text.c_str());
    status = 1;
  }
  if (auto diff = differences(e.main_buf.data(), expected_main()); !diff.empty()) {
    std::printf("hostile_peer: server: FAIL: the attacked MR is not the pattern plus the client's 64 bytes: %s\n",
                diff.c_str());
    status = 1;
  }
  if (auto diff = differences(e.control_buf.data(), expected_control()); !diff.empty()) {
    std::printf("hostile_peer: server: FAIL: the control MR does not hold exactly the two forged control writes "
                "(the attacker's well-formed packets from the client's address): %s\n",
                diff.c_str());
    status = 1;
  }
  Msg bye;
  bye.type = MsgType::kBye;
  if (auto err = ch->send(bye); !err.empty()) die(err);
  if (status == 0)
    std::printf("hostile_peer: server: the attacked MR holds the pattern and the client's 64 bytes alone; "
                "both control writes landed\n");
  for (ibv_mr* mr : extra_mrs) ibv_dereg_mr(mr);
  for (ibv_qp* qp : extra_qps) ibv_destroy_qp(qp);
  return status;
}

int run_client(const Options& o) {
  const auto deadline = Clock::now() + std::chrono::seconds(o.timeout_s);
  End e(o.local, IBV_ACCESS_LOCAL_WRITE);
  auto ch = integrity::connect_to(o.peer, o.port, deadline);
  if (!ch) die(ch.error());
  if (auto err = ch->send(hello_of(e)); !err.empty()) die(err);
  const Msg server = expect(*ch, MsgType::kHello, deadline);
  ibv_gid server_gid{};
  std::memcpy(server_gid.raw, &server.w[4], 16);
  e.connect(e.main_qp, e.main_psn, static_cast<uint32_t>(server.w[0]), static_cast<uint32_t>(server.w[1]), server_gid);
  e.connect(e.control_qp, e.control_psn, static_cast<uint32_t>(server.w[2]), static_cast<uint32_t>(server.w[3]),
            server_gid);
  Msg ready;
  ready.type = MsgType::kReady;
  if (auto err = ch->send(ready); !err.empty()) die(err);
  const uint64_t remote = server.w[7];
  const auto rkey = static_cast<uint32_t>(server.w[6]);
  std::printf("hostile_peer: client: connected, main QP 0x%06x, first PSN 0x%06x\n", e.main_qp->qp_num, e.main_psn);
  std::fflush(stdout);

  wait_for_go(o, deadline);
  std::string failure;
  const auto legit = tagged("LEGITWR!", kLegitBytes);
  std::memcpy(e.main_buf.data(), legit.data(), kLegitBytes);
  if (auto err = run_op(e, IBV_WR_RDMA_WRITE, e.main_buf.data(), kLegitBytes, remote, rkey); !err.empty())
    failure = "the RDMA WRITE: " + err;
  if (failure.empty()) {
    std::memset(e.main_buf.data(), 0, kRegion);
    if (auto err = run_op(e, IBV_WR_RDMA_READ, e.main_buf.data(), kRegion, remote, rkey); !err.empty())
      failure = "the RDMA READ: " + err;
  }
  if (failure.empty()) {
    if (auto diff = differences(e.main_buf.data(), expected_main()); !diff.empty())
      failure = "the READ of the server's MR is not the pattern plus our 64 bytes: " + diff;
  }
  Msg done;
  done.type = MsgType::kDone;
  done.w[0] = failure.empty() ? 1 : 0;
  done.text = failure;
  if (auto err = ch->send(done); !err.empty()) die(err);
  expect(*ch, MsgType::kBye, deadline);
  if (!failure.empty()) {
    std::printf("hostile_peer: client: FAIL: %s\n", failure.c_str());
    return 1;
  }
  std::printf("hostile_peer: client: WRITE and READ succeeded; the server's MR holds the pattern and our 64 bytes "
              "alone\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  bool client = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--server") {
      o.server = true;
    } else if (a == "--client" && has_value) {
      client = true;
      o.peer = argv[++i];
    } else if (a == "--local" && has_value) {
      o.local = argv[++i];
    } else if (a == "--info" && has_value) {
      o.info = argv[++i];
    } else if (a == "--go" && has_value) {
      o.go = argv[++i];
    } else if (a == "--port" && has_value) {
      o.port = static_cast<uint16_t>(std::atoi(argv[++i]));
    } else if (a == "--timeout" && has_value) {
      o.timeout_s = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: hostile_peer --server --local ADDR --info FILE --go FILE [--port P] [--timeout S]\n"
                   "       hostile_peer --client SERVER --local ADDR --go FILE [--port P] [--timeout S]\n");
      return 2;
    }
  }
  if (o.server == client || o.local.empty() || o.go.empty() || (o.server && o.info.empty()) || o.timeout_s <= 0) {
    std::fprintf(stderr, "hostile_peer: give --server or --client, --local, --go (and --info to the server)\n");
    return 2;
  }
  return o.server ? run_server(o) : run_client(o);
}
