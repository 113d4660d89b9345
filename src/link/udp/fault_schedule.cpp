#include "link/udp/fault_schedule.hpp"

#include <array>
#include <charconv>
#include <cmath>

#include "common/log.hpp"
#include "common/settings.hpp"

namespace softhca::udp {
namespace {

// splitmix64 (Steele, Lea, Flood 2014): its output function over a counter.
// Draw number k of a seed is mix(seed + (k + 1) * gamma), exactly the k-th
// output of a splitmix64 generator started at the seed; computing it from k
// instead of stepping a state is what makes decide() pure and next()
// lock-free.
constexpr uint64_t kGamma = 0x9e3779b97f4a7c15;

constexpr uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
  z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
  return z ^ (z >> 31);
}

// Every packet uses the same draws, whether or not its faults need them, so
// that one rate never shifts another's draws.
enum Draw : uint64_t { kLoss, kDup, kReorder, kDelay, kDelayUs, kCorrupt, kCorruptIndex, kCorruptMask, kDrawsPerPacket };

// A double in [0, 1) from the top 53 bits, so `unit(x) < p` holds with
// probability p, never for p = 0 and always for p = 1.
constexpr double unit(uint64_t x) { return static_cast<double>(x >> 11) * 0x1.0p-53; }

// A number in [0, n): the high half of x * n (Lemire). Its bias, at most
// n / 2^64, is far below anything a test can see, and unlike rejection it
// needs exactly one draw.
constexpr uint64_t below(uint64_t x, uint64_t n) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(x) * n) >> 64);
}

constexpr std::string_view kSpace = " \t";

std::string_view trim(std::string_view s) {
  const auto first = s.find_first_not_of(kSpace);
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(kSpace) - first + 1);
}

std::string item_text(std::string_view key, std::string_view value) {
  return std::string(key) + "=" + std::string(value);
}

std::expected<double, std::string> parse_probability(std::string_view key, std::string_view value) {
  double p = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), p);
  // from_chars takes "nan" and "inf" too: isfinite keeps them out.
  if (value.empty() || ec != std::errc() || end != value.data() + value.size() || !std::isfinite(p) || p < 0 ||
      p > 1)
    return std::unexpected(item_text(key, value) + ": want a probability from 0 to 1");
  return p;
}

template <typename T>
std::expected<T, std::string> parse_decimal(std::string_view key, std::string_view value, T max,
                                            std::string_view want) {
  T n = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (value.empty() || ec != std::errc() || end != value.data() + value.size() || n > max)
    return std::unexpected(item_text(key, value) + ": want " + std::string(want));
  return n;
}

constexpr std::array<std::string_view, 7> kKeys = {"loss", "dup", "reorder", "delay", "delay_us", "corrupt", "seed"};

std::string shortest(double p) {
  std::array<char, 32> buf{};
  const auto [end, ec] = std::to_chars(buf.data(), buf.data() + buf.size(), p);
  return ec == std::errc() ? std::string(buf.data(), end) : std::string("?");
}

}  // namespace

bool FaultConfig::enabled() const {
  return loss > 0 || dup > 0 || reorder > 0 || (delay > 0 && delay_us > 0) || corrupt > 0;
}

std::expected<FaultConfig, std::string> parse_fault_spec(std::string_view spec) {
  FaultConfig config;
  if (trim(spec).empty()) return config;
  std::array<bool, kKeys.size()> seen{};
  std::size_t start = 0;
  while (start <= spec.size()) {
    const std::size_t comma = std::min(spec.find(',', start), spec.size());
    const std::string_view item = trim(spec.substr(start, comma - start));
    start = comma + 1;
    if (item.empty()) return std::unexpected("an empty item (two commas, or one at an end)");
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos) return std::unexpected("'" + std::string(item) + "': want key=value");
    const std::string_view key = trim(item.substr(0, eq));
    const std::string_view value = trim(item.substr(eq + 1));
    std::size_t k = 0;
    while (k < kKeys.size() && kKeys[k] != key) ++k;
    if (k == kKeys.size())
      return std::unexpected("unknown key '" + std::string(key) +
                             "' (known: loss, dup, reorder, delay, delay_us, corrupt, seed)");
    if (seen[k]) return std::unexpected("'" + std::string(key) + "' is given twice");
    seen[k] = true;
    if (key == "delay_us") {
      auto n = parse_decimal<uint32_t>(key, value, kMaxFaultDelayUs, "microseconds from 0 to 10000000");
      if (!n) return std::unexpected(n.error());
      config.delay_us = *n;
    } else if (key == "seed") {
      auto n = parse_decimal<uint64_t>(key, value, UINT64_MAX, "a decimal number from 0 to 2^64-1");
      if (!n) return std::unexpected(n.error());
      config.seed = *n;
    } else {
      auto p = parse_probability(key, value);
      if (!p) return std::unexpected(p.error());
      double* field = key == "loss"      ? &config.loss
                      : key == "dup"     ? &config.dup
                      : key == "reorder" ? &config.reorder
                      : key == "delay"   ? &config.delay
                                         : &config.corrupt;
      *field = *p;
    }
  }
  return config;
}

std::string to_string(const FaultConfig& c) {
  return "loss=" + shortest(c.loss) + ",dup=" + shortest(c.dup) + ",reorder=" + shortest(c.reorder) +
         ",delay=" + shortest(c.delay) + ",delay_us=" + std::to_string(c.delay_us) + ",corrupt=" +
         shortest(c.corrupt) + ",seed=" + std::to_string(c.seed);
}

FaultDecision FaultSchedule::decide(uint64_t n, std::size_t packet_size) const {
  const auto draw = [&](Draw d) { return mix(config_.seed + (n * kDrawsPerPacket + d + 1) * kGamma); };
  FaultDecision decision;
  if (unit(draw(kLoss)) < config_.loss) {
    decision.drop = true;
    return decision;
  }
  decision.duplicate = unit(draw(kDup)) < config_.dup;
  decision.hold_back = unit(draw(kReorder)) < config_.reorder;
  if (config_.delay_us > 0 && unit(draw(kDelay)) < config_.delay)
    decision.delay_us = static_cast<uint32_t>(1 + below(draw(kDelayUs), config_.delay_us));
  if (packet_size > 0 && unit(draw(kCorrupt)) < config_.corrupt) {
    // Any byte but the one the ICRC does not cover (when the packet has it):
    // draw among the others, then step over it.
    const bool skip = packet_size > kIcrcUncoveredIndex;
    std::size_t index = below(draw(kCorruptIndex), packet_size - (skip ? 1 : 0));
    if (skip && index >= kIcrcUncoveredIndex) ++index;
    decision.corruption = Corruption{.index = index, .mask = static_cast<uint8_t>(1 + below(draw(kCorruptMask), 255))};
  }
  return decision;
}

FaultDecision FaultSchedule::next(std::size_t packet_size) {
  return decide(next_packet_.fetch_add(1, std::memory_order_relaxed), packet_size);
}

bool apply_corruption(const Corruption& c, std::span<uint8_t> packet) {
  if (c.index >= packet.size()) return false;
  packet[c.index] ^= c.mask;
  return true;
}

std::optional<FaultConfig> fault_config_from_text(const char* text, std::string* warning) {
  if (text == nullptr || *text == '\0') return std::nullopt;
  auto config = parse_fault_spec(text);
  if (!config) {
    if (warning != nullptr)
      *warning = "ignoring " + std::string(setting(SettingId::kFault).name) + " '" + text + "' (" + config.error() +
                 "); the udp link runs without faults";
    return std::nullopt;
  }
  if (!config->enabled()) return std::nullopt;
  return *config;
}

std::optional<FaultConfig> fault_config_from_environment() {
  std::string warning;
  auto config = fault_config_from_text(setting_text(SettingId::kFault), &warning);
  // Once per process, as for every bad setting: the link may read it at each
  // start without flooding the log.
  if (!warning.empty() && log_first_time(static_cast<unsigned>(SettingId::kFault)))
    SOFTHCA_WARN("%s", warning.c_str());
  return config;
}

}  // namespace softhca::udp
