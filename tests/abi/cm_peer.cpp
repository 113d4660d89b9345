// A passive rdma_cm peer for cm_api_test, run as a separate process so that
// the test can kill it: listens on 127.0.0.1:PORT, prints READY, and then
//   accept PORT       accepts the first request (no QP), prints ESTABLISHED, waits
//   hold PORT         prints REQUEST for each request and never answers
//   late PORT MS      like accept, but prints REQUEST and waits MS milliseconds
//                     before accepting (longer than the requester's REQ timeout)
// Waiting ends only by a signal. Exit status 2 on any setup failure.
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

rdma_cm_event* next_event(rdma_event_channel* ch) {
  rdma_cm_event* ev = nullptr;
  if (rdma_get_cm_event(ch, &ev) != 0) {
    std::perror("rdma_get_cm_event");
    std::exit(2);
  }
  return ev;
}

}  // namespace

int main(int argc, char** argv) {
  const bool late = argc == 4 && std::strcmp(argv[1], "late") == 0;
  if (argc != 3 && !late) {
    std::fprintf(stderr, "usage: %s accept|hold PORT | late PORT MS\n", argv[0]);
    return 2;
  }
  const bool accept = late || std::strcmp(argv[1], "accept") == 0;
  rdma_event_channel* ch = rdma_create_event_channel();
  rdma_cm_id* listener = nullptr;
  if (ch == nullptr || rdma_create_id(ch, &listener, nullptr, RDMA_PS_TCP) != 0) return 2;
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_port = htons(static_cast<uint16_t>(std::atoi(argv[2])));
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (rdma_bind_addr(listener, reinterpret_cast<sockaddr*>(&sin)) != 0 || rdma_listen(listener, 4) != 0) return 2;
  std::printf("READY\n");
  std::fflush(stdout);

  rdma_cm_event* ev = next_event(ch);
  if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) return 2;
  rdma_cm_id* child = ev->id;
  rdma_ack_cm_event(ev);
  if (!accept) {
    // One line per connection request; none is ever answered.
    for (;;) {
      std::printf("REQUEST\n");
      std::fflush(stdout);
      ev = next_event(ch);
      if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) return 2;
      rdma_ack_cm_event(ev);
    }
  }
  if (late) {
    std::printf("REQUEST\n");
    std::fflush(stdout);
    usleep(static_cast<useconds_t>(std::atoi(argv[3])) * 1000);
  }
  rdma_conn_param param{};
  param.qp_num = 0x123;
  param.private_data = "peer";
  param.private_data_len = 5;
  param.responder_resources = 1;
  param.initiator_depth = 1;
  if (rdma_accept(child, &param) != 0) return 2;
  ev = next_event(ch);
  if (ev->event != RDMA_CM_EVENT_ESTABLISHED) return 2;
  rdma_ack_cm_event(ev);
  std::printf("ESTABLISHED\n");
  std::fflush(stdout);
  for (;;) pause();
}
