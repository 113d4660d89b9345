// Benchmark, not a test: what softhca objects cost, and what an idle context
// burns. Creates N RC QPs (perftest-like depths) and N CQs through the public
// verbs API and reports the process's resident memory per object (heap plus
// the shared segment pages that were touched), then leaves the context idle
// for a while and reports the CPU time the process used meanwhile.
//
//   softhca_footprint [--qps N] [--idle-seconds S]
//   (run it on softhca: LD_LIBRARY_PATH=build/lib, or softhca run --)
#include <infiniband/verbs.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

long resident_kib() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  long kib = -1;
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, "VmRSS:", 6) == 0) kib = std::strtol(line + 6, nullptr, 10);
  std::fclose(f);
  return kib;
}

double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec + (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

[[noreturn]] void die(const char* what) {
  std::perror(what);
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  int count = 1000;
  int idle_seconds = 3;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--qps" && i + 1 < argc) {
      count = std::atoi(argv[++i]);
    } else if (arg == "--idle-seconds" && i + 1 < argc) {
      idle_seconds = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--qps N] [--idle-seconds S]\n", argv[0]);
      return 2;
    }
  }
  int num = 0;
  ibv_device** devices = ibv_get_device_list(&num);
  if (devices == nullptr || num == 0) die("ibv_get_device_list");
  ibv_context* ctx = ibv_open_device(devices[0]);
  if (ctx == nullptr) die("ibv_open_device");
  ibv_pd* pd = ibv_alloc_pd(ctx);
  if (pd == nullptr) die("ibv_alloc_pd");

  const long base = resident_kib();
  std::vector<ibv_cq*> cqs;
  for (int i = 0; i < count; ++i) {
    ibv_cq* cq = ibv_create_cq(ctx, 512, nullptr, nullptr, 0);
    if (cq == nullptr) die("ibv_create_cq");
    cqs.push_back(cq);
  }
  const long with_cqs = resident_kib();
  std::vector<ibv_qp*> qps;
  for (int i = 0; i < count; ++i) {
    ibv_qp_init_attr attr{};
    attr.send_cq = cqs[i];
    attr.recv_cq = cqs[i];
    attr.qp_type = IBV_QPT_RC;
    attr.cap.max_send_wr = 128;
    attr.cap.max_recv_wr = 512;
    attr.cap.max_send_sge = 1;
    attr.cap.max_recv_sge = 1;
    ibv_qp* qp = ibv_create_qp(pd, &attr);
    if (qp == nullptr) die("ibv_create_qp");
    qps.push_back(qp);
  }
  const long with_qps = resident_kib();
  std::printf("objects: %d CQs (512 cqe) and %d RC QPs (send 128 x 1 sge, recv 512 x 1 sge)\n", count, count);
  std::printf("resident memory per CQ: %.1f KiB\n", double(with_cqs - base) / count);
  std::printf("resident memory per QP: %.1f KiB\n", double(with_qps - with_cqs) / count);
  std::fflush(stdout);

  const double cpu_before = cpu_seconds();
  std::this_thread::sleep_for(std::chrono::seconds(idle_seconds));
  const double cpu_used = cpu_seconds() - cpu_before;
  std::printf("idle context: %.4f s of CPU in %d s (%.3f%% of a core)\n", cpu_used, idle_seconds,
              100.0 * cpu_used / idle_seconds);

  for (ibv_qp* qp : qps) ibv_destroy_qp(qp);
  for (ibv_cq* cq : cqs) ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  ibv_free_device_list(devices);
  return 0;
}
