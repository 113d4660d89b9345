// Device enumeration: ibv_get_device_list and friends, and the fake sysfs tree
// of softhca0 that ibv_read_sysfs_file serves (ibv_devinfo reads board_id).
#include "device_list.hpp"

#include <endian.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "engine/device/device_info.hpp"
#include "common/limits.hpp"

namespace softhca::abi {
namespace {

constinit DeviceHandle g_device = {
    .device =
        {
            ._ops = {nullptr, nullptr},
            .node_type = IBV_NODE_CA,
            .transport_type = IBV_TRANSPORT_IB,
            .name = "softhca0",
            .dev_name = "uverbs0",
            .dev_path = "/sys/class/infiniband_verbs/uverbs0",
            .ibdev_path = "/sys/class/infiniband/softhca0",
        },
    .provider_ops = nullptr,
    .magic = kDeviceMagic,
};

std::string format_guid(uint64_t guid) {
  char text[24];
  std::snprintf(text, sizeof text, "%04x:%04x:%04x:%04x", static_cast<unsigned>(guid >> 48) & 0xffff,
                static_cast<unsigned>(guid >> 32) & 0xffff, static_cast<unsigned>(guid >> 16) & 0xffff,
                static_cast<unsigned>(guid) & 0xffff);
  return text;
}

// sysfs spells a GID as eight 4-digit groups: 0000:0000:0000:0000:0000:ffff:7f00:0001
std::string format_sysfs_gid(const engine::GidBytes& raw) {
  std::string text;
  char group[8];
  for (int i = 0; i < 8; ++i) {
    std::snprintf(group, sizeof group, "%s%02x%02x", i == 0 ? "" : ":", raw[2 * i], raw[2 * i + 1]);
    text += group;
  }
  return text;
}

std::optional<unsigned> parse_index(std::string_view text) {
  unsigned value = 0;
  if (text.empty() || text.size() > 9) return std::nullopt;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

std::string node_description() {
  char host[65] = {};
  if (gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') return "softhca0";
  std::string desc = std::string(host) + " softhca0";
  if (desc.size() > 63) desc.resize(63);
  return desc;
}

// The content of a fake file (without its trailing newline), or an errno.
struct FakeFile {
  std::string content;
  int error = 0;
};

FakeFile fake_port_file(std::string_view rel) {
  const engine::DeviceInfo& info = engine::device_info();
  auto gid_file = [&](std::string_view prefix, auto&& render) -> std::optional<FakeFile> {
    if (!rel.starts_with(prefix)) return std::nullopt;
    const auto index = parse_index(rel.substr(prefix.size()));
    if (!index || *index >= static_cast<unsigned>(limits::kGidTableLen)) return FakeFile{{}, ENOENT};
    return render(*index);
  };
  if (rel == "state") return {"4: ACTIVE"};
  if (rel == "phys_state") return {"5: LinkUp"};
  if (rel == "link_layer") return {"Ethernet"};
  if (rel == "rate") return {"100 Gb/sec (4X EDR)"};
  if (rel == "lid" || rel == "sm_lid") return {"0x0"};
  if (rel == "lid_mask_count" || rel == "sm_sl") return {"0"};
  if (rel == "cap_mask") return {"0x04010000"};  // CM_SUP | IP_BASED_GIDS
  if (rel == "pkeys/0") {
    char text[8];
    std::snprintf(text, sizeof text, "0x%04x", limits::kDefaultPkey);
    return {text};
  }
  if (rel.starts_with("pkeys/")) return {{}, ENOENT};
  if (auto f = gid_file("gids/", [&](unsigned i) {
        const engine::GidEntry* e = info.gid_at(i);
        return FakeFile{format_sysfs_gid(e ? e->raw : engine::GidBytes{})};
      }))
    return *f;
  // The kernel fails reads of an empty entry's attributes with EINVAL.
  if (auto f = gid_file("gid_attrs/types/", [&](unsigned i) {
        const engine::GidEntry* e = info.gid_at(i);
        if (e == nullptr) return FakeFile{{}, EINVAL};
        return FakeFile{e->type == engine::GidType::kRoceV2 ? "RoCE v2" : "IB/RoCE v1"};
      }))
    return *f;
  if (auto f = gid_file("gid_attrs/ndevs/", [&](unsigned i) {
        const engine::GidEntry* e = info.gid_at(i);
        if (e == nullptr || e->ifname.empty()) return FakeFile{{}, EINVAL};
        return FakeFile{e->ifname};
      }))
    return *f;
  return {{}, ENOENT};
}

// The kernel's cpumask format (/sys/.../local_cpus): 32-bit groups in hex,
// most significant first, separated by commas; the first group has only the
// digits the CPU count needs ("3" for 2 CPUs, "ffffffff,ffffffff" for 64).
std::string cpu_mask_text(long cpus) {
  if (cpus < 1) cpus = 1;
  const long groups = (cpus + 31) / 32;
  std::string text;
  for (long g = groups - 1; g >= 0; --g) {
    const long bits = std::min<long>(32, cpus - 32 * g);
    const uint32_t word = bits == 32 ? 0xffffffffu : (1u << bits) - 1;
    const int width = g == groups - 1 ? static_cast<int>((bits + 3) / 4) : 8;
    char group[16];
    std::snprintf(group, sizeof group, "%s%0*x", g == groups - 1 ? "" : ",", width, word);
    text += group;
  }
  return text;
}

// device/: the parent device's files. softhca is a virtual device, close to
// every CPU: no NUMA node (-1, as the kernel says for a device without one)
// and every configured CPU local. UCX reads both to rank devices; without
// them it assumes the same, but `softhca run` materialises the tree from
// these answers so that UCX reads a complete one.
FakeFile fake_parent_device_file(std::string_view rel) {
  if (rel == "numa_node") return {"-1"};
  if (rel == "local_cpus") return {cpu_mask_text(::sysconf(_SC_NPROCESSORS_CONF))};
  return {{}, ENOENT};
}

FakeFile fake_ibdev_file(std::string_view rel) {
  const engine::DeviceInfo& info = engine::device_info();
  if (rel == "board_id") return {kBoardId};
  if (rel == "fw_ver") return {kFirmwareVersion};
  if (rel == "hca_type") return {kHcaType};
  if (rel == "hw_rev") {
    char text[16];
    std::snprintf(text, sizeof text, "0x%x", limits::kHwVersion);
    return {text};
  }
  if (rel == "node_guid") return {format_guid(info.node_guid)};
  if (rel == "sys_image_guid") return {format_guid(info.sys_image_guid)};
  if (rel == "node_type") return {"1: CA"};
  if (rel == "node_desc") return {node_description()};
  if (rel.starts_with("ports/1/")) return fake_port_file(rel.substr(8));
  if (rel.starts_with("device/")) return fake_parent_device_file(rel.substr(7));
  return {{}, ENOENT};
}

// What ibv_read_sysfs_file does with the bytes read(2) returned: drop the
// trailing newline, NUL-terminate, fail rather than truncate.
int finish_read(char* buf, std::size_t size, std::size_t len) {
  if (len == 0) return 0;
  if (buf[len - 1] == '\n') {
    buf[len - 1] = '\0';
    return static_cast<int>(len - 1);
  }
  if (len < size) {
    buf[len] = '\0';
    return static_cast<int>(len);
  }
  errno = EOVERFLOW;
  return -1;
}

int deliver(const FakeFile& file, char* buf, std::size_t size) {
  if (file.error != 0) {
    errno = file.error;
    return -1;
  }
  const std::string text = file.content + '\n';
  const std::size_t len = std::min(size, text.size());
  if (len > 0) std::memcpy(buf, text.data(), len);
  return finish_read(buf, size, len);
}

int read_real_file(const char* path, char* buf, std::size_t size) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  const ssize_t len = ::read(fd, buf, size);
  const int saved = errno;
  ::close(fd);
  if (len < 0) {
    errno = saved;
    return -1;
  }
  return finish_read(buf, size, static_cast<std::size_t>(len));
}

// "dir/file" with repeated and trailing slashes removed.
std::string join_path(const char* dir, const char* file) {
  std::string raw = std::string(dir) + "/" + file;
  std::string path;
  path.reserve(raw.size());
  for (char c : raw)
    if (!(c == '/' && !path.empty() && path.back() == '/')) path += c;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

// ibv_read_sysfs_file: our device's files from the fake tree, anything else from the disk.
int read_sysfs_file(const char* dir, const char* file, char* buf, std::size_t size) noexcept {
  if (dir == nullptr || file == nullptr || (buf == nullptr && size != 0)) {
    errno = EINVAL;
    return -1;
  }
  try {
    const std::string path = join_path(dir, file);
    const std::string_view p = path;
    const std::string_view ibdev = kIbdevPath;
    const std::string_view uverbs = kDevicePath;
    if (p == ibdev || p == uverbs) {
      errno = EISDIR;
      return -1;
    }
    if (p.starts_with(ibdev) && p[ibdev.size()] == '/') return deliver(fake_ibdev_file(p.substr(ibdev.size() + 1)), buf, size);
    if (p.starts_with(uverbs) && p[uverbs.size()] == '/') {
      if (p.substr(uverbs.size() + 1) == "ibdev") return deliver({std::string(engine::kDeviceName)}, buf, size);
      errno = ENOENT;
      return -1;
    }
    return read_real_file(path.c_str(), buf, size);
  } catch (...) {
    errno = ENOMEM;
    return -1;
  }
}

}  // namespace

DeviceHandle& device_handle() noexcept { return g_device; }

bool is_softhca_device(const ibv_device* device) noexcept { return device != nullptr && device == &g_device.device; }

int read_ibdev_sysfs(const char* relative_path, char* buf, std::size_t size) noexcept {
  try {
    if (relative_path == nullptr || (buf == nullptr && size != 0)) {
      errno = EINVAL;
      return -1;
    }
    std::string_view rel(relative_path);
    while (rel.starts_with('/')) rel.remove_prefix(1);
    return deliver(fake_ibdev_file(rel), buf, size);
  } catch (...) {
    errno = ENOMEM;
    return -1;
  }
}

}  // namespace softhca::abi

using softhca::abi::device_handle;
using softhca::abi::is_softhca_device;

extern "C" {

ibv_device** ibv_get_device_list(int* num_devices) {
  if (num_devices != nullptr) *num_devices = 0;
  auto** list = static_cast<ibv_device**>(std::calloc(2, sizeof(ibv_device*)));
  if (list == nullptr) {
    errno = ENOMEM;
    return nullptr;
  }
  list[0] = &device_handle().device;
  if (num_devices != nullptr) *num_devices = 1;
  return list;
}

void ibv_free_device_list(ibv_device** list) { std::free(list); }

const char* ibv_get_device_name(ibv_device* device) {
  if (device == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  return device->name;
}

// Both fail with errno set: rdma-core's answer comes from sysfs reads, whose
// errno is left behind.
__be64 ibv_get_device_guid(ibv_device* device) {
  if (!is_softhca_device(device)) {
    errno = EINVAL;
    return 0;
  }
  try {
    return htobe64(softhca::engine::device_info().node_guid);
  } catch (...) {
    errno = EIO;
    return 0;
  }
}

int ibv_get_device_index(ibv_device* device) {
  if (is_softhca_device(device)) return 0;
  errno = EINVAL;
  return -1;
}

const char* ibv_get_sysfs_path(void) { return "/sys"; }

int ibv_read_sysfs_file(const char* dir, const char* file, char* buf, size_t size) {
  return softhca::abi::read_sysfs_file(dir, file, buf, size);
}

}  // extern "C"
