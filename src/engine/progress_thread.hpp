// The one background thread of a process: it does what no application call
// can — relays the events other processes raise here (completion channels,
// async events, SRQ limits) and runs timed retries (RNR, ACK timeout) while
// the application sleeps. It sleeps on the doorbell futex of the process's
// segment, with the earliest retry deadline as its timeout; it never spins.
// The clock is read here, once per wake-up, and passed inward.
#pragma once

#include <atomic>
#include <cstdint>
#include <latch>
#include <thread>

#include "host/shared_queues.hpp"

namespace softhca::engine {

class ProgressThread {
 public:
  // What the thread does, supplied by its owner.
  class Work {
   public:
    virtual void on_event(const host::Event& event) = 0;
    // Runs the retries due at `now_ns`; returns the next deadline, 0 for none.
    virtual uint64_t run_due(uint64_t now_ns) = 0;

   protected:
    ~Work() = default;
  };

  ProgressThread() = default;
  ~ProgressThread() { stop(); }
  ProgressThread(const ProgressThread&) = delete;
  ProgressThread& operator=(const ProgressThread&) = delete;

  void start(host::SegmentHeader& doorbell, Work& work);
  // Wakes the thread and joins it.
  void stop();

 private:
  // Counts `holding` down once it holds the segment's owner_alive.
  void loop(std::latch& holding);

  host::SegmentHeader* doorbell_ = nullptr;
  Work* work_ = nullptr;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace softhca::engine
