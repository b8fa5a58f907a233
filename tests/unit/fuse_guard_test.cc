// The FUSE boundary's last-resort catch (fs/fuse/include/spillfs/fuse/fuse_guard.h): an operation
// that throws before it answers its request is answered ENOMEM (std::bad_alloc)
// or EIO (any other exception) exactly once; one that answered first is not
// answered again; nothing escapes into libfuse. The failure answer is
// recorded here instead of going to the kernel, and the transports' notice
// of each message written (NoteFuseWrite) is given by hand.
#include "spillfs/fuse/fuse_guard.h"

#include <gtest/gtest.h>
#include <linux/fuse.h>

#include <cerrno>
#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace spillfs {
namespace {

std::vector<std::pair<fuse_req_t, int>> answered_failures;

int RecordFailure(fuse_req_t req, int error) {
  answered_failures.emplace_back(req, error);
  return 0;
}

fuse_req_t Request(uintptr_t n) { return reinterpret_cast<fuse_req_t>(0x1000 + n); }

// What a transport reports when it writes a message with this unique (0: a
// notification).
void Written(uint64_t unique) {
  fuse_out_header out{};
  out.len = sizeof(out);
  out.unique = unique;
  iovec iov{&out, sizeof(out)};
  NoteFuseWrite(&iov, 1);
}

fuse_ino_t seen_ino = 0;
std::string seen_name;

void ThrowsBadAlloc(fuse_req_t, fuse_ino_t ino, const char* name) {
  seen_ino = ino;
  seen_name = name;
  throw std::bad_alloc();
}
void AnswersThenThrows(fuse_req_t, fuse_ino_t) {
  Written(7);
  throw std::bad_alloc();
}
void NotifiesThenThrows(fuse_req_t, fuse_ino_t) {
  Written(0);
  throw std::bad_alloc();
}
void ThrowsRuntimeError(fuse_req_t, fuse_ino_t) { throw std::runtime_error("a bug"); }
void Answers(fuse_req_t, fuse_ino_t ino, size_t size, off_t offset, fuse_file_info*) {
  seen_ino = ino + size + static_cast<fuse_ino_t>(offset);
  Written(9);
}

class FuseGuardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    answered_failures.clear();
    seen_ino = 0;
    seen_name.clear();
  }
};

TEST_F(FuseGuardTest, OutOfMemoryBeforeTheAnswerIsAnsweredEnomem) {
  auto lookup = &GuardedOp<ThrowsBadAlloc, RecordFailure>::Call;
  lookup(Request(1), 42, "name");  // does not throw
  EXPECT_EQ(seen_ino, 42u);
  EXPECT_EQ(seen_name, "name");
  ASSERT_EQ(answered_failures.size(), 1u);
  EXPECT_EQ(answered_failures[0].first, Request(1));
  EXPECT_EQ(answered_failures[0].second, ENOMEM);
}

TEST_F(FuseGuardTest, AnsweredRequestIsNotAnsweredAgain) {
  GuardedOp<AnswersThenThrows, RecordFailure>::Call(Request(2), 1);
  EXPECT_TRUE(answered_failures.empty()) << "a second answer would free the request twice";
}

TEST_F(FuseGuardTest, NotificationIsNotAnAnswer) {
  GuardedOp<NotifiesThenThrows, RecordFailure>::Call(Request(3), 1);
  ASSERT_EQ(answered_failures.size(), 1u);
  EXPECT_EQ(answered_failures[0].second, ENOMEM);
}

TEST_F(FuseGuardTest, OtherExceptionsAreAnsweredEio) {
  GuardedOp<ThrowsRuntimeError, RecordFailure>::Call(Request(4), 1);
  ASSERT_EQ(answered_failures.size(), 1u);
  EXPECT_EQ(answered_failures[0].second, EIO);
}

TEST_F(FuseGuardTest, NormalOperationPassesItsArgumentsAndIsLeftAlone) {
  fuse_file_info fi{};
  GuardedOp<Answers, RecordFailure>::Call(Request(5), 10, 20, 30, &fi);
  EXPECT_EQ(seen_ino, 60u);
  EXPECT_TRUE(answered_failures.empty());
}

TEST_F(FuseGuardTest, EveryThreadCountsItsOwnAnswers) {
  const uint64_t before = FuseRepliesOnThisThread();
  Written(11);
  EXPECT_EQ(FuseRepliesOnThisThread(), before + 1);
  std::thread other([] { Written(12); });
  other.join();
  EXPECT_EQ(FuseRepliesOnThisThread(), before + 1) << "another thread's answer is not this request's";
}

}  // namespace
}  // namespace spillfs
