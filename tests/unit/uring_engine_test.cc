// UringEngine::Submit when io_uring_enter fails with requests in flight.
//
// This binary interposes io_uring_submit_and_wait: while failures are armed,
// a call submits what is queued (so the requests are really in flight) and
// then reports an error without waiting, the way an io_uring_enter that
// fails after submitting does. Submit must not return before those requests
// complete: its caller frees or reuses their buffers once it returns.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <liburing.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "spillfs/store/uring_engine.h"

namespace {

std::atomic<int> failures_armed{0};

}  // namespace

extern "C" int io_uring_submit_and_wait(struct io_uring* ring, unsigned wait_nr) {
  using Real = int (*)(struct io_uring*, unsigned);
  static const Real real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "io_uring_submit_and_wait"));
  if (failures_armed.load() > 0 && failures_armed.fetch_sub(1) > 0) {
    io_uring_submit(ring);
    return -ENOMEM;
  }
  return real(ring, wait_nr);
}

namespace spillfs {
namespace {

using namespace std::chrono_literals;

// A 4 KiB read of a pipe, which stays in flight until the pipe is written.
class UringEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(UringEngine::Available());
    ASSERT_EQ(pipe(fds_), 0) << std::strerror(errno);
    std::memset(buffer_.get(), 0, bytes_.size());
    read_.fd = fds_[0];
    read_.buffer = buffer_.get();
    read_.length = static_cast<uint32_t>(bytes_.size());
  }
  void TearDown() override {
    failures_armed = 0;
    for (int fd : fds_) {
      if (fd >= 0) close(fd);
    }
  }
  void WriteBytes() { EXPECT_EQ(write(fds_[1], bytes_.data(), bytes_.size()), static_cast<ssize_t>(bytes_.size())); }
  Status SubmitRead() { return UringEngine::Submit(std::span<IoRequest>(&read_, 1), 1); }
  std::string Buffer() const { return std::string(buffer_.get(), bytes_.size()); }

  int fds_[2] = {-1, -1};
  const std::string bytes_ = std::string(4096, 'p');
  // On the heap and kept to the end: a read still in flight after Submit
  // returns must not land on a dead stack frame.
  std::unique_ptr<char[]> buffer_ = std::make_unique<char[]>(4096);
  IoRequest read_;
};

// The pipe is written 300 ms after the failed io_uring_enter. Before the fix
// Submit returned at once, and the kernel filled the buffer after the caller
// had it back.
TEST_F(UringEngineTest, AFailedEnterReturnsOnlyOnceItsRequestsAreDone) {
  std::thread writer([&] {
    std::this_thread::sleep_for(300ms);
    WriteBytes();
  });
  failures_armed = 1;
  const auto started = std::chrono::steady_clock::now();
  Status submitted = SubmitRead();
  const auto took = std::chrono::steady_clock::now() - started;
  const std::string at_return = Buffer();
  failures_armed = 0;
  writer.join();
  EXPECT_FALSE(submitted.ok()) << "the failed io_uring_enter was not reported";
  EXPECT_GE(took, 250ms) << "Submit returned while its read was still in flight";
  EXPECT_TRUE(at_return == bytes_) << "the read had not completed when Submit returned";
}

// After such a failure the thread's ring works as before.
TEST_F(UringEngineTest, TheRingWorksAfterAFailedEnter) {
  WriteBytes();
  failures_armed = 1;
  EXPECT_FALSE(SubmitRead().ok());
  failures_armed = 0;
  WriteBytes();
  std::memset(buffer_.get(), 0, bytes_.size());
  Status again = SubmitRead();
  EXPECT_TRUE(again.ok()) << again.ToString();
  EXPECT_TRUE(Buffer() == bytes_);
}

}  // namespace
}  // namespace spillfs
