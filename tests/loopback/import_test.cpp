// Importing objects (ibv_import_device / _pd / _mr / _dm): a context opened
// on a dup of another's cmd_fd shares that context's objects, in one process,
// and owns that fd (ibv_close_device closes it, as rdma-core's does).
#include <fcntl.h>
#include <unistd.h>

#include "loopback.hpp"

namespace {

using loopback::Device;

TEST(Import, ADupOfCmdFdOpensTheSameContextWithItsObjects) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  std::vector<uint8_t> bytes(4096, 0x11);
  ibv_mr* mr = ibv_reg_mr(dev.pd, bytes.data(), bytes.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  ibv_alloc_dm_attr dm_attr{};
  dm_attr.length = 64;
  ibv_dm* dm = ibv_alloc_dm(dev.ctx, &dm_attr);
  ASSERT_NE(dm, nullptr);

  const int fd = ::dup(dev.ctx->cmd_fd);
  ASSERT_GE(fd, 0);
  ibv_context* imported = ibv_import_device(fd);
  ASSERT_NE(imported, nullptr) << "errno " << errno;
  EXPECT_EQ(imported->cmd_fd, fd);  // the fd it was given is its own now
  ibv_pd* pd = ibv_import_pd(imported, dev.pd->handle);
  ASSERT_NE(pd, nullptr) << "errno " << errno;
  ibv_mr* mr2 = ibv_import_mr(pd, mr->handle);
  ASSERT_NE(mr2, nullptr) << "errno " << errno;
  EXPECT_EQ(mr2->lkey, mr->lkey);
  EXPECT_EQ(mr2->rkey, mr->rkey);
  EXPECT_EQ(mr2->length, mr->length);
  EXPECT_EQ(mr2->addr, nullptr);  // as rdma-core's import
  ibv_dm* dm2 = ibv_import_dm(imported, dm->handle);
  ASSERT_NE(dm2, nullptr) << "errno " << errno;
  const uint32_t word = 0xC0FFEE00;
  ASSERT_EQ(ibv_memcpy_to_dm(dm, 8, &word, 4), 0);
  uint32_t seen = 0;
  ASSERT_EQ(ibv_memcpy_from_dm(&seen, dm2, 8, 4), 0);
  EXPECT_EQ(seen, word);
  // Handles nobody has, and an MR asked for through another PD.
  ibv_pd* other = ibv_alloc_pd(imported);
  ASSERT_NE(other, nullptr);
  errno = 0;
  EXPECT_EQ(ibv_import_mr(other, mr->handle), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_import_pd(imported, 0xFFFFFFF0u), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_import_dm(imported, 0xFFFFFFF0u), nullptr);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(ibv_dealloc_pd(other), 0);

  // Unimporting frees the handles only: the objects still work.
  ibv_unimport_dm(dm2);
  ibv_unimport_mr(mr2);
  ibv_unimport_pd(pd);
  ASSERT_EQ(ibv_memcpy_from_dm(&seen, dm, 8, 4), 0);
  EXPECT_EQ(seen, word);
  EXPECT_EQ(ibv_free_dm(dm), 0);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  // Either context may close first; the other goes on. Closing the
  // imported one closed the fd it was given (rdma-core's rule), and only it.
  EXPECT_EQ(ibv_close_device(imported), 0);
  errno = 0;
  EXPECT_EQ(::fcntl(fd, F_GETFD), -1);
  EXPECT_EQ(errno, EBADF);
  EXPECT_GE(::fcntl(dev.ctx->cmd_fd, F_GETFD), 0);
  ibv_cq* cq = ibv_create_cq(dev.ctx, 4, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

TEST(Import, TheImporterOutlivesTheOpener) {
  int fd = -1;
  int kept = -1;  // another dup, for after the importer closed its own
  ibv_context* imported = nullptr;
  {
    Device dev;
    ASSERT_TRUE(dev.ok());
    fd = ::dup(dev.ctx->cmd_fd);
    kept = ::dup(dev.ctx->cmd_fd);
    ASSERT_TRUE(fd >= 0 && kept >= 0);
    imported = ibv_import_device(fd);
    ASSERT_NE(imported, nullptr);
  }
  ibv_pd* pd = ibv_alloc_pd(imported);
  ASSERT_NE(pd, nullptr);
  ibv_cq* cq = ibv_create_cq(imported, 4, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
  EXPECT_EQ(ibv_close_device(imported), 0);
  // Closed everywhere: its file names no context any more.
  errno = 0;
  EXPECT_EQ(ibv_import_device(kept), nullptr);
  EXPECT_EQ(errno, ENXIO);
  ::close(kept);
}

// pyverbs imports a dup of cmd_fd and closes the context, never the fd:
// importing and closing many times leaves no fd behind.
TEST(Import, ClosingAnImportedContextClosesItsFd) {
  Device dev;
  ASSERT_TRUE(dev.ok());
  const int probe_before = ::dup(0);
  ASSERT_GE(probe_before, 0);
  ::close(probe_before);
  for (int i = 0; i < 100; ++i) {
    ibv_context* imported = ibv_import_device(::dup(dev.ctx->cmd_fd));
    ASSERT_NE(imported, nullptr) << "errno " << errno;
    ASSERT_EQ(ibv_close_device(imported), 0);
  }
  // The lowest free fd number is the same as before: nothing leaked.
  const int probe_after = ::dup(0);
  EXPECT_EQ(probe_after, probe_before);
  ::close(probe_after);
}

TEST(Import, AnyOtherFileIsNoContext) {
  const int fd = ::open("/dev/null", O_RDONLY);
  ASSERT_GE(fd, 0);
  errno = 0;
  EXPECT_EQ(ibv_import_device(fd), nullptr);
  EXPECT_EQ(errno, ENXIO);
  ::close(fd);
  errno = 0;
  EXPECT_EQ(ibv_import_device(-1), nullptr);
  EXPECT_EQ(errno, EBADF);
}

}  // namespace
