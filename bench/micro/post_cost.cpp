// Benchmark, not a test: what one operation costs the initiator on the
// one-host path, without the cache-line transfers of a ping-pong. A forked
// child opens its own context and registers a buffer, then only waits; the
// parent posts into it through the public verbs API and polls its own CQ.
// Since nobody else touches the lines involved, the time per operation is
// the instructions and atomics of post + execute + poll: the part of
// ib_write_lat and of ib_write_bw's message rate that softhca itself adds.
//
//   softhca_post_cost [google-benchmark flags, e.g. --benchmark_min_time=1s]
//   (run it on softhca: LD_LIBRARY_PATH=build/lib, or softhca run --no-devices --)
#include <benchmark/benchmark.h>
#include <infiniband/verbs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "verbs_side.hpp"

namespace {

using bench::die;
using bench::Endpoint;
using bench::Side;

Side* g_side = nullptr;
Endpoint g_peer{};

// Posts `wr` signaled and waits for its completion.
void post_and_complete(benchmark::State& state, ibv_send_wr& wr) {
  ibv_wc wc{};
  for (auto _ : state) {
    ibv_send_wr* bad = nullptr;
    if (ibv_post_send(g_side->qp, &wr, &bad) != 0) {
      state.SkipWithError("ibv_post_send failed");
      return;
    }
    int got = 0;
    while ((got = ibv_poll_cq(g_side->cq, 1, &wc)) == 0) {
    }
    if (got < 0 || wc.status != IBV_WC_SUCCESS) {
      state.SkipWithError("completion with an error");
      return;
    }
  }
}

// A signaled work request on the peer's buffer: `bytes` from ours (an 8-byte
// operand for atomics).
ibv_send_wr work_request(ibv_wr_opcode opcode, unsigned flags, ibv_sge& sge, uint32_t bytes) {
  sge = ibv_sge{reinterpret_cast<uint64_t>(g_side->buffer), bytes, g_side->mr->lkey};
  ibv_send_wr wr{};
  wr.opcode = opcode;
  wr.send_flags = IBV_SEND_SIGNALED | flags;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  if (opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
    wr.wr.atomic.remote_addr = g_peer.addr;
    wr.wr.atomic.rkey = g_peer.rkey;
    wr.wr.atomic.compare_add = 1;
  } else {
    wr.wr.rdma.remote_addr = g_peer.addr;
    wr.wr.rdma.rkey = g_peer.rkey;
  }
  return wr;
}

void rdma_write_inline(benchmark::State& state) {
  ibv_sge sge;
  ibv_send_wr wr = work_request(IBV_WR_RDMA_WRITE, IBV_SEND_INLINE, sge, static_cast<uint32_t>(state.range(0)));
  post_and_complete(state, wr);
}

void rdma_write(benchmark::State& state) {
  ibv_sge sge;
  ibv_send_wr wr = work_request(IBV_WR_RDMA_WRITE, 0, sge, static_cast<uint32_t>(state.range(0)));
  post_and_complete(state, wr);
}

void rdma_read(benchmark::State& state) {
  ibv_sge sge;
  ibv_send_wr wr = work_request(IBV_WR_RDMA_READ, 0, sge, static_cast<uint32_t>(state.range(0)));
  post_and_complete(state, wr);
}

void fetch_add(benchmark::State& state) {
  ibv_sge sge;
  ibv_send_wr wr = work_request(IBV_WR_ATOMIC_FETCH_AND_ADD, 0, sge, 8);
  post_and_complete(state, wr);
}

// The post alone, as the critical path of a ping-pong sees it: until the
// data is stored, with no completion per operation (one in 64 is signaled
// and polled, so that the send queue drains).
void rdma_write_inline_unsignaled(benchmark::State& state) {
  ibv_sge sge;
  ibv_send_wr wr = work_request(IBV_WR_RDMA_WRITE, IBV_SEND_INLINE, sge, static_cast<uint32_t>(state.range(0)));
  ibv_send_wr last = wr;
  wr.send_flags &= ~static_cast<unsigned>(IBV_SEND_SIGNALED);
  ibv_wc wc{};
  unsigned n = 0;
  for (auto _ : state) {
    ibv_send_wr* bad = nullptr;
    const bool signaled = ++n % 64 == 0;
    if (ibv_post_send(g_side->qp, signaled ? &last : &wr, &bad) != 0) {
      state.SkipWithError("ibv_post_send failed");
      return;
    }
    if (!signaled) continue;
    int got = 0;
    while ((got = ibv_poll_cq(g_side->cq, 1, &wc)) == 0) {
    }
    if (got < 0 || wc.status != IBV_WC_SUCCESS) {
      state.SkipWithError("completion with an error");
      return;
    }
  }
}

// An empty CQ polled: one turn of the loop a ping-pong spins in while it
// waits. The longer the turn, the later, on average, a waiting side sees the
// completion that arrived during it.
void poll_empty(benchmark::State& state) {
  ibv_wc wc{};
  for (auto _ : state) {
    if (ibv_poll_cq(g_side->cq, 1, &wc) != 0) {
      state.SkipWithError("the cq was not empty");
      return;
    }
  }
}

// One turn of ib_send_lat's loop, both ends in this process (two contexts,
// QPs connected to each other): a receive posted, an inline signaled SEND
// posted into it, the SEND's completion and the receive's polled. No line
// crosses to another core, so this is the instructions a SEND ping-pong
// adds on each side between one message's arrival and the next one's.
void send_recv(benchmark::State& state) {
  static Side sender, receiver;
  static bool connected = false;
  if (!connected) {
    sender.connect(receiver.endpoint());
    receiver.connect(sender.endpoint());
    connected = true;
  }
  const auto bytes = static_cast<uint32_t>(state.range(0));
  ibv_sge send_sge{reinterpret_cast<uint64_t>(sender.buffer), bytes, sender.mr->lkey};
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  wr.sg_list = &send_sge;
  wr.num_sge = 1;
  ibv_sge recv_sge{reinterpret_cast<uint64_t>(receiver.buffer), bench::kBuffer, receiver.mr->lkey};
  ibv_recv_wr rwr{};
  rwr.sg_list = &recv_sge;
  rwr.num_sge = 1;
  ibv_wc wc{};
  for (auto _ : state) {
    ibv_recv_wr* bad_recv = nullptr;
    ibv_send_wr* bad = nullptr;
    if (ibv_post_recv(receiver.qp, &rwr, &bad_recv) != 0 || ibv_post_send(sender.qp, &wr, &bad) != 0) {
      state.SkipWithError("ibv_post_recv or ibv_post_send failed");
      return;
    }
    for (ibv_cq* cq : {sender.cq, receiver.cq}) {
      int got = 0;
      while ((got = ibv_poll_cq(cq, 1, &wc)) == 0) {
      }
      if (got < 0 || wc.status != IBV_WC_SUCCESS) {
        state.SkipWithError("completion with an error");
        return;
      }
    }
  }
}

// The control path, where keys and QPNs are drawn (getrandom, issue #40):
// registering and deregistering a 4 KiB buffer, and creating and destroying
// an RC QP.
void reg_dereg_mr(benchmark::State& state) {
  static char page[4096];
  for (auto _ : state) {
    ibv_mr* mr = ibv_reg_mr(g_side->pd, page, sizeof page, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (mr == nullptr || ibv_dereg_mr(mr) != 0) {
      state.SkipWithError("ibv_reg_mr or ibv_dereg_mr failed");
      return;
    }
  }
}

void create_destroy_qp(benchmark::State& state) {
  ibv_qp_init_attr init{};
  init.send_cq = g_side->cq;
  init.recv_cq = g_side->cq;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = 16;
  init.cap.max_recv_wr = 16;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  for (auto _ : state) {
    ibv_qp* qp = ibv_create_qp(g_side->pd, &init);
    if (qp == nullptr || ibv_destroy_qp(qp) != 0) {
      state.SkipWithError("ibv_create_qp or ibv_destroy_qp failed");
      return;
    }
  }
}

BENCHMARK(rdma_write_inline)->Arg(2)->Arg(64);
BENCHMARK(rdma_write_inline_unsignaled)->Arg(2);
BENCHMARK(rdma_write)->Arg(2)->Arg(64)->Arg(4096);
BENCHMARK(rdma_read)->Arg(2);
BENCHMARK(fetch_add);
BENCHMARK(poll_empty);
BENCHMARK(send_recv)->Arg(2);
BENCHMARK(reg_dereg_mr);
BENCHMARK(create_destroy_qp);

}  // namespace

int main(int argc, char** argv) {
  int to_child[2], to_parent[2];
  if (pipe(to_child) != 0 || pipe(to_parent) != 0) die("pipe");
  const pid_t child = fork();
  if (child < 0) die("fork");
  if (child == 0) {
    close(to_child[1]);  // else the read below never sees the parent's end close
    close(to_parent[0]);
    // The target: its own context and MR, connected back, then idle until
    // the parent closes the pipe.
    Side target;
    Endpoint mine = target.endpoint(), peer{};
    if (read(to_child[0], &peer, sizeof peer) != sizeof peer) _exit(2);
    target.connect(peer);
    if (write(to_parent[1], &mine, sizeof mine) != sizeof mine) _exit(3);
    char byte;
    while (read(to_child[0], &byte, 1) > 0) {
    }
    _exit(0);
  }
  close(to_child[0]);
  close(to_parent[1]);
  Side initiator;
  const Endpoint mine = initiator.endpoint();
  if (write(to_child[1], &mine, sizeof mine) != sizeof mine) die("write to the target");
  if (read(to_parent[0], &g_peer, sizeof g_peer) != sizeof g_peer) die("read from the target");
  initiator.connect(g_peer);
  g_side = &initiator;
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  close(to_child[1]);
  int status = 0;
  waitpid(child, &status, 0);
  return 0;
}
