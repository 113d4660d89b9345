// softhca C++ API: bitwise operators for the typed flag enums (Access,
// SendFlags). Opt-in per enum, so that ordinary enums do not suddenly combine.
#pragma once

#include <type_traits>
#include <utility>

namespace softhca {

template <class E>
struct EnableBitmask : std::false_type {};

template <class E>
concept Bitmask = std::is_enum_v<E> && EnableBitmask<E>::value;

template <Bitmask E>
constexpr E operator|(E a, E b) noexcept {
  return E(std::to_underlying(a) | std::to_underlying(b));
}
template <Bitmask E>
constexpr E operator&(E a, E b) noexcept {
  return E(std::to_underlying(a) & std::to_underlying(b));
}
template <Bitmask E>
constexpr E operator^(E a, E b) noexcept {
  return E(std::to_underlying(a) ^ std::to_underlying(b));
}
template <Bitmask E>
constexpr E operator~(E a) noexcept {
  return E(~std::to_underlying(a));
}
template <Bitmask E>
constexpr E& operator|=(E& a, E b) noexcept {
  return a = a | b;
}
template <Bitmask E>
constexpr E& operator&=(E& a, E b) noexcept {
  return a = a & b;
}
// True when any bit of `b` is set in `a`.
template <Bitmask E>
constexpr bool any(E a, E b = E(~std::underlying_type_t<E>{})) noexcept {
  return std::to_underlying(a & b) != 0;
}

}  // namespace softhca
