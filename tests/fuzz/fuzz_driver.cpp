// A main() for LLVMFuzzerTestOneInput where libFuzzer is not available: the
// project's compiler is GCC 12, which has no -fsanitize=fuzzer, and Debian's
// clang 14 cannot build the rest of softhca. It is blind (no coverage
// feedback), so each harness tells it about its format (fuzz_driver.hpp):
// its seeds, a mutation that knows the format, and a repair (lengths and
// checksums made consistent again half of the time) so that the checks
// behind them are reached; the generic mutations are bit flips, random
// bytes, truncation, growth, cuts, insertions and splicing. The PRNG has a
// fixed seed: input N of a run is always the same, whatever the time limit
// cuts off.
//
//   <name>_fuzz_driver [--seed N] [--max-seconds S] [--max-inputs N]
//   <name>_fuzz_driver FILE...          run each file once (a reproducer)
//   <name>_fuzz_driver --write-seeds DIR   the seeds as a corpus for libFuzzer
//
// tests/fuzz/run_libfuzzer.sh runs the same harnesses under clang's libFuzzer.
#include "fuzz_driver.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size);

namespace {

using softhca::fuzz::Bytes;
using softhca::fuzz::kTarget;
using softhca::fuzz::Random;

// The input being run, so that a broken promise (abort) or a crash leaves
// it behind as a reproducer, as libFuzzer does: crash-<name> in the working
// directory; run it again with `<name>_fuzz_driver crash-<name>`.
const Bytes* g_current = nullptr;
char g_crash_path[128] = "crash";

extern "C" void save_current_input(int sig) {
  if (g_current != nullptr) {
    const int fd = ::open(g_crash_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      [[maybe_unused]] const auto n = ::write(fd, g_current->data(), g_current->size());
      ::close(fd);
      static constexpr char kSaved[] = "fuzz_driver: the input is saved in ";
      [[maybe_unused]] const auto m = ::write(2, kSaved, sizeof kSaved - 1);
      [[maybe_unused]] const auto k = ::write(2, g_crash_path, std::strlen(g_crash_path));
      [[maybe_unused]] const auto l = ::write(2, "\n", 1);
    }
  }
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void run_one(const Bytes& b) {
  g_current = &b;
  LLVMFuzzerTestOneInput(b.data(), b.size());
  g_current = nullptr;
}

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : random_(seed) {}

  Bytes next(const std::vector<Bytes>& corpus) {
    // Now and then a fresh input from the harness's generator: without
    // coverage feedback, breadth comes from there.
    Bytes b = kTarget.generate != nullptr && random_.below(4) == 0 ? kTarget.generate(random_)
                                                                   : corpus[random_.below(corpus.size())];
    const int rounds = 1 + static_cast<int>(random_.below(4));
    for (int i = 0; i < rounds; ++i) mutate(b, corpus);
    if (kTarget.repair != nullptr && random_.below(2) == 0) kTarget.repair(b);
    return b;
  }

 private:
  std::size_t below(std::size_t n) { return random_.below(n); }
  uint8_t byte() { return random_.byte(); }

  void mutate(Bytes& b, const std::vector<Bytes>& corpus) {
    switch (below(10)) {
      case 0:  // one bit
        if (!b.empty()) b[below(b.size())] ^= static_cast<uint8_t>(1U << below(8));
        break;
      case 1:  // one byte
        if (!b.empty()) b[below(b.size())] = byte();
        break;
      case 2:  // what the harness knows of its format
        kTarget.tweak(b, random_);
        break;
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
      case 7: {  // a few random bytes inserted in the middle
        const std::size_t at = below(b.size() + 1);
        Bytes more(1 + below(8));
        for (uint8_t& x : more) x = byte();
        b.insert(b.begin() + static_cast<std::ptrdiff_t>(at), more.begin(), more.end());
        break;
      }
      case 8:  // a piece of the input repeated in place (a packet or a step again)
        if (!b.empty() && b.size() < 64 * 1024) {
          const std::size_t at = below(b.size());
          const Bytes piece(b.begin() + static_cast<std::ptrdiff_t>(at),
                            b.begin() + static_cast<std::ptrdiff_t>(at + 1 + below(std::min<std::size_t>(64, b.size() - at))));
          b.insert(b.begin() + static_cast<std::ptrdiff_t>(at), piece.begin(), piece.end());
        }
        break;
      default:  // several random bytes
        for (int i = 0; i < 4 && !b.empty(); ++i) b[below(b.size())] = byte();
        break;
    }
  }

  Random random_;
};

int run_files(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "%s_fuzz_driver: cannot read %s\n", kTarget.name, argv[i]);
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
  for (const Bytes& b : kTarget.seeds()) {
    const std::string path = std::string(dir) + "/seed-" + std::to_string(n++);
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
    if (!out) {
      std::fprintf(stderr, "%s_fuzz_driver: cannot write %s\n", kTarget.name, path.c_str());
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
        std::fprintf(stderr, "%s_fuzz_driver: %s needs a value\n", kTarget.name, argv[i]);
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
      std::fprintf(stderr, "%s_fuzz_driver: unknown option %s\n", kTarget.name, argv[i]);
      return 2;
    } else {
      return run_files(argc, argv, i);
    }
  }

  std::snprintf(g_crash_path, sizeof g_crash_path, "crash-%s", kTarget.name);
  for (int sig : {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL}) std::signal(sig, save_current_input);
  const std::vector<Bytes> corpus = kTarget.seeds();
  for (const Bytes& b : corpus) run_one(b);
  Mutator mutator(seed);
  const auto start = std::chrono::steady_clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  uint64_t inputs = 0;
  while (inputs < max_inputs) {
    // The clock is read every 64 inputs: the work, not the clock, dominates
    // (a transport script takes far longer than a packet parse).
    if (inputs % 64 == 0 && elapsed() >= max_seconds) break;
    const Bytes b = mutator.next(corpus);
    run_one(b);
    ++inputs;
  }
  std::printf("%s_fuzz_driver: %llu inputs in %.1f s (seed %llu), no broken promise\n", kTarget.name,
              static_cast<unsigned long long>(inputs), elapsed(), static_cast<unsigned long long>(seed));
  return 0;
}
