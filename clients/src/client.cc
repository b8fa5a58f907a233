// The spillfs client library: the C ABI over the direct data path, and the
// life of a handle (open, fork, teardown). The work itself: client_impl.h.
#include "spillfs/client.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "client_impl.h"
#include "error.h"
#include "spillfs/common/control_protocol.h"
#include "spillfs/common/mountinfo.h"

using namespace spillfs::client;
using spillfs::RoundDown;
using spillfs::RoundUp;

spill_client::~spill_client() {
  AdoptAfterFork();
  std::list<std::shared_ptr<Layout>> layouts;
  std::map<std::string, int> fds;
  {
    // Emptied under the locks (a fork by another thread now copies whole
    // containers), closed after them.
    std::scoped_lock lock(pool_mu, data_mu, cache_mu);
    layouts.splice(layouts.begin(), cache);
    fds.swap(data_fds);
  }
  for (auto& [path, fd] : fds) close(fd);
}

// Called first by every entry point. In a child after fork() (a PyTorch
// DataLoader worker, say) only the forking thread exists: the pool's
// workers are gone (a task queued there would never run, and joining them
// never returns), and the control channels share their open files with the
// parent, whose requests and replies would interleave with the child's.
// So the child leaves all of that to the parent and starts afresh: no pool
// yet (made at first use), no cached layouts (their leases stay the
// parent's; the child opens its own channels as it goes). The backing store
// descriptors are kept: positioned I/O shares nothing but the file. The
// mutexes and what they guard came across whole (fork_guard), and the
// adoption runs under them, so a fork by another thread of the child never
// sees it half done. (The io_uring ring is per thread: io_ring.cc renews it.)
void spill_client::AdoptAfterFork() {
  const pid_t self = getpid();
  if (owner.load(std::memory_order_acquire) == self) return;
  std::shared_ptr<TaskPool> parents_pool;
  std::list<std::shared_ptr<Layout>> parents_layouts;
  std::unique_ptr<ControlChannel> parents_control;
  {
    std::scoped_lock lock(pool_mu, data_mu, cache_mu);
    if (owner.load(std::memory_order_acquire) == self) return;  // another thread adopted it
    parents_pool = std::move(pool);
    parents_layouts.splice(parents_layouts.begin(), cache);
    parents_control = std::move(control);  // used only by spill_client_open
    owner.store(self, std::memory_order_release);
  }
  // Left alone, never destroyed: ~TaskPool would join threads of the parent.
  if (parents_pool) new std::shared_ptr<TaskPool>(std::move(parents_pool));
  // parents_layouts and parents_control close this process's copies of the
  // lease descriptors only, outside the locks (a close is a FUSE round trip).
}

// "/a/b" for "a/b", "/a/b" or MOUNTPOINT "/a/b".
int spill_client::Normalize(const char* path, std::string* out) const {
  if (path == nullptr || *path == '\0') return Fail(EINVAL, "empty path");
  std::string p = path;
  if (p.size() > mountpoint.size() && p.compare(0, mountpoint.size(), mountpoint) == 0 && p[mountpoint.size()] == '/') {
    p = p.substr(mountpoint.size());
  }
  if (p[0] != '/') p.insert(p.begin(), '/');
  *out = std::move(p);
  return 0;
}

int spill_client::DataFd(const std::string& path, int* fd) {
  std::lock_guard lock(data_mu);
  auto it = data_fds.find(path);
  if (it != data_fds.end()) {
    *fd = it->second;
    return 0;
  }
  int f = open(path.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
  if (f < 0) {
    int e = errno;
    return Fail(e, WithErrno("cannot open the backing store " + path + " with O_DIRECT", e));
  }
  data_fds.emplace(path, f);
  *fd = f;
  return 0;
}

// Threads are started and an old pool joined outside pool_mu: it is held
// across fork() (fork_guard), so it is only ever held briefly.
std::shared_ptr<TaskPool> spill_client::Pool() {
  const unsigned threads = checksum_threads.load();
  {
    std::lock_guard lock(pool_mu);
    if (pool && pool->size() == threads) return pool;
  }
  auto fresh = std::make_shared<TaskPool>(threads);
  std::shared_ptr<TaskPool> old;  // joined when the last call using it is done, after the lock
  std::lock_guard lock(pool_mu);
  if (pool && pool->size() == threads) return pool;  // another thread made one meanwhile
  old = std::move(pool);
  pool = fresh;
  return pool;
}

// ---- the C ABI ----

extern "C" {

spill_client* spill_client_open(const char* mountpoint) {
  ClearError();
  if (mountpoint == nullptr || *mountpoint == '\0') {
    Fail(EINVAL, "empty mountpoint");
    errno = EINVAL;
    return nullptr;
  }
  char* real = realpath(mountpoint, nullptr);
  if (real == nullptr) {
    int e = errno;
    Fail(e, WithErrno(std::string("cannot resolve ") + mountpoint, e));
    errno = e;
    return nullptr;
  }
  std::string canonical = real;
  free(real);
  auto mount = spillfs::FindMountAt(canonical);
  auto fail = [](int rc) -> spill_client* {
    errno = -rc;
    return nullptr;
  };
  if (!mount) return fail(Fail(EINVAL, canonical + " is not a mount point"));
  if (mount->fstype != spillfs::control::kFsType) {
    return fail(Fail(EINVAL, canonical + " is not a spillfs mount (" + mount->fstype + ")"));
  }
  auto client = std::make_unique<spill_client>();
  client->mountpoint = canonical;
  client->volume = mount->source;
  client->control_path = spillfs::control::ControlPath(canonical);
  int rc = client->OpenChannel(&client->control);
  if (rc != 0) return fail(rc);
  // The volume's settings: "volume" (no scan of the index, where "stat" reads
  // every inode and extent: a save opens a client), from a daemon of this
  // client's protocol version only.
  json info;
  rc = client->control->Request(json{{spillfs::control::key::kOp, spillfs::control::op::kVolume}}, &info);
  if (rc == -EINVAL)
    info = json::object();  // a daemon from before "volume": refused below, naming its version
  else if (rc != 0)
    return fail(rc);
  if (spillfs::Status same = spillfs::control::CheckProtocol(info, client->control_path); !same.ok()) {
    return fail(Fail(same.code(), same.message()));
  }
  if (!info.is_object() || !GetU64(info, "block_size", &client->block_size)) {
    return fail(Fail(EPROTO, "malformed stat reply from " + client->control_path));
  }
  if (client->block_size == 0 || client->block_size % kDirectAlignment != 0) {
    return fail(Fail(ENOTSUP, "block size " + std::to_string(client->block_size) + " is not a multiple of 4096"));
  }
  if (auto c = info.find("checksums"); c != info.end() && c->is_boolean()) {
    client->checksums = c->get<bool>();
  }
  if (auto d = info.find("dedup"); d != info.end() && d->is_boolean()) client->dedup = d->get<bool>();
  // An image volume keeps its data in VOLUME/data.img; open it now, so a
  // process that may not is told at once. (A device volume's store is opened
  // at the first layout or reservation, which name it.)
  std::string image = client->volume + "/data.img";
  struct stat st;
  if (stat(image.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
    int fd;
    if ((rc = client->DataFd(image, &fd)) != 0) return fail(rc);
  }
  return client.release();
}

int spill_client_close(spill_client* client) {
  ClearError();
  delete client;
  return 0;
}

int spill_client_set(spill_client* client, const char* key, uint64_t value) {
  ClearError();
  if (client == nullptr || key == nullptr) return Fail(EINVAL, "null handle or key");
  client->AdoptAfterFork();
  std::string k = key;
  if (k == "queue_depth" || k == "rows_queue_depth") {
    if (value < 1 || value > kMaxQueueDepth) {
      return Fail(EINVAL, k + " must be 1.." + std::to_string(kMaxQueueDepth));
    }
    (k == "queue_depth" ? client->queue_depth : client->rows_queue_depth) = static_cast<unsigned>(value);
  } else if (k == "io_bytes" || k == "rows_io_bytes") {
    if (value < client->block_size || value % client->block_size != 0 || value > (64u << 20)) {
      return Fail(EINVAL, k + " must be a multiple of the block size, at most 64 MiB");
    }
    (k == "io_bytes" ? client->io_bytes : client->rows_io_bytes) = static_cast<uint32_t>(value);
  } else if (k == "commit_bytes") {
    // A commit carries one checksum per block in a request of at most 16 MiB.
    if (value < client->block_size || value % client->block_size != 0 || value > (4ull << 30)) {
      return Fail(EINVAL, "commit_bytes must be a multiple of the block size, at most 4 GiB");
    }
    client->commit_bytes = value;
  } else if (k == "checksum_threads") {
    if (value > 64) return Fail(EINVAL, "checksum_threads must be 0..64");
    client->checksum_threads = static_cast<unsigned>(value);
  } else if (k == "lease_ms") {
    client->lease_ms = value;
  } else if (k == "verify") {
    client->verify = value != 0;
  } else if (k == "layout_cache") {
    client->layout_cache_capacity = static_cast<size_t>(value);
    std::list<std::shared_ptr<Layout>> dropped;  // destroyed after the lock
    std::lock_guard lock(client->cache_mu);
    auto& cache = client->cache;
    while (cache.size() > value) dropped.splice(dropped.end(), cache, std::prev(cache.end()));
  } else {
    return Fail(EINVAL, "unknown setting " + k);
  }
  return 0;
}

int spill_write(spill_client* client, const char* path, const void* buf, size_t len) {
  ClearError();
  if (client == nullptr) return Fail(EINVAL, "null handle");
  client->AdoptAfterFork();
  return client->Write(path, buf, len);
}

int64_t spill_read(spill_client* client, const char* path, void* buf, size_t len, uint64_t offset) {
  ClearError();
  if (client == nullptr) return Fail(EINVAL, "null handle");
  client->AdoptAfterFork();
  return client->Read(path, buf, len, offset);
}

int spill_read_rows(spill_client* client, const char* path, uint64_t row_bytes, const uint64_t* rows, size_t n,
                    void* out) {
  ClearError();
  if (client == nullptr) return Fail(EINVAL, "null handle");
  client->AdoptAfterFork();
  return client->ReadRows(path, row_bytes, rows, n, out);
}

int spill_forget(spill_client* client, const char* path) {
  ClearError();
  if (client == nullptr) return Fail(EINVAL, "null handle");
  client->AdoptAfterFork();
  return client->Forget(path);
}

int spill_client_get_stats(spill_client* client, spill_client_stats* stats) {
  ClearError();
  if (client == nullptr || stats == nullptr) return Fail(EINVAL, "null handle or stats");
  stats->bytes_written = client->bytes_written.load();
  stats->bytes_read = client->bytes_read.load();
  stats->ios = client->ios.load();
  stats->layouts = client->layouts.load();
  stats->layout_cache_hits = client->cache_hits.load();
  stats->checksum_errors = client->checksum_errors.load();
  return 0;
}

const char* spill_last_error(void) { return LastError().c_str(); }

}  // extern "C"
