// Benchmark, not a test: the one-way latency of a ping-pong between two
// processes of this host, with nanosecond resolution, in the loops perftest
// runs. perftest reports in steps of 10 ns (13 TSC cycles with -C on the
// 2-core VM), coarser than the changes the one-host path is tuned by; this
// counts whole batches with the monotonic clock and reports the median and
// the fastest batch, and it times every round trip (the TSC) for their
// median, which is what perftest's t_typical and ucx_perftest's p50 are:
// on a VM whose round trips spread, the two differ by a sixth.
//
//   --op write (ib_write_lat's loop): an inline, signaled RDMA WRITE, its
//     completion polled, then the byte the other side writes watched;
//   --op send (ib_send_lat's): 512 receives kept posted on a CQ of their own;
//     the receive completion polled, the receive posted again, an inline
//     signaled SEND posted and its completion polled;
//   --op raw: no verbs, the floor under both: a byte stored into the other
//     side's page of a shared mapping, the byte in one's own page watched
//     (with --pause, by a loop with a PAUSE in it: UCX's perftest watches
//     between progress calls, perftest in a bare loop).
//
//   pingpong [--op write|send|raw] [--iters N] [--batch N] [--size BYTES] [--cores A,B]
//            [--signal-every N]
//   (on softhca: LD_LIBRARY_PATH=build/lib, or softhca run --no-devices --)
//
// --cores pins the forked responder to core A and the initiator to core B.
// --signal-every N (WRITE only): only every Nth WRITE is signaled and its
// completion polled (perftest's --cq-mod), to tell what the completion's
// push and poll add to the round trip from what the WRITE itself costs.
#include <infiniband/verbs.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "verbs_side.hpp"

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace {

using bench::die;
using bench::Endpoint;
using bench::Side;

enum class Op { kWrite, kSend, kRaw };

constexpr int kReceivesPosted = 512;  // perftest's rx_depth for SEND tests

struct Options {
  Op op = Op::kWrite;
  long iters = 1'000'000;
  long batch = 10'000;
  uint32_t size = 2;
  int core_responder = -1;
  int core_initiator = -1;
  long signal_every = 1;
  bool pause = false;  // --op raw: a PAUSE in the watching loop
};

[[noreturn]] void usage(int status) {
  std::fprintf(status == 0 ? stdout : stderr,
               "usage: pingpong [--op write|send|raw] [--iters N] [--batch N] [--size BYTES] [--cores A,B]\n"
               "                [--signal-every N] [--pause]\n"
               "  the one-way latency of an inline RDMA WRITE (default) or SEND ping-pong between\n"
               "  two processes (raw: a byte in shared memory, no verbs), median and fastest of\n"
               "  batches of --batch round trips (default 1000000 in 10000), and the median round\n"
               "  trip; --cores pins the responder to A, the initiator to B\n");
  std::exit(status);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") usage(0);
    if (arg == "--pause") {
      o.pause = true;
      continue;
    }
    if (i + 1 >= argc) usage(2);
    const char* value = argv[++i];
    if (arg == "--op") {
      const std::string op = value;
      if (op == "write") {
        o.op = Op::kWrite;
      } else if (op == "send") {
        o.op = Op::kSend;
      } else if (op == "raw") {
        o.op = Op::kRaw;
      } else {
        usage(2);
      }
    } else if (arg == "--iters") {
      o.iters = std::atol(value);
    } else if (arg == "--batch") {
      o.batch = std::atol(value);
    } else if (arg == "--size") {
      o.size = static_cast<uint32_t>(std::atol(value));
    } else if (arg == "--signal-every") {
      o.signal_every = std::atol(value);
    } else if (arg == "--cores") {
      if (std::sscanf(value, "%d,%d", &o.core_responder, &o.core_initiator) != 2) usage(2);
    } else {
      usage(2);
    }
  }
  if (o.iters <= 0 || o.batch <= 0 || o.batch > o.iters || o.size == 0 || o.size > 64 || o.signal_every <= 0 ||
      o.signal_every > 64 || (o.signal_every > 1 && o.op != Op::kWrite))
    usage(2);
  return o;
}

void pin(int core) {
  if (core < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) die("sched_setaffinity");
}

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

// A stamp per round trip: the TSC where there is one (a few ns, no call),
// else the monotonic clock. Turned into ns by the run's own ratio of the two.
uint64_t stamp() {
#if defined(__x86_64__)
  return __rdtsc();
#else
  return now_ns();
#endif
}

// The raw ping-pong's two bytes, each on a page of its own (as perftest's
// buffers are): side 0 watches `bytes[0]` and stores into `bytes[kPage]`.
class RawPlayer {
 public:
  static constexpr size_t kPage = 4096;
  RawPlayer(unsigned char* shared, int side, bool pause)
      : watched_(shared + (side == 0 ? 0 : kPage)), peer_(shared + (side == 0 ? kPage : 0)), pause_(pause) {}
  void wait_for(unsigned char value) {
    while (*static_cast<volatile unsigned char*>(watched_) != value) {
#if defined(__x86_64__)
      if (pause_) _mm_pause();
#endif
    }
  }
  void post(unsigned char value) { *static_cast<volatile unsigned char*>(peer_) = value; }

 private:
  unsigned char* watched_;
  unsigned char* peer_;
  bool pause_;
};

// The ping-pong's two halves. WRITE: the peer writes into the first
// kBuffer / 2 bytes of our buffer (we watch its last byte); we write from the
// second half. SEND: the peer's SENDs land in the first half, ours go from the
// second.
class Player {
 public:
  Player(Side& side, const Endpoint& peer, const Options& o)
      : side_(side), op_(o.op), size_(o.size), signal_every_(o.signal_every) {
    auto* buffer = static_cast<unsigned char*>(side.buffer);
    watched_ = buffer + size_ - 1;
    source_ = buffer + bench::kBuffer / 2;
    sge_ = ibv_sge{reinterpret_cast<uint64_t>(source_), size_, side.mr->lkey};
    wr_.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
    wr_.sg_list = &sge_;
    wr_.num_sge = 1;
    if (op_ == Op::kWrite) {
      wr_.opcode = IBV_WR_RDMA_WRITE;
      wr_.wr.rdma.remote_addr = peer.addr;
      wr_.wr.rdma.rkey = peer.rkey;
      return;
    }
    wr_.opcode = IBV_WR_SEND;
    receive_sge_ = ibv_sge{reinterpret_cast<uint64_t>(buffer), size_, side.mr->lkey};
    receive_.sg_list = &receive_sge_;
    receive_.num_sge = 1;
    for (int i = 0; i < kReceivesPosted; ++i) post_receive();
  }

  // The peer's message `value`: its byte (WRITE) or its receive completion,
  // after which the receive is posted again (SEND).
  void wait_for(unsigned char value) {
    if (op_ == Op::kWrite) {
      while (*static_cast<volatile unsigned char*>(watched_) != value) {
      }
      return;
    }
    await(side_.recv_cq, "receive");
    post_receive();
  }

  void post(unsigned char value) {
    source_[size_ - 1] = value;
    const bool signaled = ++posted_ % signal_every_ == 0;
    wr_.send_flags = signaled ? IBV_SEND_SIGNALED | IBV_SEND_INLINE : IBV_SEND_INLINE;
    ibv_send_wr* bad = nullptr;
    if (ibv_post_send(side_.qp, &wr_, &bad) != 0) die("ibv_post_send");
    if (signaled) await(side_.cq, "send");
  }

 private:
  static void await(ibv_cq* cq, const char* what) {
    ibv_wc wc{};
    int got = 0;
    while ((got = ibv_poll_cq(cq, 1, &wc)) == 0) {
    }
    if (got < 0 || wc.status != IBV_WC_SUCCESS) {
      std::fprintf(stderr, "pingpong: %s completion status %s\n", what, ibv_wc_status_str(wc.status));
      std::exit(1);
    }
  }

  void post_receive() {
    ibv_recv_wr* bad = nullptr;
    if (ibv_post_recv(side_.qp, &receive_, &bad) != 0) die("ibv_post_recv");
  }

  Side& side_;
  Op op_;
  uint32_t size_;
  long signal_every_;
  long posted_ = 0;
  unsigned char* watched_ = nullptr;
  unsigned char* source_ = nullptr;
  ibv_sge sge_{};
  ibv_send_wr wr_{};
  ibv_sge receive_sge_{};
  ibv_recv_wr receive_{};
};

bench::Shape shape_for(const Options& o) {
  bench::Shape shape;
  if (o.op == Op::kSend) {
    shape.max_recv_wr = kReceivesPosted;
    shape.recv_cq_of_its_own = true;
  }
  return shape;
}

// The responder's side: answers each value with the same value.
template <class Player>
void respond(Player& player, long iters) {
  for (long i = 1; i <= iters; ++i) {
    player.wait_for(static_cast<unsigned char>(i));
    player.post(static_cast<unsigned char>(i));
  }
}

struct Result {
  std::vector<double> batch_one_way;  // ns, the mean of each batch, sorted
  double trip_one_way = 0;            // ns, half the median round trip
};

// The initiator's side: batches of round trips, each batch timed with the
// monotonic clock and each round trip stamped.
template <class Player>
Result measure(Player& player, const Options& o) {
  Result r;
  const long batches = o.iters / o.batch;
  std::vector<uint64_t> trips(static_cast<size_t>(batches * o.batch));
  long i = 1;
  size_t t = 0;
  const uint64_t first_ns = now_ns(), first_stamp = stamp();
  uint64_t last_stamp = first_stamp;
  for (long b = 0; b < batches; ++b) {
    const uint64_t start = now_ns();
    for (long n = 0; n < o.batch; ++n, ++i) {
      player.post(static_cast<unsigned char>(i));
      player.wait_for(static_cast<unsigned char>(i));
      const uint64_t now = stamp();
      trips[t++] = now - last_stamp;
      last_stamp = now;
    }
    r.batch_one_way.push_back(static_cast<double>(now_ns() - start) / (2.0 * static_cast<double>(o.batch)));
  }
  const double ns_per_stamp =
      static_cast<double>(now_ns() - first_ns) / static_cast<double>(std::max<uint64_t>(stamp() - first_stamp, 1));
  for (; i <= o.iters; ++i) {  // the responder's remaining round trips
    player.post(static_cast<unsigned char>(i));
    player.wait_for(static_cast<unsigned char>(i));
  }
  std::sort(r.batch_one_way.begin(), r.batch_one_way.end());
  std::nth_element(trips.begin(), trips.begin() + static_cast<long>(trips.size() / 2), trips.end());
  r.trip_one_way = static_cast<double>(trips[trips.size() / 2]) * ns_per_stamp / 2.0;
  return r;
}

// --op raw: the two sides share one mapping made before the fork.
Result run_raw(const Options& o, pid_t& child) {
  void* shared = mmap(nullptr, 2 * RawPlayer::kPage, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) die("mmap");
  child = fork();
  if (child < 0) die("fork");
  if (child == 0) {
    pin(o.core_responder);
    RawPlayer player(static_cast<unsigned char*>(shared), 1, o.pause);
    respond(player, o.iters);
    _exit(0);
  }
  pin(o.core_initiator);
  RawPlayer player(static_cast<unsigned char*>(shared), 0, o.pause);
  return measure(player, o);
}

// --op write / send: each side its own context, connected over a pipe.
Result run_verbs(const Options& o, pid_t& child) {
  int to_child[2], to_parent[2];
  if (pipe(to_child) != 0 || pipe(to_parent) != 0) die("pipe");
  child = fork();
  if (child < 0) die("fork");
  if (child == 0) {
    close(to_child[1]);
    close(to_parent[0]);
    pin(o.core_responder);
    Side side(shape_for(o));
    Endpoint mine = side.endpoint(), peer{};
    if (read(to_child[0], &peer, sizeof peer) != sizeof peer) _exit(2);
    side.connect(peer);
    Player player(side, peer, o);  // (its receives posted before the initiator can send)
    if (write(to_parent[1], &mine, sizeof mine) != sizeof mine) _exit(3);
    respond(player, o.iters);
    _exit(0);
  }
  close(to_child[0]);
  close(to_parent[1]);
  pin(o.core_initiator);
  Side side(shape_for(o));
  const Endpoint mine = side.endpoint();
  Endpoint peer{};
  if (write(to_child[1], &mine, sizeof mine) != sizeof mine) die("write to the responder");
  if (read(to_parent[0], &peer, sizeof peer) != sizeof peer) die("read from the responder");
  side.connect(peer);
  Player player(side, peer, o);
  return measure(player, o);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  pid_t child = -1;
  const Result r = o.op == Op::kRaw ? run_raw(o, child) : run_verbs(o, child);
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "pingpong: the responder failed\n");
    return 1;
  }
  const char* what = o.op == Op::kWrite ? "write" : o.op == Op::kSend ? "send" : o.pause ? "raw (PAUSE)" : "raw";
  std::printf("one-way %s latency, %u bytes, %ld round trips: median %.1f ns, fastest batch %.1f ns, "
              "median round trip / 2 %.1f ns\n",
              what, o.size, o.iters, r.batch_one_way[r.batch_one_way.size() / 2], r.batch_one_way.front(),
              r.trip_one_way);
  return 0;
}
