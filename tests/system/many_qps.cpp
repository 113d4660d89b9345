// many_qps: N RC QPs live at once between two hosts, with checked traffic on
// every one of them, and what an idle QP costs in memory (issue #42: the
// kernel's Soft-RoCE has been reported to stop around 1,000 connections).
// Plain verbs C API and an out-of-band TCP exchange, as ibv_rc_pingpong, so
// it runs on any libibverbs.
//
//   many_qps --server [options]            the responder
//   many_qps [options] ADDRESS             the requester
//
// Each side opens the device, one PD, one CQ and one buffer of
// N x ROUNDS x SIZE bytes, creates N RC QPs, and prints what the QPs cost:
// the growth of its resident memory (shared segments included) from before
// the first QP to after the last one reached RTS, per QP. Then, ROUNDS
// times, the client RDMA-WRITEs SIZE bytes of a pattern of (QP, round) into
// the server's slot for that QP and round and SENDs the pair on the same
// QP; the server takes each SEND and checks the slot it names, byte by
// byte (RC orders the WRITE before the SEND). Every completion must be a
// success. The client ends with "many_qps: N QPs, R rounds, M messages
// checked by the server" and exits 0 only when the server checked all of
// them; the server exits 0 likewise.
//
// Options: --qps N (1000), --rounds R (4), --size BYTES (1024), --port P
// (18515), --gid-index G (0), --timeout S (120).
#include <infiniband/verbs.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "integrity/oob.hpp"

namespace {

using integrity::Channel;
using integrity::Clock;
using integrity::Msg;
using integrity::MsgType;

struct Options {
  bool server = false;
  std::string address;
  uint32_t qps = 1000;
  uint32_t rounds = 4;
  uint32_t size = 1024;
  uint16_t port = 18515;
  int gid_index = 0;
  int timeout_s = 120;
};

void usage(FILE* to) {
  std::fputs(
      "usage: many_qps --server [options]  |  many_qps [options] ADDRESS\n"
      "options: --qps N (1000)  --rounds R (4)  --size BYTES (1024)  --port P (18515)\n"
      "         --gid-index G (0)  --timeout S (120)\n",
      to);
}

// Resident memory of this process in KiB (VmRSS: anonymous, file and
// shared pages it has touched).
long resident_kib() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "VmRSS:") {
      long kib = 0;
      status >> kib;
      return kib;
    }
    status.ignore(4096, '\n');
  }
  return -1;
}

uint8_t pattern(uint32_t qp, uint32_t round, uint32_t i) {
  return static_cast<uint8_t>((qp * 131u) ^ (round * 29u) ^ (i * 7u) ^ (i >> 8));
}

[[noreturn]] void die(const std::string& what) {
  std::printf("many_qps: %s\n", what.c_str());
  std::exit(1);
}

struct Side {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_mr* mr = nullptr;
  std::vector<uint8_t> buffer;
  std::vector<ibv_qp*> qps;
  ibv_gid gid{};
  ibv_mtu mtu = IBV_MTU_1024;
};

Side open_side(const Options& o) {
  Side s;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr || n == 0) die("no RDMA device");
  s.ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  if (s.ctx == nullptr) die("cannot open the device");
  ibv_port_attr port{};
  if (ibv_query_port(s.ctx, 1, &port) != 0) die("ibv_query_port failed");
  s.mtu = port.active_mtu;
  if (ibv_query_gid(s.ctx, 1, o.gid_index, &s.gid) != 0) die("ibv_query_gid failed");
  s.pd = ibv_alloc_pd(s.ctx);
  // Every QP's sends (client) or receives (server) of one round at most are
  // outstanding at once: two sends per QP per round on the client.
  s.cq = ibv_create_cq(s.ctx, static_cast<int>(2 * o.qps + 16), nullptr, nullptr, 0);
  if (s.pd == nullptr || s.cq == nullptr) die("cannot create the PD or the CQ");
  s.buffer.assign(size_t{o.qps} * o.rounds * o.size, 0);
  s.mr = ibv_reg_mr(s.pd, s.buffer.data(), s.buffer.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (s.mr == nullptr) die(std::string("ibv_reg_mr: ") + std::strerror(errno));
  return s;
}

void close_side(Side& s, ibv_mr* words_mr) {
  for (ibv_qp* qp : s.qps) ibv_destroy_qp(qp);
  ibv_dereg_mr(words_mr);
  ibv_dereg_mr(s.mr);
  ibv_destroy_cq(s.cq);
  ibv_dealloc_pd(s.pd);
  ibv_close_device(s.ctx);
}

void create_qps(Side& s, const Options& o) {
  for (uint32_t i = 0; i < o.qps; ++i) {
    ibv_qp_init_attr init{};
    init.send_cq = s.cq;
    init.recv_cq = s.cq;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = 2 * o.rounds;
    init.cap.max_recv_wr = o.rounds;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    ibv_qp* qp = ibv_create_qp(s.pd, &init);
    if (qp == nullptr) die("ibv_create_qp failed at QP " + std::to_string(i) + ": " + std::strerror(errno));
    s.qps.push_back(qp);
  }
}

// The n-th QP's number and first PSN, 16 QPs per frame, then the GID and
// the buffer.
void send_endpoints(Channel& ch, const Side& s, const Options& o) {
  Msg hello;
  hello.type = MsgType::kHello;
  hello.w[0] = o.qps;
  std::memcpy(&hello.w[1], s.gid.raw, 16);
  hello.w[3] = reinterpret_cast<uint64_t>(s.buffer.data());
  hello.w[4] = s.mr->rkey;
  hello.w[5] = static_cast<uint64_t>(s.mtu);
  if (auto e = ch.send(hello); !e.empty()) die("oob: " + e);
  for (uint32_t i = 0; i < o.qps; i += Msg::kWords) {
    Msg m;
    m.type = MsgType::kReady;
    for (uint32_t k = 0; k < Msg::kWords && i + k < o.qps; ++k) m.w[k] = s.qps[i + k]->qp_num;
    if (auto e = ch.send(m); !e.empty()) die("oob: " + e);
  }
}

struct Remote {
  ibv_gid gid{};
  uint64_t addr = 0;
  uint32_t rkey = 0;
  ibv_mtu mtu = IBV_MTU_1024;
  std::vector<uint32_t> qpns;
};

Remote receive_endpoints(Channel& ch, const Options& o, Clock::time_point deadline) {
  Remote r;
  auto hello = ch.recv(deadline);
  if (!hello || hello->type != MsgType::kHello)
    die("oob: no hello: " + (hello ? std::string("wrong frame") : hello.error()));
  if (hello->w[0] != o.qps) die("the peer has " + std::to_string(hello->w[0]) + " QPs, not " + std::to_string(o.qps));
  std::memcpy(r.gid.raw, &hello->w[1], 16);
  r.addr = hello->w[3];
  r.rkey = static_cast<uint32_t>(hello->w[4]);
  r.mtu = static_cast<ibv_mtu>(hello->w[5]);
  while (r.qpns.size() < o.qps) {
    auto m = ch.recv(deadline);
    if (!m || m->type != MsgType::kReady) die("oob: no QP numbers");
    for (uint32_t k = 0; k < Msg::kWords && r.qpns.size() < o.qps; ++k)
      r.qpns.push_back(static_cast<uint32_t>(m->w[k]));
  }
  return r;
}

constexpr uint32_t kFirstPsn = 0x100;

void connect_qps(Side& s, const Remote& r, const Options& o) {
  ibv_ah_attr av{};
  av.is_global = 1;
  av.grh.dgid = r.gid;
  av.grh.sgid_index = static_cast<uint8_t>(o.gid_index);
  av.grh.hop_limit = 64;
  av.port_num = 1;
  for (uint32_t i = 0; i < o.qps; ++i) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    if (ibv_modify_qp(s.qps[i], &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0)
      die("modify to INIT failed at QP " + std::to_string(i));
    a = {};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = std::min(s.mtu, r.mtu);
    a.dest_qp_num = r.qpns[i];
    a.rq_psn = kFirstPsn;
    a.ah_attr = av;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    if (ibv_modify_qp(s.qps[i], &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0)
      die("modify to RTR failed at QP " + std::to_string(i));
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = kFirstPsn;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    if (ibv_modify_qp(s.qps[i], &a,
                      IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                          IBV_QP_MAX_QP_RD_ATOMIC) != 0)
      die("modify to RTS failed at QP " + std::to_string(i));
  }
}

// Takes `n` completions from the CQ, each a success, or dies naming the first that is not.
void take_completions(ibv_cq* cq, size_t n, Clock::time_point deadline, std::vector<ibv_wc>* keep) {
  size_t got = 0;
  while (got < n) {
    ibv_wc wc[32];
    const int k = ibv_poll_cq(cq, 32, wc);
    if (k < 0) die("ibv_poll_cq failed");
    for (int j = 0; j < k; ++j) {
      if (wc[j].status != IBV_WC_SUCCESS)
        die("completion of wr_id " + std::to_string(wc[j].wr_id) + ": " + ibv_wc_status_str(wc[j].status));
      if (keep != nullptr) keep->push_back(wc[j]);
    }
    got += static_cast<size_t>(k);
    if (k == 0) {
      if (Clock::now() > deadline)
        die("only " + std::to_string(got) + " of " + std::to_string(n) + " completions in time");
      usleep(50);
    }
  }
}

void report_memory(const Options& o, long before_kib, long after_kib) {
  const long grew = after_kib - before_kib;
  std::printf("many_qps: %u QPs in RTS; resident memory grew by %ld KiB, %.1f KiB per QP\n", o.qps, grew,
              static_cast<double>(grew) / o.qps);
}

int run_server(const Options& o) {
  const auto deadline = Clock::now() + std::chrono::seconds(o.timeout_s);
  Side s = open_side(o);
  const long before = resident_kib();
  create_qps(s, o);
  std::vector<uint64_t> words(size_t{o.qps} * o.rounds);
  std::printf("many_qps: listening on TCP %u\n", o.port);
  std::fflush(stdout);
  auto ch = integrity::accept_one(o.port, deadline);
  if (!ch) die("oob: " + ch.error());
  send_endpoints(*ch, s, o);
  const Remote r = receive_endpoints(*ch, o, deadline);
  connect_qps(s, r, o);
  report_memory(o, before, resident_kib());
  // Every SEND lands in one 8-byte word of its own.
  ibv_mr* words_mr = ibv_reg_mr(s.pd, words.data(), words.size() * 8, IBV_ACCESS_LOCAL_WRITE);
  if (words_mr == nullptr) die("ibv_reg_mr for the receives failed");
  for (uint32_t i = 0; i < o.qps; ++i) {
    for (uint32_t round = 0; round < o.rounds; ++round) {
      const size_t at = size_t{i} * o.rounds + round;
      ibv_sge sge{reinterpret_cast<uint64_t>(&words[at]), 8, words_mr->lkey};
      ibv_recv_wr wr{};
      wr.wr_id = at;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      ibv_recv_wr* bad = nullptr;
      if (ibv_post_recv(s.qps[i], &wr, &bad) != 0) die("ibv_post_recv failed at QP " + std::to_string(i));
    }
  }
  Msg go;
  go.type = MsgType::kCase;
  if (auto e = ch->send(go); !e.empty()) die("oob: " + e);
  // The receives of QP i complete in its rounds' order; each names its (QP, round).
  std::vector<ibv_wc> wcs;
  uint64_t checked = 0;
  for (uint32_t round = 0; round < o.rounds; ++round) {
    wcs.clear();
    take_completions(s.cq, o.qps, deadline, &wcs);
    for (const ibv_wc& wc : wcs) {
      const uint64_t word = words[wc.wr_id];
      const uint32_t qp = static_cast<uint32_t>(word >> 32), rd = static_cast<uint32_t>(word);
      if (wc.opcode != IBV_WC_RECV || wc.byte_len != 8 || qp != wc.wr_id / o.rounds || rd != wc.wr_id % o.rounds ||
          wc.qp_num != s.qps[qp]->qp_num)
        die("receive " + std::to_string(wc.wr_id) + " names QP " + std::to_string(qp) + " round " + std::to_string(rd));
      const uint8_t* slot = s.buffer.data() + (size_t{qp} * o.rounds + rd) * o.size;
      for (uint32_t b = 0; b < o.size; ++b)
        if (slot[b] != pattern(qp, rd, b))
          die("QP " + std::to_string(qp) + " round " + std::to_string(rd) + ": byte " + std::to_string(b) +
              " is wrong");
      ++checked;
    }
  }
  Msg done;
  done.type = MsgType::kSummary;
  done.w[0] = checked;
  if (auto e = ch->send(done); !e.empty()) die("oob: " + e);
  std::printf("many_qps: checked %" PRIu64 " messages on %u QPs, all correct\n", checked, o.qps);
  // The client tears down after it has the summary.
  auto bye = ch->recv(deadline);
  close_side(s, words_mr);
  return checked == uint64_t{o.qps} * o.rounds ? 0 : 1;
}

int run_client(const Options& o) {
  const auto deadline = Clock::now() + std::chrono::seconds(o.timeout_s);
  Side s = open_side(o);
  const long before = resident_kib();
  create_qps(s, o);
  auto ch = integrity::connect_to(o.address, o.port, deadline);
  if (!ch) die("oob: " + ch.error());
  const Remote r = receive_endpoints(*ch, o, deadline);
  send_endpoints(*ch, s, o);
  connect_qps(s, r, o);
  report_memory(o, before, resident_kib());
  for (uint32_t i = 0; i < o.qps; ++i)
    for (uint32_t round = 0; round < o.rounds; ++round) {
      uint8_t* slot = s.buffer.data() + (size_t{i} * o.rounds + round) * o.size;
      for (uint32_t b = 0; b < o.size; ++b) slot[b] = pattern(i, round, b);
    }
  auto go = ch->recv(deadline);  // the server's receives are posted
  if (!go || go->type != MsgType::kCase) die("oob: no go from the server");
  std::vector<uint64_t> words(size_t{o.qps} * o.rounds);
  ibv_mr* words_mr = ibv_reg_mr(s.pd, words.data(), words.size() * 8, IBV_ACCESS_LOCAL_WRITE);
  if (words_mr == nullptr) die("ibv_reg_mr for the sends failed");
  for (uint32_t round = 0; round < o.rounds; ++round) {
    for (uint32_t i = 0; i < o.qps; ++i) {
      const size_t at = size_t{i} * o.rounds + round;
      words[at] = (uint64_t{i} << 32) | round;
      ibv_sge data{reinterpret_cast<uint64_t>(s.buffer.data() + at * o.size), o.size, s.mr->lkey};
      ibv_sge note{reinterpret_cast<uint64_t>(&words[at]), 8, words_mr->lkey};
      ibv_send_wr send{};
      send.wr_id = 2 * at + 1;
      send.sg_list = &note;
      send.num_sge = 1;
      send.opcode = IBV_WR_SEND;
      send.send_flags = IBV_SEND_SIGNALED;
      ibv_send_wr write{};
      write.wr_id = 2 * at;
      write.sg_list = &data;
      write.num_sge = 1;
      write.opcode = IBV_WR_RDMA_WRITE;
      write.send_flags = IBV_SEND_SIGNALED;
      write.wr.rdma.remote_addr = r.addr + at * o.size;
      write.wr.rdma.rkey = r.rkey;
      write.next = &send;
      ibv_send_wr* bad = nullptr;
      if (ibv_post_send(s.qps[i], &write, &bad) != 0) die("ibv_post_send failed at QP " + std::to_string(i));
    }
    take_completions(s.cq, 2 * size_t{o.qps}, deadline, nullptr);
  }
  auto summary = ch->recv(deadline);
  if (!summary || summary->type != MsgType::kSummary) die("oob: no summary from the server");
  const uint64_t checked = summary->w[0];
  std::printf("many_qps: %u QPs, %u rounds, %" PRIu64 " messages checked by the server\n", o.qps, o.rounds, checked);
  Msg bye;
  bye.type = MsgType::kBye;
  ch->send(bye);
  close_side(s, words_mr);
  return checked == uint64_t{o.qps} * o.rounds ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> long {
      if (i + 1 >= argc) {
        usage(stderr);
        std::exit(2);
      }
      return std::strtol(argv[++i], nullptr, 10);
    };
    if (a == "--server") {
      o.server = true;
    } else if (a == "--qps") {
      o.qps = static_cast<uint32_t>(value());
    } else if (a == "--rounds") {
      o.rounds = static_cast<uint32_t>(value());
    } else if (a == "--size") {
      o.size = static_cast<uint32_t>(value());
    } else if (a == "--port") {
      o.port = static_cast<uint16_t>(value());
    } else if (a == "--gid-index") {
      o.gid_index = static_cast<int>(value());
    } else if (a == "--timeout") {
      o.timeout_s = static_cast<int>(value());
    } else if (a == "--help" || a == "-h") {
      usage(stdout);
      return 0;
    } else if (!a.empty() && a[0] != '-' && o.address.empty()) {
      o.address = a;
    } else {
      usage(stderr);
      return 2;
    }
  }
  if (o.qps == 0 || o.rounds == 0 || o.size == 0 || (!o.server && o.address.empty())) {
    usage(stderr);
    return 2;
  }
  return o.server ? run_server(o) : run_client(o);
}
