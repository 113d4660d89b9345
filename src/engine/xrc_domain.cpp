#include "engine/xrc_domain.hpp"

#include <fcntl.h>
#include <sys/stat.h>

#include "engine/context.hpp"

namespace softhca::engine {
namespace {

// A file's domain id: the same in every process of the host, with the top
// bit set so it never meets the ids of domains without a file (host-unique
// counters from the registry, far below 2^31).
uint32_t file_domain_id(uint64_t dev, uint64_t ino) {
  uint64_t x = dev * 0x9E3779B97F4A7C15ULL ^ ino;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  x ^= x >> 31;
  return 0x80000000u | static_cast<uint32_t>(x & 0x7FFFFFFFu);
}

}  // namespace

Result<XrcDomain*> XrcDomain::open(Context& context, int fd, int oflags) {
  Node& node = context.node();
  if (fd == -1) {
    // A domain of its own, which no other open can name: only created.
    if (!(oflags & O_CREAT)) return fail(std::errc::invalid_argument);
    const uint32_t id = node.registry().allocate_pd_id() & 0x7FFFFFFFu;
    if (id == 0) return fail(std::errc::invalid_argument);
    return new XrcDomain(context, id, 0, 0);
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) return fail(std::errc::bad_file_descriptor);
  const bool exclusive = (oflags & (O_CREAT | O_EXCL)) == (O_CREAT | O_EXCL);
  if (!node.open_xrc_file(st.st_dev, st.st_ino, exclusive)) return fail(std::errc::invalid_argument);
  return new XrcDomain(context, file_domain_id(st.st_dev, st.st_ino), st.st_dev, st.st_ino);
}

XrcDomain::~XrcDomain() {
  if (ino_ != 0) context_.node().close_xrc_file(dev_, ino_);
}

}  // namespace softhca::engine
