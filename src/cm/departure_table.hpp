// The host's departure table: for every connection a process of this host
// has with a CM of another host, the DREQ that must reach that CM if the
// process dies without sending it (killed by a signal, crashed) or without
// seeing it answered (an exit whose linger ran out).
//
// The kernel's CM outlives the process: when the rdma_cm file of a killed
// process closes, it sends the DREQ of each connection and retries it until
// the DREP comes. softhca's CM lives in the process, so each process writes
// here, while it is connected, what its CM would send; the host's CM agent
// (tools/cm_agent, started on demand by the first process that writes a
// record) sends the records of processes that are gone, with the wait and
// retries they name, until the DREP comes or the retries run out. Any
// process of the host that receives the DREP, or the peer's own DREQ, for a
// comm ID whose owner is gone ends the record (cm/service_messages.cpp):
// port 4791 is shared, so the answer may reach any of them.
//
// Storage: one file in the user's runtime directory (cm-v1.departures, mode
// 0600), shared like the port table and guarded by a robust mutex. A record
// is written by its owner only (its slot is the owner's until it frees it),
// found again by its slot number, never by a search; only the rare ends for
// a dead owner search, and only below the high-water mark.
#pragma once

#include <pthread.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cm/mad_codec.hpp"
#include "common/result.hpp"
#include "host/shared_file.hpp"

namespace softhca::cm {

// cmtime -c 10000 between two hosts holds 10,000 connections at once, all
// of one process.
inline constexpr uint32_t kMaxDepartures = 16384;

struct DepartureRecord {
  uint32_t pid = 0;  // owner; 0 = free
  uint32_t local_comm_id = 0;
  uint64_t start_time = 0;  // the owner's (host::process_start_time), against pid reuse
  uint32_t generation = 0;  // moved at every write, so an adopter tells a new record
  uint32_t wait_ms = 0;     // between tries
  uint8_t retries = 0;      // tries after the first
  uint8_t reserved[7] = {};
  Gid local{};   // this host's address, as the peer knows it
  Gid remote{};  // the peer host's
  MadBytes mad{};
};

struct DepartureTableLayout {
  host::SharedFileHeader header;
  pthread_mutex_t mutex;
  uint32_t high_water;  // no record at or above this index is in use
  uint32_t cursor;      // where the search for a free slot starts
  uint32_t generation;
  uint32_t reserved;
  DepartureRecord records[kMaxDepartures];
};

// A record as the agent reads it, with its slot.
struct DepartureSnapshot {
  uint32_t slot = 0;
  DepartureRecord record;
};

class DepartureTable {
 public:
  // The calling user's table (cm-v1.departures in its runtime directory).
  static Result<DepartureTable*> open();
  // The table of directory `dir` (for tests: removed when closed if asked).
  static Result<DepartureTable*> open_in(const std::string& dir, bool unlink_on_close);
  ~DepartureTable();
  DepartureTable(const DepartureTable&) = delete;
  DepartureTable& operator=(const DepartureTable&) = delete;

  // Writes `record` (its owner in record.pid) into `slot`, or into a free
  // slot when `slot` is empty, and returns the slot.
  // too_many_files_open_in_system: the table is full.
  Result<uint32_t> write(std::optional<uint32_t> slot, const DepartureRecord& record);
  // The owner frees its record (the connection ended, or its departure did).
  void free(uint32_t slot, uint32_t pid, uint32_t local_comm_id);
  // The departure of `local_comm_id` towards `remote` was answered: whoever
  // owned it, its record goes (a DREP or DREQ for a dead owner's comm ID).
  // Returns whether a record went.
  bool end(uint32_t local_comm_id, const Gid& remote);
  // The agent: the records in use.
  std::vector<DepartureSnapshot> snapshot();
  // The agent: frees `slot` if it still holds generation `generation`.
  void free_generation(uint32_t slot, uint32_t generation);
  // The agent, before it exits: true (and the table stays locked until
  // unlock_after_idle) when no record is in use, so that a process cannot
  // write one between the agent's last look and its exit.
  bool lock_if_idle();
  void unlock_after_idle();

 private:
  DepartureTable(DepartureTableLayout* layout, std::string path, bool unlink_on_close)
      : layout_(layout), path_(std::move(path)), unlink_on_close_(unlink_on_close) {}
  void lock();
  void unlock();
  void free_locked(uint32_t slot);

  DepartureTableLayout* layout_;
  std::string path_;
  bool unlink_on_close_;
};

}  // namespace softhca::cm
