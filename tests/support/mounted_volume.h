// MountedVolume: a real spillfs volume in a temporary directory, mounted with
// the real `spillfs` binary (a child process running `spillfs mount -f`), for
// tests that drive the filesystem through system calls.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "support/temp_dir.h"

namespace spillfs::testing {

// Extra `spillfs mount` arguments for every MountedVolume of the process,
// separated by spaces (CMake runs some suites again with --fuse-uring).
inline constexpr const char* kExtraMountArgsEnv = "SPILLFS_TEST_MOUNT_ARGS";

// The fuse module's enable_uring ("Y" or "N"; "" where the kernel has none):
// while it is Y the kernel offers FUSE over io_uring. Setting it needs root;
// SetFuseRingParameter returns the value read back.
std::string FuseRingParameter();
std::string SetFuseRingParameter(const std::string& value);

// Path of the spillfs binary under test (set by CMake).
const char* SpillfsBinary();

// Runs `spillfs ARGS` and returns its exit status; stdout+stderr go to *output.
int RunSpillfs(const std::string& args, std::string* output = nullptr);

// `spillfs mount` arguments that must be refused, and what it says then.
struct RefusedMount {
  const char* args;
  const char* says;
};

// Runs `spillfs mount VOLUME MOUNTPOINT ARGS` for each case: each must exit
// with status 1 and print its `says` (checked with GoogleTest).
void ExpectMountsRefused(const std::string& volume, const std::string& mountpoint,
                         const std::vector<RefusedMount>& cases);

// True where `path` is the root of a filesystem other than its parent's.
bool IsMountPoint(const std::string& path);

class MountedVolume {
 public:
  struct Options {
    std::string size = "1G";              // passed to mkfs --size
    std::string mkfs_args;                // extra mkfs arguments
    std::string mount_options;            // passed as -o when not empty
    std::vector<std::string> mount_args;  // more `spillfs mount` arguments
    // The binary that runs `mount` (the daemon); empty: the spillfs binary.
    // Fault-injection tests name the test-only spillfs-faulty (testing/).
    std::string daemon_binary;
  };

  MountedVolume() : MountedVolume(Options()) {}
  explicit MountedVolume(const Options& options);
  ~MountedVolume();  // unmounts (if mounted); the temporary directory goes with root_

  MountedVolume(const MountedVolume&) = delete;
  MountedVolume& operator=(const MountedVolume&) = delete;

  // Mounts the volume; returns false (with the reason in *error) on failure.
  bool Mount(std::string* error = nullptr);
  // Unmounts with `spillfs umount` and waits until the daemon has exited.
  bool Unmount(std::string* error = nullptr);
  bool Remount(std::string* error = nullptr) { return Unmount(error) && Mount(error); }
  // Sends SIGKILL to the daemon, waits (bounded) until it has exited, and
  // lazily detaches the mount (crash simulation). A daemon that has not
  // exited 10 s after the signal has a thread waiting in the kernel on its
  // own mount: the FUSE connection is then aborted (a forced unmount), which
  // ends that wait, and it is waited for 10 s more. False (the reason in
  // *error) if it still has not exited.
  bool Kill(std::string* error = nullptr);
  // Sends `signal` to the daemon and waits for it to exit; true if it exited
  // with status 0 (the daemon unmounts itself), else the reason in *error.
  bool Terminate(int signal, std::string* error = nullptr);

  bool mounted() const { return daemon_pid_ > 0; }
  pid_t daemon_pid() const { return daemon_pid_; }
  const std::string& volume() const { return volume_; }  // the volume directory
  const std::string& mountpoint() const { return mountpoint_; }
  // mountpoint() + "/" + relative
  std::string Path(const std::string& relative) const;

 private:
  Options options_;
  TempDir root_{"spillfs-test"};  // holds both
  std::string volume_;
  std::string mountpoint_;
  pid_t daemon_pid_ = -1;
};

}  // namespace spillfs::testing
