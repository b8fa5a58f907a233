#include "spillfs/store/volume.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>

#include "spillfs/common/aligned_buffer.h"
#include "spillfs/common/clock.h"
#include "spillfs/kvindex/coding.h"
#include "spillfs/kvindex/keys.h"

namespace spillfs {
namespace {

namespace stdfs = std::filesystem;

std::string RandomUuid() {
  std::random_device rd;
  std::string uuid(16, '\0');
  for (auto& c : uuid) c = static_cast<char>(rd());
  uuid[6] = static_cast<char>((uuid[6] & 0x0f) | 0x40);  // version 4
  uuid[8] = static_cast<char>((uuid[8] & 0x3f) | 0x80);  // variant 1
  return uuid;
}

std::string ReadPid(const std::string& path) {
  FILE* f = fopen(path.c_str(), "r");
  if (!f) return "?";
  char buf[32] = {0};
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  std::string pid(buf, n);
  while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
  return pid.empty() ? "?" : pid;
}

// Writes the initial index contents: superblock, root directory, free space.
Status InitializeIndex(const std::string& dir, const Superblock& sb) {
  SPILLFS_ASSIGN_OR_RETURN(auto index, Index::Open(Volume::IndexPath(dir), Index::Options{.create = true}));
  InodeRecord root;
  root.mode = S_IFDIR | 0755;
  root.uid = getuid();
  root.gid = getgid();
  root.nlink = 2;
  root.atime_ns = root.mtime_ns = root.ctime_ns = root.btime_ns = sb.created_ns;
  root.generation = 1;
  root.parent = kRootInode;
  Index::Batch batch(*index);
  batch.Put(Family::kMeta, keys::kSuperblock, sb.Encode());
  batch.Put(Family::kMeta, keys::kNextIno, EncodeMetaU64(kRootInode + 1));
  batch.Put(Family::kMeta, keys::kCleanUnmount, "1");
  batch.Put(Family::kInode, keys::Ino(kRootInode), root.Encode());
  std::string length;
  coding::PutVarint64(&length, sb.data_size - sb.data_offset);
  batch.Put(Family::kFree, keys::Free(sb.data_offset), length);
  return index->Commit(&batch, /*sync=*/true);
}

Status CheckTarget(const std::string& dir, bool force) {
  std::error_code ec;
  if (!stdfs::exists(dir, ec)) return Status::OK();
  if (!stdfs::is_directory(dir, ec))
    return Status::Error(ENOTDIR, fmt::format("{} exists and is not a directory", dir));
  if (Volume::Exists(dir)) {
    if (!force) {
      return Status::Error(EEXIST, fmt::format("{} already holds a spillfs volume; use --force to replace it", dir));
    }
    SPILLFS_ASSIGN_OR_RETURN(int lock_fd, LockVolume(dir));
    close(lock_fd);
    stdfs::remove_all(Volume::IndexPath(dir), ec);
    stdfs::remove(Volume::ImagePath(dir), ec);
    return Status::OK();
  }
  if (!stdfs::is_empty(dir, ec)) {
    return Status::Error(ENOTEMPTY,
                         fmt::format("{} is not empty and holds no spillfs volume; refusing to use it", dir));
  }
  return Status::OK();
}

}  // namespace

namespace {

// Writes this process's pid into the held lock file `fd` (for the errors of
// those who find the volume locked).
Status NoteLockHolder(int fd, const std::string& path) {
  std::string pid = std::to_string(getpid()) + "\n";
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    return Status::IOError(fmt::format("cannot write {}", path));
  }
  return Status::OK();
}

}  // namespace

Result<int> LockVolume(const std::string& dir) {
  std::string path = Volume::LockPath(dir);
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return Status::Error(errno, fmt::format("cannot open {}: {}", path, std::strerror(errno)));
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    close(fd);
    std::string holder = ReadPid(path);
    return Status::Error(EBUSY, holder == "?" ? fmt::format("volume {} is in use by a process that is closing it", dir)
                                              : fmt::format("volume {} is in use by process {}", dir, holder));
  }
  if (Status noted = NoteLockHolder(fd, path); !noted.ok()) {
    close(fd);
    return noted;
  }
  return fd;
}

bool Volume::Exists(const std::string& dir) {
  std::error_code ec;
  return stdfs::exists(stdfs::path(IndexPath(dir)) / "CURRENT", ec);
}

Volume::~Volume() {
  index_.reset();
  store_.reset();
  if (lock_fd_ >= 0) {
    if (ftruncate(lock_fd_, 0) != 0) { /* the pid is informational only */
    }
    close(lock_fd_);
  }
}

Result<Superblock> Volume::Create(const std::string& dir, const CreateOptions& options) {
  SPILLFS_RETURN_IF_ERROR(CheckTarget(dir, options.force));
  Superblock sb;
  sb.uuid = RandomUuid();
  sb.block_size = kBlockSize;
  sb.data_offset = kDataOffset;
  sb.created_ns = NowNs();
  sb.checksums = options.checksums;
  sb.dedup = options.dedup;
  std::string data_path;
  uint64_t size = options.size;
  if (!options.device.empty()) {
    sb.backing = BackingKind::kBlockDevice;
    sb.device_path = stdfs::absolute(options.device).string();
    SPILLFS_ASSIGN_OR_RETURN(uint64_t device_size, BlockStore::SizeOf(sb.device_path));
    if (size == 0) size = device_size;
    if (size > device_size) {
      return Status::Invalid(fmt::format("--size {} is larger than {} ({} bytes)", size, sb.device_path, device_size));
    }
    data_path = sb.device_path;
  } else {
    sb.backing = BackingKind::kImageFile;
    data_path = ImagePath(dir);
  }
  size = size / kBlockSize * kBlockSize;
  if (size < kMinimumSize) {
    return Status::Invalid(fmt::format("volume size {} bytes is too small (minimum {} MiB)", size, kMinimumSize >> 20));
  }
  sb.data_size = size;

  std::error_code ec;
  stdfs::create_directories(dir, ec);
  if (ec) return Status::Error(ec.value(), fmt::format("cannot create {}: {}", dir, ec.message()));
  if (sb.backing == BackingKind::kImageFile) SPILLFS_RETURN_IF_ERROR(BlockStore::CreateImage(data_path, size));
  {
    SPILLFS_ASSIGN_OR_RETURN(auto store, BlockStore::Open(data_path));
    std::string block = sb.EncodeBlock();
    AlignedBuffer buffer(block.size());
    std::memcpy(buffer.data(), block.data(), block.size());
    SPILLFS_RETURN_IF_ERROR(store->WriteAt(0, buffer.data(), buffer.size()));
    SPILLFS_RETURN_IF_ERROR(store->Flush());
  }
  SPILLFS_RETURN_IF_ERROR(InitializeIndex(dir, sb));
  return sb;
}

Result<std::unique_ptr<Volume>> Volume::Open(const std::string& dir, const OpenOptions& options) {
  std::unique_ptr<Volume> volume(new Volume());
  volume->lock_fd_ = options.lock_fd;  // owned from here, failed or not
  std::error_code ec;
  if (!stdfs::is_directory(dir, ec)) return Status::NotFound(fmt::format("{} is not a directory", dir));
  if (!Exists(dir)) return Status::Error(EINVAL, fmt::format("{} is not a spillfs volume (no index/ inside)", dir));
  volume->dir_ = dir;
  if (volume->lock_fd_ < 0) {
    SPILLFS_ASSIGN_OR_RETURN(volume->lock_fd_, LockVolume(dir));
  } else {
    SPILLFS_RETURN_IF_ERROR(NoteLockHolder(volume->lock_fd_, LockPath(dir)));  // a forked daemon: its own pid
  }
  const Wrappers& wrap = options.wrappers;
  const bool wrapped = !options.read_only;
  Index::Options index_options{.read_only = options.read_only};
  if (wrapped && wrap.index_file_system) {
    SPILLFS_ASSIGN_OR_RETURN(index_options.file_system, wrap.index_file_system(IndexPath(dir)));
  }
  SPILLFS_ASSIGN_OR_RETURN(volume->index_, Index::Open(IndexPath(dir), index_options));
  SPILLFS_ASSIGN_OR_RETURN(volume->superblock_, volume->index_->GetSuperblock());
  const Superblock& sb = volume->superblock_;
  std::string data_path = sb.backing == BackingKind::kBlockDevice ? sb.device_path : ImagePath(dir);
  SPILLFS_ASSIGN_OR_RETURN(volume->store_, BlockStore::Open(data_path, options.read_only));
  if (wrapped && wrap.data_area) {
    SPILLFS_ASSIGN_OR_RETURN(volume->store_, wrap.data_area(std::move(volume->store_)));
  }
  if (volume->store_->size() < sb.data_size) {
    return Status::Corruption(fmt::format("data area {} has {} bytes, the superblock expects {}", data_path,
                                          volume->store_->size(), sb.data_size));
  }
  AlignedBuffer block(sb.block_size);
  SPILLFS_RETURN_IF_ERROR(volume->store_->ReadAt(0, block.data(), block.size()));
  auto on_disk = Superblock::DecodeBlock(std::string_view(block.data(), block.size()));
  if (!on_disk.ok()) return on_disk.status().WithContext(data_path);
  if (on_disk->uuid != sb.uuid) {
    return Status::Corruption(fmt::format("index and data area belong to different volumes (index {}, data {})",
                                          sb.UuidString(), on_disk->UuidString()));
  }
  if (!(*on_disk == sb)) return Status::Corruption("superblock copies in index and data area differ");
  return volume;
}

}  // namespace spillfs
