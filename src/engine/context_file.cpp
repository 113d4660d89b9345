#include "engine/context_file.hpp"

#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include "host/shared_file.hpp"

namespace softhca::engine {
namespace {

constexpr uint64_t kMagic = 0x5346484341435458ull;  // "SFHCACTX"
constexpr uint32_t kVersion = 2;  // 2: the creator's and the users' start times
constexpr uint64_t kPage = 4096;
constexpr uint32_t kDmPages = static_cast<uint32_t>(ContextFile::kDeviceMemoryBytes / kPage);
// A withdrawn entry: lookups walk past it, publish may reuse it.
constexpr uint32_t kTombstone = 0xFFFFFFFFu;

struct Entry {
  uint32_t kind;  // ExportKind, or kTombstone
  uint32_t handle;
  uint32_t proc;
  uint32_t pid;
  uint32_t pd_handle;
  uint32_t access;
  uint64_t length;
  uint64_t iova;
  uint64_t offset;
};

// How many objects of process (proc, pid, start_time) use object (kind,
// handle). A record whose count fell to 0 may be reused; kind 0 was never
// used (a lookup's probe stops there).
struct UserRecord {
  uint32_t kind;
  uint32_t handle;
  uint32_t proc;
  uint32_t pid;
  uint64_t start_time;
  uint32_t count;
};

uint32_t bucket(ExportKind kind, uint32_t handle) {
  return ((handle * 2654435761u) ^ static_cast<uint32_t>(kind)) % ContextFile::kMaxExports;
}

}  // namespace

struct ContextFile::Layout {
  uint64_t magic;
  uint32_t version;
  uint32_t layout_size;
  pthread_mutex_t mutex;  // robust, process-shared
  std::atomic<uint32_t> holders;
  uint32_t creator_proc;
  uint32_t creator_pid;
  uint64_t creator_start_time;
  uint64_t registry;  // HostRegistry::file_identity of the creator's registry
  std::atomic<uint32_t> next_handle;
  uint64_t dm_used[kDmPages / 64];  // one bit per page of device memory
  Entry entries[kMaxExports];
  UserRecord users[kMaxUserRecords];
};

namespace {

// Device memory begins at the first page after the table.
constexpr uint64_t kDmStart = (sizeof(ContextFile::Layout) + kPage - 1) & ~(kPage - 1);
constexpr uint64_t kFileSize = kDmStart + ContextFile::kDeviceMemoryBytes;

ContextFile::Layout* map_file(int fd) {
  void* mem = ::mmap(nullptr, kFileSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return mem == MAP_FAILED ? nullptr : static_cast<ContextFile::Layout*>(mem);
}

}  // namespace

Result<ContextFile*> ContextFile::create(int fd, const host::ProcessIdentity& creator, uint64_t registry) {
  if (::ftruncate(fd, static_cast<off_t>(kFileSize)) != 0) return fail(static_cast<std::errc>(errno));
  Layout* layout = map_file(fd);
  if (layout == nullptr) return fail(static_cast<std::errc>(errno));
  // A new memfd reads as zeros: every entry free, no device memory taken.
  host::init_robust_mutex(&layout->mutex);
  layout->holders.store(1, std::memory_order_relaxed);
  layout->creator_proc = creator.proc;
  layout->creator_pid = creator.pid;
  layout->creator_start_time = creator.start_time;
  layout->registry = registry;
  layout->next_handle.store(1, std::memory_order_relaxed);
  layout->version = kVersion;
  layout->layout_size = static_cast<uint32_t>(sizeof(Layout));
  std::atomic_ref<uint64_t>(layout->magic).store(kMagic, std::memory_order_release);
  return new ContextFile(layout);
}

Result<ContextFile*> ContextFile::attach(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return fail(std::errc::bad_file_descriptor);
  if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != kFileSize)
    return fail(std::errc::no_such_device_or_address);
  Layout* layout = map_file(fd);
  if (layout == nullptr) return fail(std::errc::no_such_device_or_address);
  auto* file = new ContextFile(layout);
  if (std::atomic_ref<uint64_t>(layout->magic).load(std::memory_order_acquire) != kMagic ||
      layout->version != kVersion || layout->layout_size != sizeof(Layout)) {
    delete file;
    return fail(std::errc::no_such_device_or_address);
  }
  // One more holder, unless every holder has closed it already.
  uint32_t n = layout->holders.load(std::memory_order_relaxed);
  do {
    if (n == 0) {
      delete file;
      return fail(std::errc::no_such_device_or_address);
    }
  } while (!layout->holders.compare_exchange_weak(n, n + 1, std::memory_order_acq_rel));
  return file;
}

ContextFile::~ContextFile() { ::munmap(layout_, kFileSize); }

host::ProcessIdentity ContextFile::creator() const {
  return host::ProcessIdentity{layout_->creator_proc, layout_->creator_pid, layout_->creator_start_time};
}
uint64_t ContextFile::registry() const { return layout_->registry; }

void ContextFile::hold() { layout_->holders.fetch_add(1, std::memory_order_acq_rel); }
void ContextFile::release() { layout_->holders.fetch_sub(1, std::memory_order_acq_rel); }

void ContextFile::lock() const { host::lock_robust_mutex(&layout_->mutex, "context file"); }
void ContextFile::unlock() const { pthread_mutex_unlock(&layout_->mutex); }

bool ContextFile::publish(const ExportRecord& record) {
  lock();
  bool done = false;
  // The entry it had, else the first withdrawn one on its probe path, else
  // the free one that ends the path.
  Entry* reuse = nullptr;
  Entry* tombstone = nullptr;
  for (uint32_t i = 0, at = bucket(record.kind, record.handle); i < kMaxExports; ++i, at = (at + 1) % kMaxExports) {
    Entry& e = layout_->entries[at];
    if (e.kind == kTombstone) {
      if (tombstone == nullptr) tombstone = &e;
    } else if (e.kind == static_cast<uint32_t>(record.kind) && e.handle == record.handle) {
      reuse = &e;
      break;
    } else if (e.kind == static_cast<uint32_t>(ExportKind::kFree)) {
      reuse = tombstone != nullptr ? tombstone : &e;
      break;
    }
  }
  if (reuse == nullptr) reuse = tombstone;
  if (reuse != nullptr) {
    reuse->kind = static_cast<uint32_t>(record.kind);
    reuse->handle = record.handle;
    reuse->proc = record.proc;
    reuse->pid = record.pid;
    reuse->pd_handle = record.pd_handle;
    reuse->access = record.access;
    reuse->length = record.length;
    reuse->iova = record.iova;
    reuse->offset = record.offset;
    done = true;
  }
  unlock();
  return done;
}

namespace {

// The live entry for (kind, handle) in `entries`, or nullptr.
template <typename E>
E* find_entry(E* entries, ExportKind kind, uint32_t handle) {
  for (uint32_t i = 0, at = bucket(kind, handle); i < ContextFile::kMaxExports;
       ++i, at = (at + 1) % ContextFile::kMaxExports) {
    E& e = entries[at];
    if (e.kind == static_cast<uint32_t>(ExportKind::kFree)) return nullptr;
    if (e.kind == static_cast<uint32_t>(kind) && e.handle == handle) return &e;
  }
  return nullptr;
}

}  // namespace

void ContextFile::withdraw(ExportKind kind, uint32_t handle) {
  lock();
  if (Entry* e = find_entry(layout_->entries, kind, handle)) e->kind = kTombstone;
  unlock();
}

std::optional<ExportRecord> ContextFile::find(ExportKind kind, uint32_t handle) const {
  lock();
  std::optional<ExportRecord> out;
  if (const Entry* e = find_entry(layout_->entries, kind, handle))
    out = ExportRecord{kind, e->handle, e->proc, e->pid, e->pd_handle, e->access, e->length, e->iova, e->offset};
  unlock();
  return out;
}

void ContextFile::add_users(ExportKind kind, uint32_t handle, const host::ProcessIdentity& who, int delta) {
  lock();
  UserRecord* found = nullptr;
  UserRecord* spare = nullptr;
  const uint32_t start = (bucket(kind, handle) + who.proc * 40503u) % kMaxUserRecords;
  for (uint32_t i = 0, at = start; i < kMaxUserRecords; ++i, at = (at + 1) % kMaxUserRecords) {
    UserRecord& r = layout_->users[at];
    if (r.kind == static_cast<uint32_t>(kind) && r.handle == handle && r.proc == who.proc && r.pid == who.pid &&
        r.start_time == who.start_time && r.count != 0) {
      found = &r;
      break;
    }
    if (r.count == 0 && spare == nullptr) spare = &r;
    if (r.kind == 0) break;
  }
  if (found == nullptr && delta > 0 && spare != nullptr) {
    *spare = UserRecord{static_cast<uint32_t>(kind), handle, who.proc, who.pid, who.start_time, 0};
    found = spare;
  }
  // (With every record taken, a user goes uncounted: its PD could then be
  // deallocated under it by another process. 4096 pairs are far more than
  // the processes and objects a context holds.)
  if (found != nullptr) found->count += static_cast<uint32_t>(delta);
  unlock();
}

uint32_t ContextFile::users_elsewhere(ExportKind kind, uint32_t handle, uint32_t self,
                                      const std::function<bool(const host::ProcessIdentity&)>& alive) {
  lock();
  uint32_t n = 0;
  for (UserRecord& r : layout_->users) {
    if (r.count == 0 || r.kind != static_cast<uint32_t>(kind) || r.handle != handle || r.proc == self) continue;
    if (alive(host::ProcessIdentity{r.proc, r.pid, r.start_time})) {
      n += r.count;
    } else {
      r.count = 0;  // its objects died with it
    }
  }
  unlock();
  return n;
}

uint32_t ContextFile::next_handle() { return layout_->next_handle.fetch_add(1, std::memory_order_relaxed); }

Result<uint64_t> ContextFile::take_device_memory(uint64_t length) {
  const uint32_t pages = static_cast<uint32_t>((length + kPage - 1) / kPage);
  if (pages == 0 || pages > kDmPages) return fail(std::errc::not_enough_memory);
  auto used = [&](uint32_t p) { return (layout_->dm_used[p / 64] >> (p % 64)) & 1; };
  lock();
  // First fit: device memory is small and changes seldom.
  for (uint32_t first = 0; first + pages <= kDmPages; ++first) {
    uint32_t n = 0;
    while (n < pages && !used(first + n)) ++n;
    if (n == pages) {
      for (uint32_t p = first; p < first + pages; ++p) layout_->dm_used[p / 64] |= uint64_t{1} << (p % 64);
      unlock();
      return kDmStart + static_cast<uint64_t>(first) * kPage;
    }
    first += n;  // past the used page that stopped the run
  }
  unlock();
  return fail(std::errc::not_enough_memory);
}

bool ContextFile::retire_device_memory(uint32_t handle) {
  lock();
  Entry* e = find_entry(layout_->entries, ExportKind::kDm, handle);
  if (e != nullptr) {
    const uint32_t first = static_cast<uint32_t>((e->offset - kDmStart) / kPage);
    const uint32_t pages = static_cast<uint32_t>((e->length + kPage - 1) / kPage);
    // The pages go back to the file's hole: the next DM there reads zeros,
    // as a new allocation must.
    ::madvise(device_memory(e->offset), static_cast<size_t>(pages) * kPage, MADV_REMOVE);
    for (uint32_t p = first; p < first + pages; ++p) layout_->dm_used[p / 64] &= ~(uint64_t{1} << (p % 64));
    e->kind = kTombstone;
  }
  unlock();
  return e != nullptr;
}

char* ContextFile::device_memory(uint64_t offset) const { return reinterpret_cast<char*>(layout_) + offset; }

}  // namespace softhca::engine
