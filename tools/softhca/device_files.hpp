// The device files of softhca0, for programs that look at the file system
// before they use the verbs (issue 13).
//
// softhca's libibverbs needs no device file, but some stacks check for one
// and drop a device that lacks it, without a word: UCX 1.13 keeps an
// ibv_device only if /dev/infiniband/<dev_name> is a character device it may
// open read-write (uct_ib_device_is_accessible), and it reads the device's
// sysfs tree itself (GID types and net devices, NUMA node, local CPUs)
// instead of asking libibverbs. Open MPI's ucx pml inherits both.
//
// `softhca run` and `softhca shell` therefore give the program a private
// mount namespace in which those files exist:
//   /dev/infiniband/<dev_name> (uverbs0) and /dev/infiniband/rdma_cm: /dev/null
//     bound onto them, a character device anyone may open read-write;
//   /sys/class/infiniband/softhca0/...: regular files on a tmpfs, with the
//     contents our libibverbs serves through ibv_read_sysfs_file;
//   /sys/class/infiniband_verbs/uverbs0/ibdev.
// Nothing changes outside the namespace. Where a directory to mount on is
// missing (no /dev/infiniband on a machine without RDMA hardware), it cannot
// be created on the real /dev or /sys, so its parent is covered instead by a
// tmpfs into which every entry of the original is bound back (directories
// recursively, with their sub-mounts: /dev/shm, where softhca's runtime
// directory lives, stays the very same file system, so processes inside and
// outside the namespace still find each other).
#pragma once

#include <expected>
#include <string>
#include <vector>

namespace softhca::tool {

struct TreeFile {
  std::string path;     // relative to the tree's directory: "ports/1/gids/0"
  std::string content;  // without the trailing newline
};

// What our libibverbs reports for its device, in sysfs form.
struct DeviceFiles {
  std::string name;        // ibv_get_device_name: softhca0
  std::string ibdev_path;  // ibv_device.ibdev_path: /sys/class/infiniband/softhca0
  std::string dev_path;    // ibv_device.dev_path: /sys/class/infiniband_verbs/uverbs0
  std::string dev_name;    // ibv_device.dev_name: uverbs0, as in /dev/infiniband/uverbs0
  std::vector<TreeFile> ibdev_files;  // under ibdev_path
  std::vector<TreeFile> dev_files;    // under dev_path
};

// Asks the libibverbs this tool is linked with (softhca's: ibv_get_device_list
// and ibv_read_sysfs_file, which serve the values that ibv_query_* report) for
// every file of the kernel's layout that UCX and rdma-core read. Opens no
// device, so it starts no thread (a user namespace needs a single thread).
std::expected<DeviceFiles, std::string> read_device_files();

enum class Isolation {
  kMountNamespace,      // root: a mount namespace alone
  kUserMountNamespace,  // otherwise: a user namespace mapping our uid and gid to themselves, and a mount namespace
};

// Moves this process into a private mount namespace (inside a user namespace
// when it lacks CAP_SYS_ADMIN) and mounts `files` there, for the program it
// execs next. On an error the mounts made so far are taken down again, so
// the process sees the file system as before (it stays in the namespaces).
std::expected<Isolation, std::string> enter_device_namespace(const DeviceFiles& files);

// Where the character devices go.
inline constexpr char kDevInfiniband[] = "/dev/infiniband";

}  // namespace softhca::tool
