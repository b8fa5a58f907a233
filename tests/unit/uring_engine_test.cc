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

#include "spillfs/fs/uring_engine.h"

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

// A read of a pipe stays in flight until the pipe is written: here 300 ms
// after the failed io_uring_enter. Before the fix Submit returned at once,
// and the kernel filled the buffer after the caller had it back.
TEST(UringEngineTest, AFailedEnterReturnsOnlyOnceItsRequestsAreDone) {
  ASSERT_TRUE(UringEngine::Available());
  int fds[2];
  ASSERT_EQ(pipe(fds), 0) << std::strerror(errno);
  const std::string bytes(4096, 'p');
  // On the heap and kept to the end: a read still in flight after Submit
  // returns must not land on a dead stack frame.
  auto buffer = std::make_unique<char[]>(bytes.size());
  std::memset(buffer.get(), 0, bytes.size());
  IoRequest read;
  read.fd = fds[0];
  read.buffer = buffer.get();
  read.length = static_cast<uint32_t>(bytes.size());
  std::thread writer([&] {
    std::this_thread::sleep_for(300ms);
    EXPECT_EQ(write(fds[1], bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  });
  failures_armed = 1;
  const auto started = std::chrono::steady_clock::now();
  Status submitted = UringEngine::Submit(std::span<IoRequest>(&read, 1), 1);
  const auto took = std::chrono::steady_clock::now() - started;
  const std::string at_return(buffer.get(), bytes.size());
  failures_armed = 0;
  writer.join();
  EXPECT_FALSE(submitted.ok()) << "the failed io_uring_enter was not reported";
  EXPECT_GE(took, 250ms) << "Submit returned while its read was still in flight";
  EXPECT_TRUE(at_return == bytes) << "the read had not completed when Submit returned";
  close(fds[0]);
  close(fds[1]);
}

// After such a failure the thread's ring works as before.
TEST(UringEngineTest, TheRingWorksAfterAFailedEnter) {
  ASSERT_TRUE(UringEngine::Available());
  int fds[2];
  ASSERT_EQ(pipe(fds), 0) << std::strerror(errno);
  const std::string bytes(4096, 'q');
  ASSERT_EQ(write(fds[1], bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  auto buffer = std::make_unique<char[]>(bytes.size());
  IoRequest read;
  read.fd = fds[0];
  read.buffer = buffer.get();
  read.length = static_cast<uint32_t>(bytes.size());
  failures_armed = 1;
  EXPECT_FALSE(UringEngine::Submit(std::span<IoRequest>(&read, 1), 1).ok());
  failures_armed = 0;
  ASSERT_EQ(write(fds[1], bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  std::memset(buffer.get(), 0, bytes.size());
  Status again = UringEngine::Submit(std::span<IoRequest>(&read, 1), 1);
  EXPECT_TRUE(again.ok()) << again.ToString();
  EXPECT_TRUE(std::string(buffer.get(), bytes.size()) == bytes);
  close(fds[0]);
  close(fds[1]);
}

}  // namespace
}  // namespace spillfs
