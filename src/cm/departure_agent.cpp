#include "cm/departure_agent.hpp"

#include <map>
#include <unordered_set>
#include <utility>

namespace softhca::cm {

std::vector<DepartureAgent::Send> DepartureAgent::look(DepartureTable& table, Clock::time_point now) {
  std::vector<Send> out;
  const auto records = table.snapshot();
  empty_ = records.empty();
  // One liveness check per owner, however many connections it had.
  std::map<std::pair<uint32_t, uint64_t>, bool> alive;
  std::unordered_set<uint32_t> seen;
  for (const DepartureSnapshot& s : records) {
    const DepartureRecord& r = s.record;
    const auto owner = std::make_pair(r.pid, r.start_time);
    auto known = alive.find(owner);
    if (known == alive.end()) known = alive.emplace(owner, alive_(r.pid, r.start_time)).first;
    if (known->second) continue;
    seen.insert(s.slot);
    auto it = adopted_.find(s.slot);
    if (it == adopted_.end() || it->second.generation != r.generation)
      it = adopted_.insert_or_assign(s.slot, Adopted{r.generation, now, uint32_t{r.retries} + 1}).first;
    Adopted& a = it->second;
    if (a.next > now) continue;
    if (a.tries_left == 0) {
      // Every try went unanswered (or the answer reached no process of
      // this host): the kernel's CM gives up the same way.
      table.free_generation(s.slot, r.generation);
      adopted_.erase(it);
      continue;
    }
    --a.tries_left;
    a.next = now + std::chrono::milliseconds(r.wait_ms);
    out.push_back(Send{r.local, r.remote, r.mad});
  }
  // What is no longer in the table was answered.
  std::erase_if(adopted_, [&](const auto& entry) { return !seen.contains(entry.first); });
  return out;
}

std::optional<DepartureAgent::Clock::time_point> DepartureAgent::next_due() const {
  std::optional<Clock::time_point> next;
  for (const auto& [slot, a] : adopted_)
    if (!next || a.next < *next) next = a.next;
  return next;
}

}  // namespace softhca::cm
