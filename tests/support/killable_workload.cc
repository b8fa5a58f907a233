#include "support/killable_workload.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace spillfs::testing {

KillableWorkload::KillableWorkload(const std::string& mountpoint, uint64_t seed) : mountpoint_(mountpoint), rng_(seed) {
  root_ = open(mountpoint_.c_str(), O_RDONLY | O_DIRECTORY);
  if (root_ < 0) root_errno_ = errno;
}

KillableWorkload::~KillableWorkload() {
  if (root_ >= 0) close(root_);
}

void KillableWorkload::Run(const std::atomic<bool>& killed) {
  std::string problem = root_ < 0 ? "cannot open the mount root: " + std::string(strerror(root_errno_)) : Prepare();
  if (!problem.empty()) {
    MutexLock lock(&mu_);
    early_failure_ = problem;
    return;
  }
  while (!failed_ && ops_ < kMaxOps) {
    ++ops_;
    Step();
    if (failed_ && !killed.load()) {
      MutexLock lock(&mu_);
      early_failure_ = last_op_ + ": " + strerror(last_errno_);
    }
  }
}

std::string KillableWorkload::early_failure() {
  MutexLock lock(&mu_);
  return early_failure_;
}

bool KillableWorkload::Check(bool ok, const std::string& what) {
  if (!ok) {
    last_errno_ = errno;
    last_op_ = what;
    failed_ = true;
  }
  return ok;
}

size_t KillableWorkload::WriteSize() {
  switch (Pick(4)) {
    case 0:
      return Pick(512) + 1;
    case 1:
      return Pick(64 << 10) + 1;
    case 2:
      return Pick(256 << 10) + 1;
    default:
      return Pick(2 << 20) + 1;
  }
}

}  // namespace spillfs::testing
