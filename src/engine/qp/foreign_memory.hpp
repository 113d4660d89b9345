// Local SGEs in another process's memory: an MR that a process sharing the
// context registered and this one imported (ibv_import_mr), used as an lkey
// here. The requester never works in the other process's pages directly:
// it gathers what a request sends into a staging buffer of its own, and
// scatters what a request brings back (READ data, an atomic's original
// value) from it when the WQE completes, each copy under an access to that
// process announced in the registry and with the key checked again there.
// So the other process's ibv_dereg_mr, which waits out such accesses, is
// never followed by a byte of ours in its pages, even for an answer that
// arrives from another host long after the WQE was posted.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <vector>

#include "host/host_registry.hpp"

namespace softhca::host {
class Attachment;
}

namespace softhca::engine {

class ForeignStaging {
 public:
  // A range of another process's memory, under the key as validated.
  struct Piece {
    host::MrRecord mr;
    uint32_t pid;         // the process in slot mr.proc when it was validated
    uint64_t owner_addr;  // in that process
    uint64_t length;
    uint64_t at;          // its place in the staging buffer
  };

  void clear() {
    pieces_.clear();
    bytes_.clear();
  }
  bool empty() const { return pieces_.empty(); }
  // Adds a range of process `pid`'s (its place is fixed by finish()).
  void add(const host::MrRecord& mr, uint32_t pid, uint64_t owner_addr, uint64_t length);
  // Sizes the buffer once every range is added; each range's iovec is then at(i).
  void finish();
  iovec at(size_t i) { return iovec{bytes_.data() + pieces_[i].at, static_cast<size_t>(pieces_[i].length)}; }
  size_t size() const { return pieces_.size(); }

  // Copies every range from its process into the buffer (gather) or back
  // (scatter). False if a key changed or went since it was validated, or a
  // process's memory could not be reached: the WQE's local protection error.
  bool gather(host::Attachment& host);
  bool scatter(host::Attachment& host);

 private:
  bool copy(host::Attachment& host, const Piece& piece, bool into_owner);
  std::vector<Piece> pieces_;
  std::vector<unsigned char> bytes_;
};

}  // namespace softhca::engine
