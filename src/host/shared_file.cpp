#include "host/shared_file.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "common/log.hpp"

namespace softhca::host {
namespace {

std::errc last_error() { return static_cast<std::errc>(errno); }

// Holds flock() on the file while the first opener initialises it.
class FileLock {
 public:
  explicit FileLock(int fd) : fd_(fd) {
    while (::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
    }
  }
  ~FileLock() { ::flock(fd_, LOCK_UN); }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_;
};

Result<void*> map_locked(int fd, const std::string& path, size_t size, uint64_t magic, uint32_t version,
                         const char* what, const std::function<void(void*)>& init) {
  FileLock guard(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) return fail(last_error());
  const bool fresh = st.st_size == 0;
  if (fresh && ::ftruncate(fd, static_cast<off_t>(size)) != 0) return fail(last_error());
  if (!fresh && static_cast<size_t>(st.st_size) != size) {
    SOFTHCA_ERROR("%s %s has an unexpected size (another softhca version?); remove it", what, path.c_str());
    return fail(std::errc::invalid_argument);
  }
  void* mem = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mem == MAP_FAILED) return fail(last_error());
  auto* header = static_cast<SharedFileHeader*>(mem);
  if (fresh) {
    init(mem);
    header->version = version;
    header->layout_size = static_cast<uint32_t>(size);
    std::atomic_ref<uint64_t>(header->magic).store(magic, std::memory_order_release);
  } else if (std::atomic_ref<uint64_t>(header->magic).load(std::memory_order_acquire) != magic ||
             header->version != version || header->layout_size != size) {
    SOFTHCA_ERROR("%s %s has another layout; remove it", what, path.c_str());
    ::munmap(mem, size);
    return fail(std::errc::invalid_argument);
  }
  return mem;
}

}  // namespace

Result<void*> map_shared_file(const std::string& path, size_t size, uint64_t magic, uint32_t version,
                              const char* what, const std::function<void(void*)>& init) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    SOFTHCA_ERROR("cannot open the %s %s: %s", what, path.c_str(), std::strerror(errno));
    return fail(last_error());
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_uid != ::getuid()) {
    SOFTHCA_ERROR("%s %s is not owned by this user", what, path.c_str());
    ::close(fd);
    return fail(std::errc::permission_denied);
  }
  auto mapped = map_locked(fd, path, size, magic, version, what, init);
  ::close(fd);
  return mapped;
}

void unmap_shared_file(void* mem, size_t size) { ::munmap(mem, size); }

void init_robust_mutex(pthread_mutex_t* mutex) {
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(mutex, &attr);
  pthread_mutexattr_destroy(&attr);
}

void lock_robust_mutex(pthread_mutex_t* mutex, const char* what) {
  if (pthread_mutex_lock(mutex) == EOWNERDEAD) {
    // Expected when a peer is killed (or leaves with _exit) while it holds
    // the lock: records are claimed by writing their owner last, and a dead
    // owner's records are reclaimed, so a torn update is not fatal.
    SOFTHCA_INFO("a process died holding the %s lock; recovering", what);
    pthread_mutex_consistent(mutex);
  }
}

}  // namespace softhca::host
