// The device files of softhca0 in a private mount namespace; the header says
// why and what.
#include "device_files.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <expected>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

// Exported by every libibverbs.so.1 (IBVERBS_1.0), declared only in rdma-core's
// driver.h, which Debian does not ship. Ours serves softhca0's files from the
// values behind ibv_query_device/port/gid.
extern "C" int ibv_read_sysfs_file(const char* dir, const char* file, char* buf, size_t size);

namespace softhca::tool {
namespace {

std::string errno_text(std::string_view what, int err) {
  return std::string(what) + ": " + std::strerror(err);
}

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  bool ok() const { return fd_ >= 0; }

 private:
  int fd_;
};

// ---- reading the tree from libibverbs ------------------------------------------

// One file of the library's tree: its content, nothing when the library has no
// such file (ENOENT) or refuses the read as the kernel does for an empty GID
// entry's attributes (EINVAL; a tmpfs file cannot fail a read, and UCX takes
// a missing file as it takes an unreadable one), or an error.
std::expected<std::optional<std::string>, std::string> read_library_file(const std::string& dir,
                                                                         const std::string& rel) {
  std::array<char, 4096> buf{};
  errno = 0;
  const int n = ibv_read_sysfs_file(dir.c_str(), rel.c_str(), buf.data(), buf.size());
  if (n >= 0) return std::string(buf.data(), static_cast<std::size_t>(n));
  if (errno == ENOENT || errno == EINVAL) return std::nullopt;
  return std::unexpected(errno_text("ibv_read_sysfs_file(" + dir + "/" + rel + ")", errno));
}

// Reads each of `names` that the library has into `out`.
std::expected<void, std::string> collect(const std::string& dir, const std::string& prefix,
                                         std::initializer_list<std::string_view> names,
                                         std::vector<TreeFile>& out) {
  for (const std::string_view name : names) {
    const std::string rel = prefix + std::string(name);
    auto content = read_library_file(dir, rel);
    if (!content) return std::unexpected(content.error());
    if (*content) out.push_back({rel, std::move(**content)});
  }
  return {};
}

// Reads prefix0, prefix1, ... until the library has no such file (past the
// table's end), bounded for safety.
std::expected<int, std::string> collect_indexed(const std::string& dir, const std::string& prefix,
                                                std::vector<TreeFile>& out) {
  constexpr int kMaxEntries = 4096;
  int count = 0;
  for (; count < kMaxEntries; ++count) {
    const std::string rel = prefix + std::to_string(count);
    auto content = read_library_file(dir, rel);
    if (!content) return std::unexpected(content.error());
    if (!*content) break;
    out.push_back({rel, std::move(**content)});
  }
  return count;
}

}  // namespace

std::expected<DeviceFiles, std::string> read_device_files() {
  int count = 0;
  ibv_device** list = ibv_get_device_list(&count);
  if (list == nullptr) return std::unexpected(errno_text("ibv_get_device_list", errno));
  DeviceFiles files;
  if (count > 0) {
    const ibv_device* device = list[0];  // softhca has exactly one device
    files.name = device->name;
    files.ibdev_path = device->ibdev_path;
    files.dev_path = device->dev_path;
    files.dev_name = device->dev_name;
  }
  ibv_free_device_list(list);
  if (count <= 0) return std::unexpected("the libibverbs.so.1 softhca is linked with lists no device");
  if (files.dev_name.empty() || files.dev_name.find('/') != std::string::npos ||
      !files.ibdev_path.starts_with("/sys/") || !files.dev_path.starts_with("/sys/")) {
    return std::unexpected("unexpected device paths from libibverbs: " + files.ibdev_path + ", " +
                           files.dev_path + ", " + files.dev_name);
  }

  // The kernel's layout (drivers/infiniband/core/sysfs.c); the values are the library's.
  auto& ib = files.ibdev_files;
  if (auto ok = collect(files.ibdev_path, "",
                        {"node_type", "node_guid", "sys_image_guid", "node_desc", "fw_ver", "hca_type",
                         "hw_rev", "board_id", "device/numa_node", "device/local_cpus"},
                        ib);
      !ok) {
    return std::unexpected(ok.error());
  }
  for (int port = 1;; ++port) {
    const std::string p = "ports/" + std::to_string(port) + "/";
    auto state = read_library_file(files.ibdev_path, p + "state");
    if (!state) return std::unexpected(state.error());
    if (!*state) break;
    if (auto ok = collect(files.ibdev_path, p,
                          {"state", "phys_state", "link_layer", "rate", "lid", "sm_lid", "lid_mask_count",
                           "sm_sl", "cap_mask"},
                          ib);
        !ok) {
      return std::unexpected(ok.error());
    }
    if (auto n = collect_indexed(files.ibdev_path, p + "pkeys/", ib); !n) return std::unexpected(n.error());
    auto gids = collect_indexed(files.ibdev_path, p + "gids/", ib);
    if (!gids) return std::unexpected(gids.error());
    // types/N and ndevs/N exist for the filled entries only (see read_library_file).
    for (int index = 0; index < *gids; ++index) {
      const std::string i = std::to_string(index);
      if (auto ok = collect(files.ibdev_path, p, {"gid_attrs/types/" + i, "gid_attrs/ndevs/" + i}, ib); !ok) {
        return std::unexpected(ok.error());
      }
    }
  }
  if (ib.empty()) return std::unexpected("libibverbs serves no sysfs file for " + files.ibdev_path);
  if (auto ok = collect(files.dev_path, "", {"ibdev"}, files.dev_files); !ok) return std::unexpected(ok.error());
  return files;
}

namespace {

// ---- the namespaces --------------------------------------------------------------

std::expected<void, std::string> write_proc_file(const char* path, const std::string& text) {
  const Fd fd(::open(path, O_WRONLY | O_CLOEXEC));
  if (!fd.ok()) return std::unexpected(errno_text(std::string("open ") + path, errno));
  if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    return std::unexpected(errno_text(std::string("write ") + path, errno));
  }
  return {};
}

// A mount namespace of our own. Root needs nothing else. Without
// CAP_SYS_ADMIN a user namespace comes first, in which we hold it; it maps
// only our uid and gid, each to itself, so the program runs as the same user
// with the same file ownership (others' files show as the overflow id), and
// softhca processes inside and outside still share their runtime directory.
std::expected<Isolation, std::string> unshare_namespaces() {
  if (::unshare(CLONE_NEWNS) == 0) return Isolation::kMountNamespace;
  if (errno != EPERM) return std::unexpected(errno_text("unshare(CLONE_NEWNS)", errno));
  const uid_t uid = ::geteuid();
  const gid_t gid = ::getegid();
  if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) {
    const int err = errno;
    // EINVAL: more than one thread; EPERM/ENOSPC: user namespaces are off
    // (user.max_user_namespaces, kernel.unprivileged_userns_clone, a seccomp filter).
    return std::unexpected(errno_text("unshare(CLONE_NEWUSER|CLONE_NEWNS)", err) +
                           (err == EPERM || err == ENOSPC ? " (user namespaces not allowed here?)" : ""));
  }
  // An unprivileged process may map its gid only after giving up setgroups(2).
  // (Kernels before 3.19 have no setgroups file and need no such step.)
  if (::access("/proc/self/setgroups", F_OK) == 0) {
    if (auto ok = write_proc_file("/proc/self/setgroups", "deny"); !ok) return std::unexpected(ok.error());
  }
  if (auto ok = write_proc_file("/proc/self/uid_map", std::to_string(uid) + " " + std::to_string(uid) + " 1\n");
      !ok) {
    return std::unexpected(ok.error());
  }
  if (auto ok = write_proc_file("/proc/self/gid_map", std::to_string(gid) + " " + std::to_string(gid) + " 1\n");
      !ok) {
    return std::unexpected(ok.error());
  }
  return Isolation::kUserMountNamespace;
}

std::string parent_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
}

// The mounts of one namespace setup, taken down in reverse on failure.
class MountBuilder {
 public:
  ~MountBuilder() {
    if (committed_) return;
    for (auto it = mounted_.rbegin(); it != mounted_.rend(); ++it) ::umount2(it->c_str(), MNT_DETACH);
  }
  void commit() { committed_ = true; }

  // Makes `dir` an empty directory that we may write into: a tmpfs on it if
  // it exists; otherwise a directory made in its parent, which is covered
  // first (see cover) unless it is one of our tmpfs already.
  std::expected<void, std::string> provide_dir(const std::string& dir, unsigned long flags) {
    struct stat st {};
    if (::lstat(dir.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) return std::unexpected(dir + " exists and is not a directory");
      if (is_ours(dir)) return {};
      return mount_tmpfs(dir, flags, 0755);
    }
    if (errno != ENOENT) return std::unexpected(errno_text("stat " + dir, errno));
    const std::string parent = parent_of(dir);
    if (!is_ours(parent)) {
      if (auto ok = cover(parent, flags); !ok) return ok;
    }
    if (::mkdir(dir.c_str(), 0755) != 0) return std::unexpected(errno_text("mkdir " + dir, errno));
    ours_.push_back(dir);
    return {};
  }

  // A character device at `path` (in a directory of ours) that anyone may open
  // read-write: /dev/null bound onto an empty file.
  std::expected<void, std::string> bind_null_device(const std::string& path) {
    if (auto ok = make_placeholder(path); !ok) return ok;
    if (::mount("/dev/null", path.c_str(), nullptr, MS_BIND, nullptr) != 0) {
      return std::unexpected(errno_text("bind /dev/null onto " + path, errno));
    }
    mounted_.push_back(path);
    return {};
  }

  // Read-only from now on, as sysfs is to a program: our tmpfs mounts under `prefix`.
  std::expected<void, std::string> seal(std::string_view prefix, unsigned long flags) {
    for (const auto& [dir, tmpfs_flags] : tmpfs_) {
      if (!dir.starts_with(prefix)) continue;
      if (::mount(nullptr, dir.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY | flags, nullptr) != 0) {
        return std::unexpected(errno_text("remount " + dir + " read-only", errno));
      }
    }
    return {};
  }

 private:
  // A directory we may write into: one of our tmpfs mounts or a directory
  // made in one (not an entry bound back into a covering tmpfs: that is the
  // real directory).
  bool is_ours(const std::string& dir) const {
    for (const std::string& mine : ours_) {
      if (dir == mine) return true;
    }
    return false;
  }

  std::expected<void, std::string> mount_tmpfs(const std::string& dir, unsigned long flags, mode_t mode) {
    char options[32];
    std::snprintf(options, sizeof options, "mode=%04o", static_cast<unsigned>(mode & 07777));
    if (::mount("tmpfs", dir.c_str(), "tmpfs", flags, options) != 0) {
      return std::unexpected(errno_text("mount a tmpfs on " + dir, errno));
    }
    mounted_.push_back(dir);
    tmpfs_.emplace_back(dir, flags);
    ours_.push_back(dir);
    return {};
  }

  static std::expected<void, std::string> make_placeholder(const std::string& path) {
    const Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!fd.ok()) return std::unexpected(errno_text("create " + path, errno));
    return {};
  }

  // Puts a tmpfs on `dir` that shows what `dir` showed: each entry bound back
  // from the covered directory (recursively, with the mounts below it),
  // symbolic links copied. The covered directory stays reachable through a
  // descriptor opened before the tmpfs went on top; with it as our working
  // directory, a relative source path of mount(2) resolves beneath the tmpfs.
  // Entries that appear in the real `dir` later are not seen inside.
  std::expected<void, std::string> cover(const std::string& dir, unsigned long flags) {
    const Fd covered(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!covered.ok()) return std::unexpected(errno_text("open " + dir, errno));
    struct stat dir_st {};
    if (::fstat(covered.get(), &dir_st) != 0) return std::unexpected(errno_text("stat " + dir, errno));

    struct Entry {
      std::string name;
      mode_t mode;
      std::string link;  // the target of a symbolic link
    };
    std::vector<Entry> entries;
    {
      DIR* listing = ::fdopendir(::dup(covered.get()));
      if (listing == nullptr) return std::unexpected(errno_text("list " + dir, errno));
      while (const dirent* e = ::readdir(listing)) {
        const std::string_view name = e->d_name;
        if (name == "." || name == "..") continue;
        struct stat st {};
        if (::fstatat(covered.get(), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // gone meanwhile
        Entry entry{std::string(name), st.st_mode, {}};
        if (S_ISLNK(st.st_mode)) {
          std::array<char, 4096> target{};
          const ssize_t n = ::readlinkat(covered.get(), e->d_name, target.data(), target.size() - 1);
          if (n < 0) continue;
          entry.link.assign(target.data(), static_cast<std::size_t>(n));
        }
        entries.push_back(std::move(entry));
      }
      ::closedir(listing);
    }

    const Fd cwd(::open(".", O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (auto ok = mount_tmpfs(dir, flags, dir_st.st_mode); !ok) return ok;
    if (::fchdir(covered.get()) != 0) return std::unexpected(errno_text("chdir to the covered " + dir, errno));
    auto result = [&]() -> std::expected<void, std::string> {
      for (const Entry& entry : entries) {
        const std::string target = dir + "/" + entry.name;
        if (S_ISLNK(entry.mode)) {
          if (::symlink(entry.link.c_str(), target.c_str()) != 0) {
            return std::unexpected(errno_text("symlink " + target, errno));
          }
          continue;
        }
        if (S_ISDIR(entry.mode)) {
          if (::mkdir(target.c_str(), entry.mode & 07777) != 0) {
            return std::unexpected(errno_text("mkdir " + target, errno));
          }
        } else if (auto ok = make_placeholder(target); !ok) {
          return ok;
        }
        // MS_REC: the mounts below come along (/dev/shm, /dev/pts); in a user
        // namespace a tree whose mounts are locked together may only be bound whole.
        if (::mount(entry.name.c_str(), target.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) {
          return std::unexpected(errno_text("bind " + dir + "/" + entry.name + " back", errno));
        }
      }
      return {};
    }();
    if ((cwd.ok() ? ::fchdir(cwd.get()) : ::chdir("/")) != 0 && result) {
      result = std::unexpected(errno_text("chdir back", errno));
    }
    return result;
  }

  std::vector<std::string> mounted_;                            // top-level mounts, in order
  std::vector<std::pair<std::string, unsigned long>> tmpfs_;    // our tmpfs mounts and their flags
  std::vector<std::string> ours_;                               // see is_ours
  bool committed_ = false;
};

std::expected<void, std::string> write_tree(const std::string& root, const std::vector<TreeFile>& files) {
  // The directories of `path` below `root` (which exists).
  auto make_dirs = [&root](const std::string& path) -> std::expected<void, std::string> {
    for (std::size_t slash = path.find('/', root.size() + 1); slash != std::string::npos;
         slash = path.find('/', slash + 1)) {
      const std::string dir = path.substr(0, slash);
      if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
        return std::unexpected(errno_text("mkdir " + dir, errno));
      }
    }
    return {};
  };
  for (const TreeFile& file : files) {
    const std::string path = root + "/" + file.path;
    if (auto ok = make_dirs(path); !ok) return ok;
    const Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0444));
    if (!fd.ok()) return std::unexpected(errno_text("create " + path, errno));
    const std::string text = file.content + "\n";
    if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
      return std::unexpected(errno_text("write " + path, errno));
    }
  }
  return {};
}

}  // namespace

std::expected<Isolation, std::string> enter_device_namespace(const DeviceFiles& files) {
  auto isolation = unshare_namespaces();
  if (!isolation) return isolation;
  // Nothing we mount may propagate back to the host's namespace (systemd
  // makes / shared, and a copied shared mount would carry our mounts out).
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    return std::unexpected(errno_text("make the mounts private", errno));
  }

  MountBuilder mounts;
  // /dev: the covering tmpfs holds device bindings, so it must not be nodev.
  if (auto ok = mounts.provide_dir(kDevInfiniband, MS_NOSUID); !ok) return std::unexpected(ok.error());
  for (const std::string& name : {files.dev_name, std::string("rdma_cm")}) {
    if (auto ok = mounts.bind_null_device(std::string(kDevInfiniband) + "/" + name); !ok) {
      return std::unexpected(ok.error());
    }
  }

  constexpr unsigned long kSysFlags = MS_NOSUID | MS_NODEV | MS_NOEXEC;
  for (const auto* tree : {&files.ibdev_path, &files.dev_path}) {
    if (auto ok = mounts.provide_dir(parent_of(*tree), kSysFlags); !ok) return std::unexpected(ok.error());
    if (::mkdir(tree->c_str(), 0755) != 0) return std::unexpected(errno_text("mkdir " + *tree, errno));
  }
  if (auto ok = write_tree(files.ibdev_path, files.ibdev_files); !ok) return std::unexpected(ok.error());
  if (auto ok = write_tree(files.dev_path, files.dev_files); !ok) return std::unexpected(ok.error());
  if (auto ok = mounts.seal("/sys/", kSysFlags); !ok) return std::unexpected(ok.error());
  mounts.commit();
  return isolation;
}

}  // namespace softhca::tool
