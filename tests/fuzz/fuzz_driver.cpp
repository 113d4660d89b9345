// A main() for LLVMFuzzerTestOneInput where libFuzzer is not available: the
// project's compiler is GCC 12, which has no -fsanitize=fuzzer, and Debian's
// clang 14 cannot build the rest of softhca. It is blind (no coverage
// feedback), so it mutates the golden packets with the format in mind: bit
// flips, random bytes, the fields that steer the parser (IP version and
// lengths, opcode, pad count and TVer), truncation, growth, splicing, and
// lengths and ICRC made consistent again half of the time so that the checks
// behind them are reached. The PRNG has a fixed seed: input N of a run is
// always the same, whatever the time limit cuts off.
//
//   wire_parse_fuzz_driver [--seed N] [--max-seconds S] [--max-inputs N]
//   wire_parse_fuzz_driver FILE...          run each file once (a reproducer)
//   wire_parse_fuzz_driver --write-seeds DIR   the golden packets as a corpus
//
// tests/fuzz/run_libfuzzer.sh runs the same harness under clang's libFuzzer.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "wire/icrc.hpp"
#include "wire/ip_udp.hpp"
#include "wire_golden/golden_packets.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size);

namespace {

using Bytes = std::vector<uint8_t>;
using softhca::wire::kIcrcSize;

std::vector<Bytes> seeds() {
  std::vector<Bytes> out;
  for (const auto& p : softhca::wire::golden::kPackets) {
    out.emplace_back(p.ip_packet.begin(), p.ip_packet.end());
    const std::size_t udp = (p.flow.ipv6 ? 40 : 20) + 8;
    out.emplace_back(p.ip_packet.begin() + static_cast<std::ptrdiff_t>(udp), p.ip_packet.end());
  }
  return out;
}

// Rewrites the IP and UDP lengths to the packet's size and stores a valid
// ICRC, where the bytes still look like IPv4 or IPv6.
void make_consistent(Bytes& b) {
  if (b.empty()) return;
  const bool v4 = (b[0] >> 4) == 4;
  const std::size_t ip = v4 ? 20 : 40;
  if (b.size() < ip + 8 || b.size() > 0xFFFF) return;
  const std::size_t udp_length = b.size() - ip;
  if (v4) {
    b[2] = static_cast<uint8_t>(b.size() >> 8);
    b[3] = static_cast<uint8_t>(b.size());
  } else {
    b[4] = static_cast<uint8_t>(udp_length >> 8);
    b[5] = static_cast<uint8_t>(udp_length);
  }
  b[ip + 4] = static_cast<uint8_t>(udp_length >> 8);
  b[ip + 5] = static_cast<uint8_t>(udp_length);
  if (const auto icrc = softhca::wire::icrc_of(b)) softhca::wire::store_icrc(*icrc, std::span(b).last<kIcrcSize>());
}

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  Bytes next(const std::vector<Bytes>& corpus) {
    Bytes b = corpus[below(corpus.size())];
    const int rounds = 1 + static_cast<int>(below(4));
    for (int i = 0; i < rounds; ++i) mutate(b, corpus);
    if (below(2) == 0) make_consistent(b);
    return b;
  }

 private:
  std::size_t below(std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(rng_() % n); }
  uint8_t byte() { return static_cast<uint8_t>(rng_()); }

  void mutate(Bytes& b, const std::vector<Bytes>& corpus) {
    switch (below(8)) {
      case 0:  // one bit
        if (!b.empty()) b[below(b.size())] ^= static_cast<uint8_t>(1U << below(8));
        break;
      case 1:  // one byte
        if (!b.empty()) b[below(b.size())] = byte();
        break;
      case 2: {  // a byte that steers the parser: IP version, lengths, opcode, pad/TVer
        static constexpr std::size_t kSteering[] = {0, 2, 3, 4, 5, 6, 9, 24, 25, 28, 29, 44, 45, 48, 49, 0, 1};
        const std::size_t at = kSteering[below(std::size(kSteering))];
        if (at < b.size()) b[at] = below(2) ? byte() : static_cast<uint8_t>(b[at] ^ (0x10U << below(4)));
        break;
      }
      case 3:  // truncate
        b.resize(below(b.size() + 1));
        break;
      case 4: {  // grow
        const std::size_t n = 1 + below(below(4) == 0 ? 5000 : 8);
        for (std::size_t i = 0; i < n; ++i) b.push_back(byte());
        break;
      }
      case 5:  // cut a piece out of the middle
        if (b.size() > 2) {
          const std::size_t at = below(b.size());
          b.erase(b.begin() + static_cast<std::ptrdiff_t>(at),
                  b.begin() + static_cast<std::ptrdiff_t>(at + below(b.size() - at)));
        }
        break;
      case 6: {  // splice with another seed
        const Bytes& other = corpus[below(corpus.size())];
        b.resize(below(b.size() + 1));
        const std::size_t from = below(other.size() + 1);
        b.insert(b.end(), other.begin() + static_cast<std::ptrdiff_t>(from), other.end());
        break;
      }
      default:  // several random bytes
        for (int i = 0; i < 4 && !b.empty(); ++i) b[below(b.size())] = byte();
        break;
    }
  }

  std::mt19937_64 rng_;
};

int run_files(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "wire_parse_fuzz_driver: cannot read %s\n", argv[i]);
      return 2;
    }
    const Bytes b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(b.data(), b.size());
    std::printf("%s: ok\n", argv[i]);
  }
  return 0;
}

int write_seeds(const char* dir) {
  int n = 0;
  for (const Bytes& b : seeds()) {
    const std::string path = std::string(dir) + "/seed-" + std::to_string(n++);
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
    if (!out) {
      std::fprintf(stderr, "wire_parse_fuzz_driver: cannot write %s\n", path.c_str());
      return 2;
    }
  }
  std::printf("wrote %d seeds to %s\n", n, dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t seed = 1;
  double max_seconds = 10;
  uint64_t max_inputs = UINT64_MAX;
  for (int i = 1; i < argc; ++i) {
    const auto value = [&] {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "wire_parse_fuzz_driver: %s needs a value\n", argv[i]);
        std::exit(2);
      }
      return argv[++i];
    };
    if (std::strcmp(argv[i], "--seed") == 0) {
      seed = std::strtoull(value(), nullptr, 0);
    } else if (std::strcmp(argv[i], "--max-seconds") == 0) {
      max_seconds = std::strtod(value(), nullptr);
    } else if (std::strcmp(argv[i], "--max-inputs") == 0) {
      max_inputs = std::strtoull(value(), nullptr, 0);
    } else if (std::strcmp(argv[i], "--write-seeds") == 0) {
      return write_seeds(value());
    } else if (argv[i][0] == '-') {
      std::fprintf(stderr, "wire_parse_fuzz_driver: unknown option %s\n", argv[i]);
      return 2;
    } else {
      return run_files(argc, argv, i);
    }
  }

  const std::vector<Bytes> corpus = seeds();
  for (const Bytes& b : corpus) LLVMFuzzerTestOneInput(b.data(), b.size());
  Mutator mutator(seed);
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  uint64_t inputs = 0;
  while (inputs < max_inputs) {
    // The clock is read every 1024 inputs: the work, not the clock, dominates.
    if (inputs % 1024 == 0 && elapsed() >= max_seconds) break;
    const Bytes b = mutator.next(corpus);
    LLVMFuzzerTestOneInput(b.data(), b.size());
    ++inputs;
  }
  std::printf("wire_parse_fuzz_driver: %llu inputs in %.1f s (seed %llu), no broken promise\n",
              static_cast<unsigned long long>(inputs), elapsed(), static_cast<unsigned long long>(seed));
  return 0;
}
