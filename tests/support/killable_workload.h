// KillableWorkload: the frame of the kill and power-cut tests' writers. A
// seeded random workload of file operations on a mounted volume, run until
// one fails because the daemon was killed under it.
//
// Every path is resolved from a descriptor of the mounted root: once the
// daemon is killed and the mount detached, a path through the mountpoint
// would reach the directory underneath, where creates and fsyncs succeed on
// another filesystem; through the descriptor they fail as they should.
//
// A subclass holds its model of the volume and gives Step() (one operation,
// failing through Check) and, where it needs one, Prepare().
//
// Threading: Run() on one thread (the writer); early_failure() from any;
// ops(), fsyncs() and last_op() once Run() has returned.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "spillfs/common/mutex.h"

namespace spillfs::testing {

class KillableWorkload {
 public:
  // Operations after which Run() stops though nothing failed.
  static constexpr uint64_t kMaxOps = 100000;

  KillableWorkload(const std::string& mountpoint, uint64_t seed);
  virtual ~KillableWorkload();
  KillableWorkload(const KillableWorkload&) = delete;
  KillableWorkload& operator=(const KillableWorkload&) = delete;

  // Prepare(), then Step() until an operation fails or after kMaxOps. A
  // failure while `killed` is still false is a bug of its own:
  // early_failure() names it.
  void Run(const std::atomic<bool>& killed);

  uint64_t ops() const { return ops_; }
  uint64_t fsyncs() const { return fsyncs_; }
  // What failed before the kill, with its errno; "" when nothing did.
  std::string early_failure();
  // The operation that failed (the one the kill cut short).
  const std::string& last_op() const { return last_op_; }

 protected:
  // Sets up what Step() needs, once; a message when that fails.
  virtual std::string Prepare() { return ""; }
  // One operation (Run counts it).
  virtual void Step() = 0;

  // Returns ok; when false, records `what` with errno and ends the run.
  bool Check(bool ok, const std::string& what);
  // Uniform in [0, n).
  uint64_t Pick(uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng_); }
  // A write's length: mostly small, sometimes up to 2 MiB.
  size_t WriteSize();
  std::string RandomDir() { return dirs_[Pick(dirs_.size())]; }
  static std::string Join(const std::string& dir, const std::string& name) {
    return dir.empty() ? name : dir + "/" + name;
  }
  // `path` (relative to the root) through the mountpoint, for calls that take
  // no descriptor.
  std::string MountPath(const std::string& path) const { return mountpoint_ + "/" + path; }

  const std::string mountpoint_;
  int root_ = -1;  // the mounted root, O_DIRECTORY
  std::mt19937_64 rng_;
  std::vector<std::string> dirs_ = {""};  // directories made, relative; "" is the root
  uint64_t fsyncs_ = 0;

 private:
  int root_errno_ = 0;  // of the root's open, when it failed
  uint64_t ops_ = 0;
  bool failed_ = false;
  int last_errno_ = 0;
  std::string last_op_;
  Mutex mu_;
  std::string early_failure_ GUARDED_BY(mu_);
};

}  // namespace spillfs::testing
