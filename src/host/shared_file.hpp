// Per-user shared-memory files (the host registry, the CM port table): a file
// in /dev/shm of one fixed layout, mode 0600, owned by the calling user, that
// the first opener initialises under flock() while later openers wait and
// then check the layout. Also the robust process-shared mutex these files
// guard their allocations with.
#pragma once

#include <pthread.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "common/result.hpp"

namespace softhca::host {

// The first fields of every such file: written by the initialiser, magic last.
struct SharedFileHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t layout_size;
};

// Maps `path` (`size` bytes). A new file is sized and handed to `init` (which
// must not set the header: this function does, magic last); an existing one
// must carry `magic`, `version` and `size`. `what` names the file in messages.
Result<void*> map_shared_file(const std::string& path, size_t size, uint64_t magic, uint32_t version,
                              const char* what, const std::function<void(void*)>& init);
void unmap_shared_file(void* mem, size_t size);

void init_robust_mutex(pthread_mutex_t* mutex);
// Locks; if the previous holder died inside, marks the mutex consistent (each
// user keeps its records consistent at every store) and says so once.
void lock_robust_mutex(pthread_mutex_t* mutex, const char* what);

}  // namespace softhca::host
