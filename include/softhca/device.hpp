// softhca C++ API: device enumeration (DeviceList) and an open device (Context).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <span>
#include <string_view>

#include "error.hpp"
#include "handle.hpp"

namespace softhca {

namespace detail {
struct DeviceListTraits {
  static constexpr const char* verb = "ibv_free_device_list";
  static int destroy(ibv_device** l) noexcept {
    ibv_free_device_list(l);
    return 0;
  }
};
struct ContextTraits {
  static constexpr const char* verb = "ibv_close_device";
  static int destroy(ibv_context* c) noexcept { return ibv_close_device(c); }
};
}  // namespace detail

// The RDMA devices present when it was created. The ibv_device pointers stay
// valid while the list lives; a Context opened from one does not need it after.
class DeviceList : public detail::Handle<ibv_device*, detail::DeviceListTraits> {
 public:
  DeviceList() noexcept = default;

  static Expected<DeviceList> create() noexcept {
    int n = 0;
    errno = 0;
    auto l = detail::check_ptr(ibv_get_device_list(&n), "ibv_get_device_list");
    if (!l) return std::unexpected(l.error());
    return DeviceList(*l, static_cast<std::size_t>(n));
  }
  static DeviceList make() { return value_or_throw(create()); }

  std::span<ibv_device* const> devices() const noexcept { return {get(), get() ? size_ : 0}; }
  std::size_t size() const noexcept { return devices().size(); }
  bool empty() const noexcept { return size() == 0; }
  ibv_device* operator[](std::size_t i) const noexcept { return devices()[i]; }
  auto begin() const noexcept { return devices().begin(); }
  auto end() const noexcept { return devices().end(); }

  // The device called `name` (ibv_get_device_name), or nullptr.
  ibv_device* find(std::string_view name) const noexcept {
    for (ibv_device* d : devices())
      if (name == ibv_get_device_name(d)) return d;
    return nullptr;
  }

 private:
  DeviceList(ibv_device** l, std::size_t n) noexcept : Handle(l), size_(n) {}
  std::size_t size_ = 0;
};

class Context : public detail::Handle<ibv_context, detail::ContextTraits> {
 public:
  using Handle::Handle;

  static Expected<Context> create(ibv_device* dev) noexcept {
    if (dev == nullptr) return std::unexpected(Error(ENODEV, "ibv_open_device"));
    errno = 0;
    auto c = detail::check_ptr(ibv_open_device(dev), "ibv_open_device");
    if (!c) return std::unexpected(c.error());
    return Context(*c);
  }
  // Opens the device called `name`; ENODEV when there is none. An empty name
  // opens the first device, which is what most single-NIC programs want.
  static Expected<Context> create(std::string_view name = {}) noexcept {
    auto list = DeviceList::create();
    if (!list) return std::unexpected(list.error());
    ibv_device* d = name.empty() ? (list->empty() ? nullptr : (*list)[0]) : list->find(name);
    return create(d);
  }
  static Context make(ibv_device* dev) { return value_or_throw(create(dev)); }
  static Context make(std::string_view name = {}) { return value_or_throw(create(name)); }

  Expected<ibv_device_attr> query_device() const noexcept {
    ibv_device_attr a{};
    errno = 0;
    if (auto r = detail::check_rc(ibv_query_device(get(), &a), "ibv_query_device"); !r)
      return std::unexpected(r.error());
    return a;
  }
  Expected<ibv_port_attr> query_port(std::uint8_t port = 1) const noexcept {
    ibv_port_attr a{};
    errno = 0;
    if (auto r = detail::check_rc(ibv_query_port(get(), port, &a), "ibv_query_port"); !r)
      return std::unexpected(r.error());
    return a;
  }
  Expected<ibv_gid> query_gid(std::uint8_t port = 1, int index = 0) const noexcept {
    ibv_gid g{};
    errno = 0;
    if (auto r = detail::check_rc(ibv_query_gid(get(), port, index, &g), "ibv_query_gid"); !r)
      return std::unexpected(r.error());
    return g;
  }

  std::string_view name() const noexcept { return get() ? ibv_get_device_name(get()->device) : ""; }
};

}  // namespace softhca
