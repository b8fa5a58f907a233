// FuseDeviceLoop (fs/fuse/include/spillfs/fuse/fuse_device_loop.h) on a /dev/fuse descriptor with
// no mount behind it: every read() fails (EPERM), so Run must end with that
// error rather than spin or hang, and the loop must be destroyed cleanly
// afterwards (run under SPILLFS_SANITIZE=ON, a use of freed workers shows).
#define FUSE_USE_VERSION 314
#include "spillfs/fuse/fuse_device_loop.h"

#include <fcntl.h>
#include <fuse3/fuse_lowlevel.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>
#include <string>

namespace spillfs {
namespace {

struct SessionDeleter {
  void operator()(fuse_session* session) const { fuse_session_destroy(session); }
};

// fuse_session_new parses the arguments into a copy it allocates
// (fuse_opt_parse) and leaves that copy in their place, for the caller to
// free, whether or not a session came of them.
struct ScopedArgs {
  fuse_args args;
  ~ScopedArgs() { fuse_opt_free_args(&args); }
};

std::unique_ptr<fuse_session, SessionDeleter> NewSession() {
  char name[] = "fuse_device_loop_test";
  char* argv[] = {name};
  ScopedArgs scoped{FUSE_ARGS_INIT(1, argv)};
  static const fuse_lowlevel_ops ops{};
  return std::unique_ptr<fuse_session, SessionDeleter>(fuse_session_new(&scoped.args, &ops, sizeof(ops), nullptr));
}

TEST(FuseDeviceLoopTest, AFailedReadEndsRunWithItsError) {
  int fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
  if (fd < 0) GTEST_SKIP() << "no /dev/fuse here: " << strerror(errno);
  auto session = NewSession();
  ASSERT_NE(session, nullptr);
  for (unsigned threads : {1u, 4u}) {
    auto loop = std::make_unique<FuseDeviceLoop>(session.get(), fd, threads, size_t{1} << 20);
    Status run = loop->Run();
    EXPECT_FALSE(run.ok()) << threads << " threads";
    EXPECT_NE(run.ToString().find("reading a FUSE request"), std::string::npos) << run.ToString();
    loop.reset();  // after Run: the workers it freed must not be touched again
  }
  close(fd);
}

TEST(FuseDeviceLoopTest, DestroyedWithoutRunning) {
  auto session = NewSession();
  ASSERT_NE(session, nullptr);
  FuseDeviceLoop loop(session.get(), -1, 4, size_t{1} << 20);
  loop.Stop();
}

}  // namespace
}  // namespace spillfs
