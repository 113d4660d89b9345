// Static-rate conversions: enum ibv_rate <-> multiple of 2.5 Gb/s <-> Mb/s.
//
// One table holds every rate the v44 header defines. The "multiple" column is
// only defined for the rates that are whole multiples of the 2.5 Gb/s SDR lane
// (the FDR/EDR/HDR... encodings are not); the Mb/s column uses the exact
// signalling rates rdma-core 44 reports (e.g. 14 Gb/s FDR -> 14062, 100 Gb/s
// EDR -> 103125). Unknown inputs give -1 resp. IBV_RATE_MAX, as there.
#include <infiniband/verbs.h>

#include <array>

namespace {

struct RateRow {
  ibv_rate rate;
  int mult;  // 0: no 2.5 Gb/s multiple for this rate
  int mbps;
};

constexpr std::array<RateRow, 23> kRates{{
    {IBV_RATE_2_5_GBPS, 1, 2500},
    {IBV_RATE_5_GBPS, 2, 5000},
    {IBV_RATE_10_GBPS, 4, 10000},
    {IBV_RATE_20_GBPS, 8, 20000},
    {IBV_RATE_30_GBPS, 12, 30000},
    {IBV_RATE_40_GBPS, 16, 40000},
    {IBV_RATE_60_GBPS, 24, 60000},
    {IBV_RATE_80_GBPS, 32, 80000},
    {IBV_RATE_120_GBPS, 48, 120000},
    {IBV_RATE_14_GBPS, 0, 14062},
    {IBV_RATE_56_GBPS, 0, 56250},
    {IBV_RATE_112_GBPS, 0, 112500},
    {IBV_RATE_168_GBPS, 0, 168750},
    {IBV_RATE_25_GBPS, 0, 25781},
    {IBV_RATE_100_GBPS, 0, 103125},
    {IBV_RATE_200_GBPS, 0, 206250},
    {IBV_RATE_300_GBPS, 0, 309375},
    {IBV_RATE_28_GBPS, 11, 28125},
    {IBV_RATE_50_GBPS, 20, 53125},
    {IBV_RATE_400_GBPS, 160, 425000},
    {IBV_RATE_600_GBPS, 240, 637500},
    {IBV_RATE_800_GBPS, 320, 850000},
    {IBV_RATE_1200_GBPS, 480, 1275000},
}};

constexpr const RateRow* find_rate(ibv_rate rate) {
  for (const RateRow& row : kRates)
    if (row.rate == rate) return &row;
  return nullptr;
}

static_assert(find_rate(IBV_RATE_MAX) == nullptr);
static_assert(find_rate(IBV_RATE_5_GBPS)->mult == 2 && find_rate(IBV_RATE_100_GBPS)->mbps == 103125);

}  // namespace

extern "C" {

int ibv_rate_to_mult(enum ibv_rate rate) {
  const RateRow* row = find_rate(rate);
  return row != nullptr && row->mult != 0 ? row->mult : -1;
}

enum ibv_rate mult_to_ibv_rate(int mult) {
  if (mult <= 0) return IBV_RATE_MAX;
  for (const RateRow& row : kRates)
    if (row.mult == mult) return row.rate;
  return IBV_RATE_MAX;
}

int ibv_rate_to_mbps(enum ibv_rate rate) {
  const RateRow* row = find_rate(rate);
  return row != nullptr ? row->mbps : -1;
}

enum ibv_rate mbps_to_ibv_rate(int mbps) {
  if (mbps <= 0) return IBV_RATE_MAX;
  for (const RateRow& row : kRates)
    if (row.mbps == mbps) return row.rate;
  return IBV_RATE_MAX;
}

}  // extern "C"
