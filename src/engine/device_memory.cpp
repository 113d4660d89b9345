#include "engine/device_memory.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "common/limits.hpp"
#include "engine/context.hpp"

namespace softhca::engine {
namespace {

constexpr uint64_t kWord = 4;  // the granularity of device memory copies

uint64_t page_size() { return static_cast<uint64_t>(sysconf(_SC_PAGESIZE)); }

}  // namespace

Result<DeviceMemory*> DeviceMemory::allocate(Context& context, uint64_t length, uint32_t log_align) {
  if (length == 0 || log_align >= 64 || (uint64_t{1} << log_align) > page_size())
    return fail(std::errc::invalid_argument);
  if (length > limits::kMaxDmSize) return fail(std::errc::not_enough_memory);
  Node& node = context.node();
  if (!node.dm_bytes().try_take(static_cast<uint32_t>(length))) return fail(std::errc::not_enough_memory);
  // Whole pages of private anonymous memory: a DM MR can move them into the
  // shared file like any heap range, so peers reach them without copying.
  const uint64_t mapped = (length + page_size() - 1) & ~(page_size() - 1);
  void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    node.dm_bytes().give_back(static_cast<uint32_t>(length));
    return fail(std::errc::not_enough_memory);
  }
  auto* dm = new DeviceMemory(context, base, length, mapped, context.next_handle());
  context.publish(dm, dm->handle());  // for ibv_import_dm
  return dm;
}

DeviceMemory::~DeviceMemory() {
  context_.withdraw(this, handle_);
  munmap(base_, mapped_);
  context_.node().dm_bytes().give_back(static_cast<uint32_t>(length_));
}

Result<void> DeviceMemory::copy_to(uint64_t offset, const void* from, uint64_t length) {
  if (offset % kWord != 0 || length % kWord != 0 || !holds(offset, length)) return fail(std::errc::invalid_argument);
  if (length != 0) std::memcpy(static_cast<char*>(base_) + offset, from, length);
  return {};
}

Result<void> DeviceMemory::copy_from(void* to, uint64_t offset, uint64_t length) const {
  if (offset % kWord != 0 || length % kWord != 0 || !holds(offset, length)) return fail(std::errc::invalid_argument);
  if (length != 0) std::memcpy(to, static_cast<const char*>(base_) + offset, length);
  return {};
}

}  // namespace softhca::engine
