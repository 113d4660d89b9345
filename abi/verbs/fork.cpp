// fork() support.
//
// A kernel RDMA device pins registered pages, so after fork() copy-on-write
// would move the parent's buffers away from the HCA; rdma-core therefore marks
// registered ranges MADV_DONTFORK once ibv_fork_init() has been called. softhca
// is a userspace device: it reads and writes registered memory through the
// process's own mappings, so fork() needs no preparation and the library
// reports IBV_FORK_UNNEEDED (what rdma-core reports on kernels with
// copy-on-fork support; pyverbs accepts it).
//
// ibv_dontfork_range / ibv_dofork_range stay available to programs that want
// the advice on their own memory. Unlike rdma-core they keep no per-page
// reference count: overlapping calls simply apply the last advice.
#include <infiniband/verbs.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>

extern "C" {
int ibv_dontfork_range(void* base, size_t size);
int ibv_dofork_range(void* base, size_t size);
}

namespace {

int advise_range(void* base, size_t size, int advice) {
  if (base == nullptr || size == 0) return 0;
  long page = ::sysconf(_SC_PAGESIZE);
  const std::uintptr_t page_size = page > 0 ? static_cast<std::uintptr_t>(page) : 4096u;
  const std::uintptr_t first = reinterpret_cast<std::uintptr_t>(base);
  if (size > UINTPTR_MAX - first - (page_size - 1)) {  // wraps the address space
    errno = EINVAL;
    return EINVAL;
  }
  const std::uintptr_t start = first & ~(page_size - 1);
  const std::uintptr_t end = (first + size + page_size - 1) & ~(page_size - 1);
  if (::madvise(reinterpret_cast<void*>(start), end - start, advice) != 0) return errno;
  return 0;
}

}  // namespace

extern "C" {

int ibv_fork_init(void) { return 0; }

enum ibv_fork_status ibv_is_fork_initialized(void) { return IBV_FORK_UNNEEDED; }

int ibv_dontfork_range(void* base, size_t size) { return advise_range(base, size, MADV_DONTFORK); }

int ibv_dofork_range(void* base, size_t size) { return advise_range(base, size, MADV_DOFORK); }

}  // extern "C"
