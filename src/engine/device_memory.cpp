#include "engine/device_memory.hpp"

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
  // Whole pages of the context's file (so page aligned, and zeros: a
  // freed DM's pages went back to the file's hole).
  auto offset = context.file().take_device_memory(length);
  if (!offset) {
    node.dm_bytes().give_back(static_cast<uint32_t>(length));
    return fail(offset.error());
  }
  const uint32_t handle = context.file().next_handle();
  auto* dm = new DeviceMemory(context, context.file().device_memory(*offset), length, handle, false);
  // For ibv_import_dm, here and in the other processes that share the context.
  context.publish(dm, handle, *offset);
  return dm;
}

DeviceMemory* DeviceMemory::adopt(Context& context, const ExportRecord& record) {
  return new DeviceMemory(context, context.file().device_memory(record.offset), record.length, record.handle, true);
}

void DeviceMemory::free_everywhere() { context_.file().retire_device_memory(handle_); }

DeviceMemory::~DeviceMemory() {
  if (adopted_) return;  // the context keeps its adopted objects' books
  context_.withdraw(this, handle_);
  // Unless a process that imported it freed it already.
  context_.file().retire_device_memory(handle_);
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
