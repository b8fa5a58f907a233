#include "support/mounted_volume.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include <gtest/gtest.h>

namespace spillfs::testing {

void ExpectMountsRefused(const std::string& volume, const std::string& mountpoint,
                         const std::vector<RefusedMount>& cases) {
  for (const RefusedMount& c : cases) {
    std::string out;
    EXPECT_EQ(RunSpillfs("mount " + volume + " " + mountpoint + " " + c.args, &out), 1) << c.args << "\n" << out;
    EXPECT_NE(out.find(c.says), std::string::npos) << c.args << " said: " << out;
  }
}

bool IsMountPoint(const std::string& path) {
  struct stat self {
  }, parent{};
  if (stat(path.c_str(), &self) != 0) return false;
  if (stat((path + "/..").c_str(), &parent) != 0) return false;
  return self.st_dev != parent.st_dev;
}

const char* SpillfsBinary() { return SPILLFS_BINARY; }

int RunSpillfs(const std::string& args, std::string* output) {
  std::string command = std::string(SpillfsBinary()) + " " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  std::array<char, 4096> buf;
  std::string text;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) text.append(buf.data(), n);
  int status = pclose(pipe);
  if (output != nullptr) *output = text;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

MountedVolume::MountedVolume(const Options& options) : options_(options) {
  volume_ = root_.Path("vol");
  mountpoint_ = root_.Path("mnt");
  std::filesystem::create_directory(mountpoint_);
  std::string output;
  int rc = RunSpillfs("mkfs " + volume_ + " --size " + options_.size + " " + options_.mkfs_args, &output);
  if (rc != 0) throw std::runtime_error("spillfs mkfs failed: " + output);
  std::string error;
  if (!Mount(&error)) throw std::runtime_error("mount failed: " + error);
}

MountedVolume::~MountedVolume() {
  if (mounted()) Unmount();
}

constexpr const char* kEnableUring = "/sys/module/fuse/parameters/enable_uring";

std::string FuseRingParameter() {
  std::string value;
  std::ifstream(kEnableUring) >> value;
  return value;
}

std::string SetFuseRingParameter(const std::string& value) {
  std::ofstream(kEnableUring) << value;
  return FuseRingParameter();
}

namespace {

// Makes the kernel offer FUSE over io_uring (root, Linux 6.14+); true if it does.
bool OfferFuseRing() { return SetFuseRingParameter("Y") == "Y"; }

// A mount asked to use the ring where the kernel offers it: `spillfs stat`
// (itself requests through the mount) must find requests answered over it.
bool RequestsCameOverTheRing(const std::string& mountpoint, std::string* error) {
  std::string out;
  if (RunSpillfs("stat --json " + mountpoint, &out) != 0) {
    if (error) *error = "spillfs stat failed: " + out;
    return false;
  }
  const std::string key = "\"fuse_ring_requests\":";
  size_t at = out.find(key);
  if (at != std::string::npos && std::strtoull(out.c_str() + at + key.size(), nullptr, 10) > 0) return true;
  if (error) *error = "mounted with --fuse-uring where the kernel offers it, but no request came over the ring";
  return false;
}

}  // namespace

bool MountedVolume::Mount(std::string* error) {
  // The arguments are built before fork: the child of a threaded process may
  // only call async-signal-safe functions.
  std::vector<std::string> args = {"spillfs", "mount", volume_, mountpoint_, "-f"};
  if (!options_.mount_options.empty()) {
    args.push_back("-o");
    args.push_back(options_.mount_options);
  }
  args.insert(args.end(), options_.mount_args.begin(), options_.mount_args.end());
  // More arguments for every mount of a test run (e.g. the FUSE ring).
  bool check_ring = false;
  if (const char* more = std::getenv(kExtraMountArgsEnv)) {
    std::istringstream words(more);
    for (std::string word; words >> word;) {
      args.push_back(word);
      if (word == "--fuse-uring") check_ring = OfferFuseRing();
    }
  }
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const std::string binary = options_.daemon_binary.empty() ? SpillfsBinary() : options_.daemon_binary;
  pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, STDIN_FILENO);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    if (IsMountPoint(mountpoint_)) {
      daemon_pid_ = pid;
      return !check_ring || RequestsCameOverTheRing(mountpoint_, error);
    }
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      if (error) *error = "spillfs mount exited with status " + std::to_string(WEXITSTATUS(status));
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  if (error) *error = "mount did not appear within 20 s";
  return false;
}

bool MountedVolume::Unmount(std::string* error) {
  if (!mounted()) return true;
  std::string output;
  int rc = RunSpillfs("umount " + mountpoint_, &output);
  int status = 0;
  waitpid(daemon_pid_, &status, 0);
  daemon_pid_ = -1;
  if (rc != 0) {
    if (error) *error = "spillfs umount failed: " + output;
    return false;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    if (error) *error = "daemon exited abnormally (status " + std::to_string(status) + ")";
    return false;
  }
  return true;
}

namespace {

// How long Kill waits for a SIGKILLed daemon, before and after aborting its
// FUSE connection.
constexpr auto kKillWait = std::chrono::seconds(10);

// Waits until `pid` has exited (reaped), for at most `limit`.
bool ReapWithin(pid_t pid, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (true) {
    pid_t got = waitpid(pid, nullptr, WNOHANG);
    if (got == pid || (got < 0 && errno == ECHILD)) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

bool MountedVolume::Kill(std::string* error) {
  if (!mounted()) return true;
  kill(daemon_pid_, SIGKILL);
  // A killed process exits once each of its threads has left the kernel. A
  // daemon thread waiting uninterruptibly on its own mount (a page locked by
  // a READ in flight, which only a thread now dead would answer) never
  // would: a forced unmount aborts the connection (fuse_umount_begin), which
  // fails every request and ends such waits.
  bool reaped = ReapWithin(daemon_pid_, kKillWait);
  if (!reaped) {
    umount2(mountpoint_.c_str(), MNT_FORCE);
    reaped = ReapWithin(daemon_pid_, kKillWait);
  }
  if (!reaped && error) {
    *error = "the daemon (pid " + std::to_string(daemon_pid_) + ") had not exited " +
             std::to_string(2 * kKillWait.count()) + " s after SIGKILL, its FUSE connection aborted after " +
             std::to_string(kKillWait.count()) + " s";
  }
  daemon_pid_ = -1;
  umount2(mountpoint_.c_str(), MNT_DETACH);
  return reaped;
}

bool MountedVolume::Terminate(int signal, std::string* error) {
  if (!mounted()) return true;
  kill(daemon_pid_, signal);
  int status = 0;
  waitpid(daemon_pid_, &status, 0);
  daemon_pid_ = -1;
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
  if (error) *error = "daemon exited abnormally (status " + std::to_string(status) + ")";
  umount2(mountpoint_.c_str(), MNT_DETACH);
  return false;
}

std::string MountedVolume::Path(const std::string& relative) const { return mountpoint_ + "/" + relative; }

}  // namespace spillfs::testing
