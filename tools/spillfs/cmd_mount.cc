// spillfs mount VOLUME MOUNTPOINT [-f] [-o OPTS] and spillfs umount MOUNTPOINT.
//
// The daemon forks before it opens the volume: RocksDB's background threads
// do not survive fork(). The volume lock (an flock, which a forked child
// shares) is taken before the fork and handed to the child's Volume::Open.
// The parent waits on a pipe for the child to say "mounted" (or why not) and
// exits with that result.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>

#include "commands.h"
#include "sizes.h"
#include "spillfs/common/control_protocol.h"
#include "spillfs/common/mountinfo.h"
#include "spillfs/fuse/fuse_daemon.h"
#include "spillfs/store/volume.h"

namespace spillfs::cli {
namespace {

namespace stdfs = std::filesystem;

// Each 4 MiB of read-ahead is a fetch thread of the daemon.
constexpr uint64_t kMaxReadAheadBytes = 256ull << 20;
// Smaller would sync after nearly every flushed file.
constexpr uint64_t kMinBytesPerSync = 1ull << 20;
// A flush batch is whole RAM-tier chunks (256 KiB); past 1 GiB one batch
// would hold the tier frozen for seconds.
constexpr uint64_t kMinFlushBatchBytes = 256ull << 10;
constexpr uint64_t kMaxFlushBatchBytes = 1ull << 30;
// A FUSE request's payload: the kernel's least read-ahead worth having, and
// 8192 pages (the kernel allows 65535).
constexpr uint64_t kMinRequestBytes = 128ull << 10;
constexpr uint64_t kMaxRequestBytes = 32ull << 20;

struct MountArgs {
  std::string volume;
  std::string mountpoint;
  bool foreground = false;
  bool debug = false;
  std::string options;
  unsigned threads = 16;
  bool writeback_cache = false;
  bool fuse_uring = false;
  std::string ram_tier;        // size of the write-back RAM tier ("" = default)
  std::string read_ahead;      // bytes fetched ahead of a sequential reader ("" = default)
  std::string bytes_per_sync;  // accepted for old scripts, checked and ignored
  std::string ram_tier_warm;   // RAM-tier memory faulted in at mount ("" = default)
  std::string flush_batch;     // RAM-tier bytes written per flush batch ("" = default)
  std::string max_request;     // payload of one FUSE request ("" = default)
  uint64_t max_request_bytes = 1ull << 20;
  int64_t flush_age_ms = 2000;
  unsigned lock_wait_s = 30;  // how long to wait for a daemon still finishing an unmount
  int lock_fd = -1;           // the volume lock, taken before the fork and handed to Volume::Open
  FilesystemOptions fs_options;
  DaemonHooks hooks;  // none in the product (commands.h)
};

// Takes the volume's lock, polling every `interval` for up to `wait_s` while
// another process holds it; returns it held. `on_busy` sees each "in use"
// answer and may end the wait with an error of its own. After the wait, the
// last "in use" error.
Result<int> PollVolumeLock(const std::string& volume, unsigned wait_s, std::chrono::milliseconds interval,
                           const std::function<Status(const Status& busy)>& on_busy) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(wait_s);
  for (;;) {
    auto lock = LockVolume(volume);
    if (lock.ok() || lock.status().code() != EBUSY) return lock;
    SPILLFS_RETURN_IF_ERROR(on_busy(lock.status()));
    if (std::chrono::steady_clock::now() >= deadline) return lock.status();
    std::this_thread::sleep_for(interval);
  }
}

// Takes the volume's lock for a mount, waiting up to `wait_s` while another
// process holds it, and returns it held: the daemon's Volume::Open takes it
// over, so nobody can take the volume in between. A plain `umount` returns
// before the daemon has flushed and closed the volume (`spillfs umount`
// waits), so `umount` followed by `spillfs mount` would otherwise fail for a
// few seconds. The volume is not mounted anywhere (checked before), so the
// holder is such a daemon or an offline command (stat, fsck) that will let go.
Result<int> WaitForVolumeLock(const std::string& volume, unsigned wait_s) {
  bool said = false;
  bool mounted_elsewhere = false;
  auto lock = PollVolumeLock(volume, wait_s, std::chrono::milliseconds(20), [&](const Status& busy) {
    if (auto mounted = FindMountOfSource(control::kFsType, volume)) {  // mounted meanwhile, by someone else
      mounted_elsewhere = true;
      return Status::Error(EBUSY, fmt::format("volume {} is already mounted on {}", volume, mounted->mountpoint));
    }
    if (!said) {
      fmt::print(stderr, "spillfs mount: {}, which has not mounted it; waiting up to {} s for it to let go\n",
                 busy.message(), wait_s);
      said = true;
    }
    return Status::OK();
  });
  if (lock.ok() || lock.status().code() != EBUSY || mounted_elsewhere) return lock;
  return Status::Error(EBUSY, fmt::format("{}, still after {} s (--lock-wait)", lock.status().message(), wait_s));
}

// Checks everything that can be checked before forking.
Status Validate(MountArgs* args) {
  std::error_code ec;
  if (!stdfs::exists(args->mountpoint, ec)) {
    return Status::Error(ENOENT, fmt::format("mountpoint {} does not exist", args->mountpoint));
  }
  if (!stdfs::is_directory(args->mountpoint, ec)) {
    return Status::Error(ENOTDIR, fmt::format("mountpoint {} is not a directory", args->mountpoint));
  }
  args->mountpoint = stdfs::canonical(args->mountpoint, ec).string();
  if (!stdfs::is_directory(args->volume, ec)) {
    return Status::Error(ENOENT, fmt::format("volume {} does not exist", args->volume));
  }
  args->volume = stdfs::canonical(args->volume, ec).string();
  if (!Volume::Exists(args->volume)) {
    return Status::Error(EINVAL, fmt::format("{} is not a spillfs volume (make one with spillfs mkfs)", args->volume));
  }
  if (auto mounted = FindMountOfSource(control::kFsType, args->volume)) {
    return Status::Error(EBUSY, fmt::format("volume {} is already mounted on {}", args->volume, mounted->mountpoint));
  }
  if (auto busy = FindMountAt(args->mountpoint)) {
    return Status::Error(
        EBUSY, fmt::format("{} is already a mount point ({} from {})", args->mountpoint, busy->fstype, busy->source));
  }
  return Status::OK();
}

// Opens the volume and mounts it; `report` is called once with the outcome.
int Serve(const MountArgs& args, const std::function<void(const Status&)>& report) {
  FuseOptions options;
  options.mountpoint = args.mountpoint;
  options.fsname = args.volume;
  options.extra_options = args.options;
  options.max_threads = args.threads;
  options.writeback_cache = args.writeback_cache;
  options.fuse_uring = args.fuse_uring;
  options.max_request_bytes = args.max_request_bytes;
  options.debug = args.debug;
  auto volume = Volume::Open(args.volume, {.lock_fd = args.lock_fd, .wrappers = args.hooks.volume});
  if (!volume.ok()) {
    report(volume.status());
    return 1;
  }
  FilesystemOptions fs_options = args.fs_options;
  fs_options.ram_tier_slab_fault = args.hooks.ram_tier_slab_fault;
  // Read-ahead windows of whole requests, as the kernel will send them.
  fs_options.read_request_bytes = FuseDaemon::RequestBytesFor(options, nullptr);
  auto fs = Filesystem::Open(std::move(*volume), fs_options);
  if (!fs.ok()) {
    report(fs.status().WithContext("cannot open the filesystem"));
    return 1;
  }
  FuseDaemon daemon(std::move(*fs), options);
  Status mounted = daemon.Mount();
  report(mounted);
  if (!mounted.ok()) return 1;
  Status served = daemon.Run();
  if (!served.ok()) {
    fmt::print(stderr, "spillfs: {}\n", served.ToString());
    return 1;
  }
  return 0;
}

int RunBackground(const MountArgs& args) {
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return Fail("mount", std::strerror(errno));
  pid_t pid = fork();
  if (pid < 0) {
    close(args.lock_fd);
    return Fail("mount", std::strerror(errno));
  }
  if (pid != 0) close(args.lock_fd);  // the daemon holds it now (flock: one lock for both descriptors)
  if (pid == 0) {
    close(pipe_fds[0]);
    setsid();
    int log = open((args.volume + "/spillfs.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    int rc = Serve(args, [&](const Status& s) {
      std::string message = s.ok() ? "OK" : s.message();
      ssize_t n = write(pipe_fds[1], message.data(), message.size());
      (void)n;
      close(pipe_fds[1]);
      if (s.ok()) {
        dup2(null, STDIN_FILENO);
        dup2(null, STDOUT_FILENO);
        if (log >= 0) dup2(log, STDERR_FILENO);
      }
    });
    _exit(rc);
  }
  close(pipe_fds[1]);
  std::string message;
  char buf[512];
  ssize_t n;
  while ((n = read(pipe_fds[0], buf, sizeof(buf))) > 0) message.append(buf, static_cast<size_t>(n));
  close(pipe_fds[0]);
  if (message != "OK") {
    int status = 0;
    waitpid(pid, &status, 0);
    return Fail("mount", message.empty() ? "the daemon exited before mounting" : message);
  }
  fmt::print("spillfs: {} mounted on {} (daemon pid {})\n", args.volume, args.mountpoint, pid);
  return 0;
}

// A size given on the command line ("" when not given).
struct SizeOption {
  const char* flag;
  const std::string& text;
  uint64_t least;  // besides 0, which turns the thing off
  uint64_t most;
  uint64_t* out;  // set when text is given and valid
};

Status ParseSizeOption(const SizeOption& option) {
  if (option.text.empty()) return Status::OK();
  auto bytes = ParseSize(option.text);
  if (!bytes.ok()) return Status::Invalid(fmt::format("{}: {}", option.flag, bytes.status().message()));
  if (*bytes > option.most) {
    return Status::Invalid(
        fmt::format("{}: {} is more than the most, {}", option.flag, option.text, HumanBytes(option.most)));
  }
  if (*bytes > 0 && *bytes < option.least) {
    return Status::Invalid(fmt::format("{}: {} is less than the least, {} (0 turns it off)", option.flag, option.text,
                                       HumanBytes(option.least)));
  }
  *option.out = *bytes;
  return Status::OK();
}

int RunMount(MountArgs args) {
  Status valid = Validate(&args);
  if (!valid.ok()) return Fail("mount", valid.message());
  uint64_t ignored_bytes_per_sync = 0;
  for (const SizeOption& option : {
           SizeOption{"--ram-tier", args.ram_tier, 0, UINT64_MAX, &args.fs_options.ram_tier_bytes},
           SizeOption{"--read-ahead", args.read_ahead, 0, kMaxReadAheadBytes, &args.fs_options.read_ahead_bytes},
           SizeOption{"--ram-tier-warm", args.ram_tier_warm, 0, UINT64_MAX, &args.fs_options.ram_tier_warm_bytes},
           SizeOption{"--flush-batch", args.flush_batch, kMinFlushBatchBytes, kMaxFlushBatchBytes,
                      &args.fs_options.flush_batch_bytes},
           SizeOption{"--bytes-per-sync", args.bytes_per_sync, kMinBytesPerSync, UINT64_MAX, &ignored_bytes_per_sync},
           SizeOption{"--max-request", args.max_request, kMinRequestBytes, kMaxRequestBytes, &args.max_request_bytes},
       }) {
    Status parsed = ParseSizeOption(option);
    if (!parsed.ok()) return Fail("mount", parsed.message());
  }
  if (!args.flush_batch.empty() && args.fs_options.flush_batch_bytes == 0) {
    return Fail("mount", fmt::format("--flush-batch: 0 is less than the least, {}", HumanBytes(kMinFlushBatchBytes)));
  }
  if (!args.max_request.empty() && (args.max_request_bytes == 0 || args.max_request_bytes % 4096 != 0)) {
    return Fail("mount", fmt::format("--max-request: {} is not a positive multiple of 4K", args.max_request));
  }
  if (!args.max_request.empty() && args.fuse_uring && args.max_request_bytes != (1ull << 20)) {
    return Fail("mount", "--max-request cannot be used with --fuse-uring (its requests are 1M)");
  }
  if (!args.bytes_per_sync.empty()) {
    fmt::print(stderr,
               "spillfs mount: --bytes-per-sync is ignored: the data of every flush batch is made durable before "
               "the batch is mapped\n");
  }
  if (args.fuse_uring && args.writeback_cache) {
    // A handler that drops the kernel's cached pages (a direct-path commit)
    // may need the kernel to write dirty pages back through the FUSE queue of
    // its own CPU first: with every entry of that queue so waiting, it would
    // wait forever.
    return Fail("mount", "--fuse-uring and --writeback-cache cannot be used together");
  }
  // Last: every other mistake is reported without waiting.
  auto lock = WaitForVolumeLock(args.volume, args.lock_wait_s);
  if (!lock.ok()) return Fail("mount", lock.status().message());
  args.lock_fd = *lock;
  args.fs_options.flush_age_ms = args.flush_age_ms;
  if (!args.foreground) return RunBackground(args);
  return Serve(args, [&](const Status& s) {
    if (s.ok()) {
      fmt::print("spillfs: {} mounted on {} (foreground, pid {})\n", args.volume, args.mountpoint, getpid());
      std::fflush(stdout);
    } else {
      Fail("mount", s.message());
    }
  });
}

int RunUmount(const std::string& path) {
  std::error_code ec;
  std::string mountpoint = stdfs::weakly_canonical(path, ec).string();
  auto entry = FindMountAt(mountpoint);
  if (!entry || entry->fstype != control::kFsType) {
    return Fail("umount", fmt::format("{} is not a spillfs mount point", path));
  }
  if (umount2(mountpoint.c_str(), 0) != 0) {
    if (errno == EBUSY) return Fail("umount", fmt::format("{} is busy (files or directories are in use)", mountpoint));
    if (errno != EPERM) return Fail("umount", fmt::format("cannot unmount {}: {}", mountpoint, std::strerror(errno)));
    std::string command = "fusermount3 -u '" + mountpoint + "'";
    if (std::system(command.c_str()) != 0) return Fail("umount", fmt::format("fusermount3 -u {} failed", mountpoint));
  }
  // Wait for the daemon to finish syncing and release the volume.
  auto lock =
      PollVolumeLock(entry->source, 120, std::chrono::milliseconds(10), [](const Status&) { return Status::OK(); });
  if (lock.ok()) {
    close(*lock);
    fmt::print("spillfs: unmounted {}\n", mountpoint);
    return 0;
  }
  return Fail("umount", fmt::format("unmounted {}, but the daemon has not released {}: {}", mountpoint, entry->source,
                                    lock.status().message()));
}

}  // namespace

void RegisterMount(CLI::App& app, int* exit_code, const DaemonHooks& hooks) {
  auto [cmd, args] = AddCommand<MountArgs>(
      app, "mount", "Mount a volume (runs the FUSE daemon, in the background unless -f)", exit_code, RunMount);
  args->hooks = hooks;
  cmd->add_option("VOLUME", args->volume, "Volume directory made by spillfs mkfs")->required();
  cmd->add_option("MOUNTPOINT", args->mountpoint, "Existing empty directory to mount on")->required();
  cmd->add_flag("-f,--foreground", args->foreground, "Stay in the foreground");
  cmd->add_flag("-d,--debug", args->debug, "Log every FUSE request (implies nothing else)");
  cmd->add_option("-o", args->options, "Extra FUSE mount options, comma separated (e.g. allow_other)");
  cmd->add_option("--threads", args->threads, "Maximum FUSE worker threads")->check(CLI::Range(1, 256));
  cmd->add_flag("--writeback-cache", args->writeback_cache,
                "Let the kernel cache writes and send them in large background requests (faster small writes; "
                "but ENOSPC shows at fsync/close instead of write(), and direct-path size changes are not seen "
                "through this mount, and direct-path readers see only data that was fsynced or closed)");
  cmd->add_flag("--fuse-uring", args->fuse_uring,
                "Carry FUSE requests over io_uring where the kernel offers it (Linux 6.14+ with "
                "/sys/module/fuse/parameters/enable_uring set to Y; /dev/fuse otherwise, said in spillfs.log)");
  cmd->add_option("--ram-tier", args->ram_tier,
                  "Write-back RAM tier size, e.g. 4G; 0 writes through (default: 1/4 of RAM, at most 8G)");
  cmd->add_option("--read-ahead", args->read_ahead,
                  "Bytes read ahead of each sequential reader, e.g. 32M; 0 turns read-ahead off (default: 16M)");
  cmd->add_option("--ram-tier-warm", args->ram_tier_warm,
                  "RAM-tier memory faulted in at mount, so the first writes do not wait for fresh pages; at most "
                  "the RAM tier, 0 none (default: 256M)");
  cmd->add_option("--flush-batch", args->flush_batch,
                  "RAM-tier data written to the SSD per flush batch, e.g. 16M; each batch is made durable before "
                  "it is mapped, and up to four are in flight (default: 64M; 256K to 1G)");
  cmd->add_option("--max-request", args->max_request,
                  "Most data one FUSE request carries, and the kernel's read-ahead for the mount, e.g. 4M; above "
                  "1M needs Linux 6.12+ with sysctl fs.fuse.max_pages_limit at least this many 4K pages "
                  "(default: 1M; 128K to 32M)");
  cmd->add_option("--bytes-per-sync", args->bytes_per_sync,
                  "Ignored, kept for old scripts: the data of every flush batch is now made durable before it is "
                  "mapped, which did this option's job (syncing as the flusher writes)");
  cmd->add_flag(
      "--no-dedup", [args](int64_t) { args->fs_options.dedup = false; },
      "Do not deduplicate data flushed during this mount");
  cmd->add_option("--lock-wait", args->lock_wait_s,
                  "Seconds to wait for a process that holds the unmounted volume, such as the daemon of a mount "
                  "that a plain umount has just ended, to let go (default: 30)")
      ->check(CLI::Range(0, 3600));
  cmd->add_option("--flush-age", args->flush_age_ms, "Flush non-ephemeral dirty data older than this many ms")
      ->check(CLI::Range(int64_t{0}, int64_t{3600000}));
}

void RegisterUmount(CLI::App& app, int* exit_code) {
  auto [cmd, path] = AddCommand<std::string>(
      app, "umount", "Unmount a spillfs mount point and wait for the daemon to finish", exit_code, RunUmount);
  cmd->add_option("MOUNTPOINT", *path, "Where the volume is mounted")->required();
}

}  // namespace spillfs::cli
