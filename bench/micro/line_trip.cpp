// Benchmark, not a test: the floor under every one-host latency -- one cache
// line handed back and forth between two processes pinned to two cores, in
// ns one way. No verbs, no library: a counter in a shared page, each side
// waiting for the other's value and answering with the next.
//
// On a VM it also says where the vCPUs sit: the project's 2-core VM hands a
// line over in 55-80 ns in one placement and 280-650 ns in another, and a
// latency ratio against UCX means something different in each (UCX's put
// is at this floor; softhca adds its instructions before the store), so
// bench/peers/one_host_bench.sh prints it with every repetition.
//
//   line_trip [--cores A,B] [--iters N] [--batches N]
//
// Prints the median and the fastest of the batches' one-way times.
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

namespace {

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr, "line_trip: %s\nusage: line_trip [--cores A,B] [--iters N] [--batches N]\n", why);
  std::exit(2);
}

void pin(int core) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) {
    std::perror("line_trip: sched_setaffinity");
    std::_Exit(1);
  }
}

double now_ns() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<double>(t.tv_sec) * 1e9 + static_cast<double>(t.tv_nsec);
}

// The two sides' words on lines of their own: each side writes one and
// spins on the other, as a ping-pong's two buffers do.
struct Lines {
  alignas(64) std::atomic<uint64_t> ping{0};
  alignas(64) std::atomic<uint64_t> pong{0};
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "a lock-free word is address-free across processes");

}  // namespace

int main(int argc, char** argv) {
  int core_a = 0, core_b = 1;
  long iters = 200'000, batches = 10;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::printf("line_trip [--cores A,B] [--iters N] [--batches N]: one cache line handed between two\n"
                  "processes on cores A and B; prints the one-way time in ns (median and fastest batch)\n");
      return 0;
    }
    if (arg != "--cores" && arg != "--iters" && arg != "--batches") usage(("unknown argument " + arg).c_str());
    if (i + 1 >= argc) usage(("missing value after " + arg).c_str());
    const char* value = argv[++i];
    if (arg == "--cores") {
      if (std::sscanf(value, "%d,%d", &core_a, &core_b) != 2) usage("--cores takes A,B");
    } else if (arg == "--iters") {
      iters = std::atol(value);
    } else {
      batches = std::atol(value);
    }
  }
  if (iters < 1 || batches < 1) usage("--iters and --batches must be at least 1");
  void* page = mmap(nullptr, sizeof(Lines), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) {
    std::perror("line_trip: mmap");
    return 1;
  }
  auto* lines = new (page) Lines;
  const uint64_t rounds = static_cast<uint64_t>(iters) * static_cast<uint64_t>(batches);
  const pid_t child = fork();
  if (child < 0) {
    std::perror("line_trip: fork");
    return 1;
  }
  if (child == 0) {  // answers each value with the same value
    pin(core_a);
    for (uint64_t v = 1; v <= rounds; ++v) {
      while (lines->ping.load(std::memory_order_acquire) != v) {
      }
      lines->pong.store(v, std::memory_order_release);
    }
    std::_Exit(0);
  }
  pin(core_b);
  std::vector<double> one_way;
  uint64_t v = 0;
  for (long b = 0; b < batches; ++b) {
    const double start = now_ns();
    for (long i = 0; i < iters; ++i) {
      lines->ping.store(++v, std::memory_order_release);
      while (lines->pong.load(std::memory_order_acquire) != v) {
      }
    }
    one_way.push_back((now_ns() - start) / static_cast<double>(iters) / 2);
  }
  int status = 0;
  waitpid(child, &status, 0);
  std::sort(one_way.begin(), one_way.end());
  std::printf("line trip, one way, cores %d and %d: %.1f ns median, %.1f ns fastest (%ld batches of %ld)\n", core_a,
              core_b, one_way[one_way.size() / 2], one_way.front(), batches, iters);
  return 0;
}
