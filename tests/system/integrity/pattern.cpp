#include "pattern.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace integrity {

void fill_pattern(std::span<uint8_t> out, uint64_t seed) {
  uint64_t state = mix(seed);
  for (size_t i = 0; i < out.size(); i += 8) {
    state = mix(state);
    const size_t take = std::min<size_t>(8, out.size() - i);
    std::memcpy(out.data() + i, &state, take);
  }
}

std::vector<uint8_t> pattern(size_t n, uint64_t seed) {
  std::vector<uint8_t> out(n);
  fill_pattern(out, seed);
  return out;
}

Layout Layout::of(std::initializer_list<size_t> lengths) {
  Layout l;
  size_t offset = kGap;
  for (size_t len : lengths) {
    l.regions.emplace_back(offset, len);
    offset += len + kGap;
  }
  l.total = offset;
  return l;
}

Layout gather_layout(size_t n) { return Layout::of({n / 4, n / 2, n - n / 4 - n / 2}); }
Layout scatter_layout(size_t n, size_t slack) { return Layout::of({n / 3, n / 6, n - n / 3 - n / 6 + slack}); }
Layout single_layout(size_t n) { return Layout::of({n}); }
Layout ud_layout(size_t n, size_t slack) { return Layout::of({40, n / 3, n / 6, n - n / 3 - n / 6 + slack}); }

void place(std::span<uint8_t> out, const Layout& layout, std::span<const uint8_t> message, size_t first_region) {
  std::memset(out.data(), kGuard, layout.total);
  size_t pos = 0;
  for (size_t r = first_region; r < layout.regions.size(); ++r) {
    const auto [off, len] = layout.regions[r];
    const size_t take = std::min(len, message.size() - pos);
    if (take) std::memcpy(out.data() + off, message.data() + pos, take);
    pos += take;
  }
}

Mismatch compare(std::span<const uint8_t> got, std::span<const uint8_t> want) {
  Mismatch m;
  const size_t n = std::min(got.size(), want.size());
  for (size_t i = 0; i < n; ++i) {
    if (got[i] == want[i]) continue;
    if (m.first < 0) {
      m.first = static_cast<long>(i);
      m.want = want[i];
      m.got = got[i];
    }
    ++m.count;
  }
  return m;
}

std::string describe(const Mismatch& m, size_t size) {
  char text[160];
  std::snprintf(text, sizeof text, "byte %ld of %zu wrong (want 0x%02x, got 0x%02x); %zu bytes wrong", m.first, size,
                m.want, m.got, m.count);
  return text;
}

}  // namespace integrity
