// The one ibv_device softhca exposes (softhca0), and its fake sysfs tree.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>

#include "handles.hpp"

namespace softhca::abi {

inline constexpr char kDevicePath[] = "/sys/class/infiniband_verbs/uverbs0";  // ibv_device.dev_path
inline constexpr char kIbdevPath[] = "/sys/class/infiniband/softhca0";        // ibv_device.ibdev_path
inline constexpr char kFirmwareVersion[] = "softhca 0.1.0";                   // fw_ver
inline constexpr char kBoardId[] = "SOFTHCA-0001";
inline constexpr char kHcaType[] = "softhca";

// The static device handle that ibv_get_device_list hands out (never freed).
DeviceHandle& device_handle() noexcept;
bool is_softhca_device(const ibv_device* device) noexcept;

// Reads a file of the fake sysfs tree under kIbdevPath, path relative to it
// ("board_id", "ports/1/gids/0"), with ibv_read_sysfs_file's result convention:
// the length without the trailing newline, or -1 with errno (ENOENT: no such file).
// For an ibv_read_ibdev_sysfs_file replacement.
int read_ibdev_sysfs(const char* relative_path, char* buf, std::size_t size) noexcept;

}  // namespace softhca::abi
