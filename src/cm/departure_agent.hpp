// What the host's CM agent (tools/cm_agent) decides, without I/O of its own:
// at each look at the departure table (cm/departure_table.hpp), which
// records belong to processes that are gone, and which of their DREQs are
// due. A record of a dead owner is adopted: its DREQ goes at once (the
// kernel's CM sends it when the killed process's file closes), then again
// after each of its waits, as many times as its retries say; then the
// record is freed. A record that disappears was answered: some process of
// the host received the DREP, or the peer's own DREQ, and ended it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <unordered_map>
#include <vector>

#include "cm/departure_table.hpp"

namespace softhca::cm {

class DepartureAgent {
 public:
  using Clock = std::chrono::steady_clock;
  using AliveFn = std::function<bool(uint32_t pid, uint64_t start_time)>;

  struct Send {
    Gid local{};
    Gid remote{};
    MadBytes mad{};
  };

  explicit DepartureAgent(AliveFn alive) : alive_(std::move(alive)) {}

  // One look at `table` at `now`: the DREQs to send.
  std::vector<Send> look(DepartureTable& table, Clock::time_point now);
  // When a look is next needed for an adopted record (nullopt: none adopted).
  std::optional<Clock::time_point> next_due() const;
  // Whether the last look found no record at all, of the living or the dead.
  bool table_was_empty() const { return empty_; }
  std::size_t adopted() const { return adopted_.size(); }

 private:
  struct Adopted {
    uint32_t generation = 0;
    Clock::time_point next;
    uint32_t tries_left = 0;
  };
  AliveFn alive_;
  std::unordered_map<uint32_t, Adopted> adopted_;  // by slot
  bool empty_ = true;
};

}  // namespace softhca::cm
