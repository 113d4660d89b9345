// softhca devices: list RDMA devices through the verbs API: name, node GUID,
// and per port its state, link layer, MTU and non-empty GID entries.
#include <arpa/inet.h>
#include <endian.h>
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "commands.hpp"

namespace softhca::tool {
namespace {

struct DeviceListDeleter {
  void operator()(ibv_device** list) const { ibv_free_device_list(list); }
};
struct ContextDeleter {
  void operator()(ibv_context* context) const { ibv_close_device(context); }
};

std::string format_guid(__be64 guid_be) {
  const std::uint64_t guid = be64toh(guid_be);
  char text[20];
  std::snprintf(text, sizeof text, "%04x:%04x:%04x:%04x", static_cast<unsigned>(guid >> 48),
                static_cast<unsigned>((guid >> 32) & 0xffff),
                static_cast<unsigned>((guid >> 16) & 0xffff), static_cast<unsigned>(guid & 0xffff));
  return text;
}

std::string format_gid(const ibv_gid& gid) {
  char text[INET6_ADDRSTRLEN];
  if (inet_ntop(AF_INET6, gid.raw, text, sizeof text) == nullptr) {
    return "?";
  }
  return text;
}

bool is_zero(const ibv_gid& gid) {
  for (const std::uint8_t byte : gid.raw) {
    if (byte != 0) {
      return false;
    }
  }
  return true;
}

const char* link_layer_name(std::uint8_t link_layer) {
  switch (link_layer) {
    case IBV_LINK_LAYER_ETHERNET:
      return "Ethernet";
    case IBV_LINK_LAYER_INFINIBAND:
      return "InfiniBand";
    default:
      return "unspecified";
  }
}

const char* gid_type_name(std::uint32_t type) {
  switch (type) {
    case IBV_GID_TYPE_IB:
      return "IB";
    case IBV_GID_TYPE_ROCE_V1:
      return "RoCE v1";
    case IBV_GID_TYPE_ROCE_V2:
      return "RoCE v2";
    default:
      return "unknown type";
  }
}

int mtu_bytes(ibv_mtu mtu) { return mtu >= IBV_MTU_256 ? 128 << mtu : 0; }

// Prints the non-empty GID entries of one port; returns false on a query error.
bool print_gids(ibv_context* context, std::uint8_t port, int table_length) {
  bool ok = true;
  for (int index = 0; index < table_length; ++index) {
    ibv_gid_entry entry{};
    const int ret = ibv_query_gid_ex(context, port, static_cast<std::uint32_t>(index), &entry, 0);
    if (ret == 0) {
      if (!is_zero(entry.gid)) {
        std::printf("    gid %-3d %-40s %s\n", index, format_gid(entry.gid).c_str(),
                    gid_type_name(entry.gid_type));
      }
      continue;
    }
    if (ret == ENODATA) {  // an empty entry
      continue;
    }
    // Without the extended query, fall back to the plain one (no type).
    ibv_gid gid{};
    if (ibv_query_gid(context, port, index, &gid) != 0) {
      std::fprintf(stderr, "softhca devices: %s port %u: cannot query gid %d: %s\n",
                   ibv_get_device_name(context->device), port, index, std::strerror(ret));
      ok = false;
      break;
    }
    if (!is_zero(gid)) {
      std::printf("    gid %-3d %s\n", index, format_gid(gid).c_str());
    }
  }
  return ok;
}

// Prints one device; returns false if it could not be opened or queried.
bool print_device(ibv_device* device) {
  const char* name = ibv_get_device_name(device);
  std::printf("%s  node_guid %s\n", name, format_guid(ibv_get_device_guid(device)).c_str());

  const std::unique_ptr<ibv_context, ContextDeleter> context(ibv_open_device(device));
  if (!context) {
    std::fprintf(stderr, "softhca devices: cannot open %s: %s\n", name, std::strerror(errno));
    return false;
  }
  ibv_device_attr attr{};
  if (const int ret = ibv_query_device(context.get(), &attr); ret != 0) {
    std::fprintf(stderr, "softhca devices: cannot query %s: %s\n", name, std::strerror(ret));
    return false;
  }
  std::printf("  vendor 0x%x part %u  fw %s  ports %u\n", attr.vendor_id, attr.vendor_part_id,
              attr.fw_ver[0] != '\0' ? attr.fw_ver : "-", attr.phys_port_cnt);

  bool ok = true;
  for (unsigned port = 1; port <= attr.phys_port_cnt; ++port) {
    ibv_port_attr port_attr{};
    if (const int ret = ibv_query_port(context.get(), static_cast<std::uint8_t>(port), &port_attr);
        ret != 0) {
      std::fprintf(stderr, "softhca devices: cannot query %s port %u: %s\n", name, port,
                   std::strerror(ret));
      ok = false;
      continue;
    }
    std::printf("  port %u  %s  %s  mtu %d (max %d)  gid table %d\n", port,
                ibv_port_state_str(port_attr.state), link_layer_name(port_attr.link_layer),
                mtu_bytes(port_attr.active_mtu), mtu_bytes(port_attr.max_mtu),
                port_attr.gid_tbl_len);
    ok = print_gids(context.get(), static_cast<std::uint8_t>(port), port_attr.gid_tbl_len) && ok;
  }
  return ok;
}

int devices_main(std::span<char* const> args) {
  std::string_view wanted;
  for (const char* arg : args) {
    if (std::string_view(arg).starts_with("-") || !wanted.empty()) {
      std::fprintf(stderr, "softhca devices: unexpected argument '%s'; usage: softhca devices [NAME]\n",
                   arg);
      return kExitUsage;
    }
    wanted = arg;
  }

  int count = 0;
  const std::unique_ptr<ibv_device*[], DeviceListDeleter> list(ibv_get_device_list(&count));
  if (!list) {
    std::fprintf(stderr, "softhca devices: cannot list devices: %s\n", std::strerror(errno));
    return kExitFailure;
  }
  bool ok = true;
  int shown = 0;
  for (int i = 0; i < count; ++i) {
    if (!wanted.empty() && wanted != ibv_get_device_name(list[i])) {
      continue;
    }
    if (shown++ > 0) {
      std::putchar('\n');
    }
    ok = print_device(list[i]) && ok;
  }
  if (shown == 0) {
    if (wanted.empty()) {
      std::fputs("softhca devices: no RDMA devices found\n", stderr);
    } else {
      std::fprintf(stderr, "softhca devices: no device named '%.*s'\n",
                   static_cast<int>(wanted.size()), wanted.data());
    }
    return kExitFailure;
  }
  return ok ? kExitOk : kExitFailure;
}

}  // namespace

const Command kDevicesCommand = {
    .name = "devices",
    .summary = "list devices, port states and GIDs: softhca devices [NAME]",
    .help =
        "usage: softhca devices [NAME]\n"
        "\n"
        "Lists the RDMA devices that softhca's libibverbs.so.1 provides (or only\n"
        "NAME), with the node GUID, vendor and firmware, and for each port its\n"
        "state, link layer, active and maximum MTU and every non-empty GID entry\n"
        "with its type. The GID index is what ibv_*_pingpong -g and perftest -x take.\n"
        "\n"
        "exit status: 0 if every listed device was queried, 1 if none was found or a\n"
        "query failed, 2 on a usage error.\n",
    .main = devices_main,
};

}  // namespace softhca::tool
