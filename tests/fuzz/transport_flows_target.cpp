// What the driver (fuzz_driver.cpp) knows of transport_flows_fuzz.cpp's
// input, the script of transport_script.hpp: a generator of scripts that
// make sense (a connection that posts messages and moves them over a wire
// that mostly delivers, with some loss, duplication, reordering, forgery
// and corruption), used for the seeds and now and then for a fresh input;
// and as the format-aware mutation, a configuration byte rewritten or a
// generated step put in. Random bytes are scripts too, but ones that mostly
// lose every packet or never post.
#include "fuzz_driver.hpp"
#include "transport_script.hpp"

namespace softhca::fuzz {
namespace {

using namespace script;

void put_step(Bytes& b, Random& r) {
  auto op = [&](uint8_t code) { b.push_back(code); };
  auto any = [&](int n) {
    for (int i = 0; i < n; ++i) b.push_back(r.byte());
  };
  const std::size_t pick = r.below(100);
  if (pick < 25) {
    op(kPost);
    // Mostly small lengths, the registered range, the key that works; READs
    // as often as WRITEs (SENDs stall on RNR until a receive is posted).
    static constexpr uint8_t kOps[] = {0, 2, 2, 4, 4, 4, 5, 6, 7, 3};
    b.push_back(static_cast<uint8_t>((r.byte() & 0xC0) | (r.below(3) == 0 ? r.byte() & 7 : kOps[r.below(10)])));
    b.push_back(static_cast<uint8_t>(r.below(3) == 0 ? r.byte() : r.below(8)));
    any(2);
    b.push_back(static_cast<uint8_t>(r.below(4) == 0 ? r.byte() : (r.below(2) ? 0 : 1)));
    b.push_back(static_cast<uint8_t>(r.below(6) == 0 ? r.byte() : 0));
    any(1);
  } else if (pick < 42) {
    op(kRun);
    any(1);
  } else if (pick < 66) {
    op(r.below(2) ? kToResponder : kToRequester);
    const std::size_t count = 1 + r.below(16);
    b.push_back(static_cast<uint8_t>(count - 1));
    for (std::size_t i = 0; i < count; ++i) {
      // Three in four delivered; the rest lost, doubled, late or corrupted.
      const uint8_t fault = r.below(4) ? static_cast<uint8_t>(r.below(4)) : r.byte();
      b.push_back(fault);
      if (fault % 8 == kCorrupt) any(3);
    }
  } else if (pick < 75) {
    op(kTimer);
    b.push_back(static_cast<uint8_t>(r.below(2) ? 0 : r.byte()));
    any(1);
  } else if (pick < 88) {
    op(kPostReceive);
    b.push_back(static_cast<uint8_t>(r.below(4) ? 0 : r.byte()));
    any(2);
    b.push_back(static_cast<uint8_t>(r.below(3) ? 7 : r.byte()));
    b.push_back(static_cast<uint8_t>(r.below(4) ? 0 : r.byte()));
  } else if (pick < 93) {
    op(kForgeRequest);
    any(11);
  } else if (pick < 98) {
    op(kForgeResponse);
    any(11);
  } else {
    op(kKeys);
    any(1);
  }
}

Bytes generate(Random& r) {
  Bytes b;
  for (std::size_t i = 0; i < kConfigBytes; ++i) b.push_back(r.byte());
  // A connection that mostly works: retries and a finite timeout as often
  // as not, all remote access.
  if (r.below(2)) b[1] = static_cast<uint8_t>((b[1] & 0x07) | (1 + r.below(12)) << 3);
  if (r.below(4)) b[7] &= 0x7F;
  const std::size_t steps = 4 + r.below(r.below(4) == 0 ? 300 : 40);
  // One script in eight tears the requester down somewhere (not more: the
  // rest of the script then exercises the responder alone).
  const std::size_t abort_at = r.below(8) == 0 ? r.below(steps) : steps;
  for (std::size_t i = 0; i < steps; ++i) {
    if (i == abort_at) {
      b.push_back(kAbort);
      b.push_back(kAbortNow);
    }
    put_step(b, r);
  }
  return b;
}

std::vector<Bytes> seeds() {
  std::vector<Bytes> out;
  Random r(0x5EED);
  for (int i = 0; i < 64; ++i) out.push_back(generate(r));
  return out;
}

void tweak(Bytes& b, Random& r) {
  if (b.size() < kConfigBytes || r.below(3) == 0) {
    if (!b.empty()) b[r.below(std::min(b.size(), kConfigBytes))] = r.byte();
    return;
  }
  // A generated step, at the end or (perhaps mid-operand) inside.
  Bytes step;
  put_step(step, r);
  const std::size_t at = r.below(2) ? b.size() : kConfigBytes + r.below(b.size() - kConfigBytes + 1);
  b.insert(b.begin() + static_cast<std::ptrdiff_t>(at), step.begin(), step.end());
}

}  // namespace

const Target kTarget{"transport_flows", seeds, tweak, nullptr, generate};

}  // namespace softhca::fuzz
