// A program of another project, built against an installed softhca's C++
// API (tests/install/install_test.sh): it opens a device by name, registers
// memory and creates an rdma_cm id, so that both the verbs headers
// (softhca.hpp, -libverbs) and the rdma_cm ones (cm.hpp, -lrdmacm) must
// compile and link. It prints what the test checks, one fact a line.
#include <softhca/cm.hpp>
#include <softhca/softhca.hpp>

#include <cstddef>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  const std::string name = argc > 1 ? argv[1] : "softhca0";
  try {
    auto ctx = softhca::Context::make(name);
    const ibv_port_attr port = ctx.query_port(1).value();
    std::printf("consumer: device %.*s port 1 %s\n", static_cast<int>(ctx.name().size()), ctx.name().data(),
                ibv_port_state_str(port.state));

    auto pd = softhca::ProtectionDomain::make(ctx);
    std::vector<std::byte> buf(4096);
    auto mr = softhca::MemoryRegion::make(pd, buf, softhca::Access::LocalWrite | softhca::Access::RemoteWrite);
    std::printf("consumer: registered %zu bytes\n", mr.span().size());

    auto channel = softhca::EventChannel::make();
    auto id = softhca::CmId::make(channel);
    std::printf("consumer: rdma_cm id created\n");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
  return 0;
}
