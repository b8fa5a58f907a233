// Filesystem: POSIX semantics over a Volume, independent of FUSE.
//
// Every method is one filesystem operation with the errors ext4 gives, carried
// as Status codes (errno values). Namespace changes run under one commit lock
// and commit one index batch each; file data is written to newly allocated
// blocks (redirect-on-write) before the batch that maps them. The FUSE daemon
// (fuse_daemon.h) is a thin adapter over this class, and unit tests drive it
// directly.
#pragma once

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "spillfs/cache/dedup.h"
#include "spillfs/cache/inode_locks.h"
#include "spillfs/cache/ram_tier.h"
#include "spillfs/cache/ram_tier_flusher.h"
#include "spillfs/cache/read_ahead.h"
#include "spillfs/cache/segment_plan.h"
#include "spillfs/common/aligned_buffer.h"
#include "spillfs/common/mutex.h"
#include "spillfs/common/status.h"
#include "spillfs/common/thread_annotations.h"
#include "spillfs/core/background_sync.h"
#include "spillfs/kvindex/records.h"
#include "spillfs/store/allocator.h"
#include "spillfs/store/reclaim_gate.h"
#include "spillfs/store/volume.h"

namespace spillfs {

// Who is asking: owner of created inodes.
struct Caller {
  uint32_t uid = 0;
  uint32_t gid = 0;
};

// An inode and its attributes, as returned to lookups.
struct Entry {
  InodeNumber ino = 0;
  uint64_t generation = 0;
  struct stat attr {};
};

struct DirEntry {
  std::string name;
  InodeNumber ino = 0;
  uint32_t type = 0;  // S_IFMT bits
};

// The attribute changes of one setattr call; unset fields stay as they are.
struct SetAttrRequest {
  std::optional<uint32_t> mode;  // permission bits (and suid/sgid/sticky)
  std::optional<uint32_t> uid;
  std::optional<uint32_t> gid;
  std::optional<uint64_t> size;
  std::optional<int64_t> atime_ns;  // kTimeNow for "now"
  std::optional<int64_t> mtime_ns;
  std::optional<int64_t> ctime_ns;
  static constexpr int64_t kTimeNow = INT64_MIN;
};

struct FilesystemOptions {
  // Size of the write-back RAM tier; 0 writes every request straight through.
  uint64_t ram_tier_bytes = DefaultRamTierBytes();
  // Non-ephemeral dirty data older than this is flushed by the background flusher.
  int64_t flush_age_ms = 2000;
  // Deduplicate flushed data (only where the volume was made with dedup on).
  bool dedup = true;
  // Bytes fetched ahead of each sequential reader (ReadAhead); 0: none.
  uint64_t read_ahead_bytes = kDefaultReadAheadBytes;
  static constexpr uint64_t kDefaultReadAheadBytes = 16ull << 20;
  // The largest read request a reader sends (the mount's --max-request, as
  // lowered to the kernel's limit: FuseDaemon::RequestBytesFor):
  // read-ahead windows are whole multiples of it (ReadAhead::Options).
  uint64_t read_request_bytes = 1ull << 20;
  // RAM-tier memory faulted in at open (at most ram_tier_bytes), so the first
  // writes after a mount do not pay for fresh pages.
  uint64_t ram_tier_warm_bytes = kDefaultRamTierWarmBytes;
  static constexpr uint64_t kDefaultRamTierWarmBytes = 256ull << 20;
  // RAM-tier data flushed per batch (rounded down to whole chunks, at least
  // one). Each batch is mapped only after a sync of the data area; several
  // are in flight at once. Big enough for the SSD's queue depth; tests make
  // it small to have many batches.
  uint64_t flush_batch_bytes = kDefaultFlushBatchBytes;
  static constexpr uint64_t kDefaultFlushBatchBytes = 64ull << 20;
  // A quarter of physical memory, at most 8 GiB.
  static uint64_t DefaultRamTierBytes();
  // A test seam: fails RAM-tier memory as if the system had none left
  // (BufferPool::SlabFault; spillfs/testing/memory.h). The product sets none.
  BufferPool::SlabFault ram_tier_slab_fault = nullptr;
  // A test seam: runs in DirectDedup after its blob look-ups, before it
  // takes its locks, where a commit of another file may land (a test makes
  // one there). The product sets none.
  std::function<void()> dedup_looked_up = nullptr;
};

// A file's committed mapping, handed to direct-path clients.
struct DirectLayout {
  InodeNumber ino = 0;
  uint64_t size = 0;
  std::vector<std::pair<uint64_t, ExtentRecord>> extents;  // file offset -> extent
};

// The xattr that marks a directory (and what is created under it) ephemeral.
inline constexpr const char* kEphemeralXattr = "user.spillfs.ephemeral";

// Counters shown by tools (issue: admin tools); monotonic since mount.
struct FsCounters {
  std::atomic<uint64_t> bytes_written{0};  // logical bytes accepted by write()
  std::atomic<uint64_t> bytes_read{0};     // logical bytes returned by read()
  std::atomic<uint64_t> checksum_errors{0};
  std::atomic<uint64_t> writes{0};              // write() calls
  std::atomic<uint64_t> reads{0};               // read() calls
  std::atomic<uint64_t> ram_tier_hits{0};       // blocks read from the RAM tier
  std::atomic<uint64_t> ram_tier_misses{0};     // blocks read from the SSD
  std::atomic<uint64_t> bytes_deduplicated{0};  // flushed or direct-path bytes stored as references
  // Bytes direct-path clients wrote to the data area themselves, counted as
  // their commit maps them (the daemon's block store never sees them), and
  // bytes the daemon wrote for memory I/O (MemoryWrite).
  std::atomic<uint64_t> bytes_written_direct{0};
  // Of bytes_written_direct, those MemoryWrite wrote: the block store counted
  // them too (the SSD's total subtracts them: ControlPlane::Runtime).
  std::atomic<uint64_t> bytes_written_memory{0};
};

class Filesystem : private FlushCommitter {
 public:
  static constexpr size_t kNameMax = 255;
  static constexpr size_t kSymlinkMax = 4095;
  static constexpr uint32_t kLinkMax = 65000;

  // Takes over an open volume; reclaims orphans (and, after a crash,
  // ephemeral files) and starts the background flusher.
  static Result<std::unique_ptr<Filesystem>> Open(std::unique_ptr<Volume> volume,
                                                  const FilesystemOptions& options = {});
  ~Filesystem() override;

  // --- namespace ---
  // Lookup, MakeNode, MakeDir, Symlink, Link and Create-style calls count a
  // kernel lookup reference on the returned inode; Forget drops them.
  Result<Entry> Lookup(InodeNumber parent, std::string_view name);
  void Forget(InodeNumber ino, uint64_t count);
  Result<Entry> GetAttr(InodeNumber ino);
  Result<Entry> SetAttr(InodeNumber ino, const SetAttrRequest& request);
  // Advanced after every change of an inode's mode or owner and of a
  // security.* attribute: a writer that found nothing to strip (set-id bits,
  // file capabilities) at epoch E need not look again while it is still E.
  uint64_t privilege_epoch() const { return privilege_epoch_.load(std::memory_order_acquire); }
  // What a write removes before it changes a file, as the kernel's
  // file_remove_privs does for writes through the page cache; the daemon does
  // it itself where the kernel leaves it to the server (direct_io handles)
  // or never sees the write (MemoryWrite). Unless `privileged` (root,
  // standing for CAP_FSETID, which the daemon cannot see), the set-user-ID
  // bit, and the set-group-ID bit of a group-executable file
  // (should_remove_suid: group membership does not matter); for every
  // writer, file capabilities (security.capability) (file_data.cc).
  struct PrivilegesRemoved {
    bool mode_changed = false;  // set-id bits went: the kernel's cached mode is stale
    // Nothing was there to remove: a writer may skip the look until
    // privilege_epoch() moves (as the kernel's S_NOSEC).
    bool none_found = false;
  };
  Result<PrivilegesRemoved> RemovePrivilegesForWrite(InodeNumber ino, bool privileged);
  Result<Entry> MakeNode(InodeNumber parent, std::string_view name, uint32_t mode, uint64_t rdev, const Caller& caller);
  Result<Entry> MakeDir(InodeNumber parent, std::string_view name, uint32_t mode, const Caller& caller);
  Result<Entry> Symlink(InodeNumber parent, std::string_view name, std::string_view target, const Caller& caller);
  Result<Entry> Link(InodeNumber ino, InodeNumber new_parent, std::string_view new_name);
  Result<std::string> ReadLink(InodeNumber ino);
  Status Unlink(InodeNumber parent, std::string_view name);
  Status Rmdir(InodeNumber parent, std::string_view name);
  // flags: 0, RENAME_NOREPLACE or RENAME_EXCHANGE.
  Status Rename(InodeNumber parent, std::string_view name, InodeNumber new_parent, std::string_view new_name,
                unsigned flags);
  // Entries of a directory, "." and ".." first.
  Result<std::vector<DirEntry>> ReadDir(InodeNumber ino);
  struct statvfs StatFs();

  // --- open files ---
  // Counts an open handle; the inode outlives its last link until Release.
  Status Open(InodeNumber ino);
  Status Release(InodeNumber ino);
  // The bytes of a read, in order, valid only during the call. They may be
  // RAM-tier chunks, under the file's I/O lock (shared) meanwhile: a sink
  // must not call back into this Filesystem.
  using ReadSink = std::function<void(const iovec* pieces, int count)>;
  // Reads up to `size` bytes at `offset` and hands them to `sink`: once, and
  // only when the read succeeds. Bytes in the RAM tier or in a read-ahead
  // window reach the sink without a copy; others are read into `scratch`.
  Result<size_t> Read(InodeNumber ino, uint64_t offset, size_t size, AlignedBuffer* scratch, const ReadSink& sink);
  // Called at most once, by Write, with the byte count, as soon as the write
  // can no longer fail and before `data` has been copied: the caller may
  // answer its client then, but must keep `data` valid until Write returns.
  using WriteAccepted = std::function<void(size_t)>;
  Result<size_t> Write(InodeNumber ino, uint64_t offset, const char* data, size_t size,
                       const WriteAccepted* accepted = nullptr);
  // Writes the file's cached data, settles every file (SettleAll) and makes
  // the data area and the index durable: everything done before it survives
  // a crash.
  Status Fsync(InodeNumber ino, bool datasync);
  // Close of a handle: writes the file's cached data, unless it is ephemeral
  // or unsettled (created since the last sync, kInodeUnsettled) with at most
  // kSettleLaterBytes cached: such a file is flushed in the background, many
  // at once, and until then a crash reclaims it whole.
  Status Flush(InodeNumber ino);
  static constexpr uint64_t kSettleLaterBytes = 1ull << 20;
  // Writes every cached file (ephemeral ones too).
  Status FlushAll();
  // mode: 0, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE|FALLOC_FL_KEEP_SIZE, FALLOC_FL_ZERO_RANGE.
  Status Fallocate(InodeNumber ino, int mode, uint64_t offset, uint64_t length);
  // SEEK_DATA / SEEK_HOLE.
  Result<uint64_t> Lseek(InodeNumber ino, uint64_t offset, int whence);

  // --- extended attributes ---
  Status SetXattr(InodeNumber ino, std::string_view name, std::string_view value, int flags);
  Result<std::string> GetXattr(InodeNumber ino, std::string_view name);
  Result<std::vector<std::string>> ListXattr(InodeNumber ino);
  Status RemoveXattr(InodeNumber ino, std::string_view name);

  // Makes every committed change durable (data flush, then index sync). The
  // data flush also reports a write-back lost since the last one (block_store.h).
  // Slow: not under mu_.
  Status SyncAll();
  // Flushes the cached data of every unsettled file (several at once, so
  // that they share their syncs of the data area) and clears the flag of
  // each: a SyncAll after it makes every file created so far durable.
  // REQUIRES: no lock of this Filesystem held (it takes files' flush locks).
  Status SettleAll();

  // --- direct data path (direct_path.cc) ---
  // The committed layout after flushing the file's RAM-tier data. Hold a
  // pin (PinBlocks) for as long as the client reads those blocks.
  Result<DirectLayout> GetDirectLayout(InodeNumber ino);
  std::unique_ptr<ReclaimGate::Reader> PinBlocks() { return std::make_unique<ReclaimGate::Reader>(&gate_); }
  // Space for a client to write; unmapped until DirectCommit.
  Result<std::vector<PhysicalExtent>> DirectReserve(uint64_t length);
  void DirectUnreserve(const std::vector<PhysicalExtent>& space);
  // Maps reserved `space` (in order) at `file_offset`; size = max(size, `size`).
  // Each of `units` (whole dedup units of the range, with the hash of their
  // bytes) that lies in one piece of `space` and whose hash no blob holds yet
  // becomes a blob, in the same batch, so later writes of the same bytes can
  // share it (DirectDedup, the flush path). The hashes are trusted as the
  // checksums are: commit is root's (MemoryWrite, which others may call,
  // takes them itself from the bytes it writes). Ignored where dedup is off.
  Status DirectCommit(InodeNumber ino, uint64_t file_offset, const std::vector<PhysicalExtent>& space,
                      const std::vector<uint32_t>& checksums, uint64_t size, const std::vector<DirectUnit>& units = {});
  // [start, end) byte ranges of a file, sorted, disjoint.
  using FileRanges = std::vector<std::pair<uint64_t, uint64_t>>;
  // The same, the reserved space laid back to back over several file ranges
  // (block aligned, sorted, disjoint, as many bytes in all as `space`): a
  // write of scattered pieces (a dedup'd checkpoint's changed units and
  // headers) in one commit, so one flush and one index batch. A unit must
  // lie within one range. EINVAL for ranges that break these rules (the
  // message names the range).
  Status DirectCommit(InodeNumber ino, const FileRanges& ranges, const std::vector<PhysicalExtent>& space,
                      const std::vector<uint32_t>& checksums, uint64_t size, const std::vector<DirectUnit>& units = {});
  // The dedup control op: `units` are dedup units of the file (each at a
  // multiple of dedup_unit(), sorted by file offset, none twice) with the
  // hash of the bytes the caller means to put there. Every unit whose hash a
  // blob of the volume holds is mapped into the file by reference, all in
  // one index batch with the blobs' reference counts after one flush of the
  // file's cached data (so one call for a whole file costs what one unit
  // does, less the per-unit work), and the size grows to cover the units
  // mapped. Returns which units were mapped (in the order of `units`); the
  // caller writes the others. EOPNOTSUPP where dedup is off, EINVAL for a
  // misaligned, unsorted or repeated offset or a hash not of 16 bytes (the
  // message names the unit), EFBIG past the largest file offset.
  Result<std::vector<bool>> DirectDedup(InodeNumber ino, const std::vector<DirectUnit>& units);
  // The same for `hashes` of consecutive units from `file_offset`.
  Result<std::vector<bool>> DirectDedup(InodeNumber ino, uint64_t file_offset, const std::vector<std::string>& hashes);
  static constexpr uint64_t dedup_unit() { return kDedupUnit; }

  // --- memory I/O (memory_io.cc): the daemon moves a file's bytes between
  // the data area and memory a client shares with it (the mem_write and
  // mem_read control ops; docs/design.md, "Memory I/O"), for callers that
  // may not open the data area. The caller (the control plane) has checked
  // that the client may write (read) `ino` through the mount and maps the
  // client's memory at `memory` (`memory_size` bytes, page aligned); the
  // client may change that memory while the call runs, and nothing the
  // call stores trusts it to stay put (memory_io.cc says how). Each piece is
  // `length` bytes at byte `memory` of the memory and byte `file` of the
  // file. Both pin the inode as an open handle does while they run.
  struct MemoryPiece {
    uint64_t memory = 0;
    uint64_t file = 0;
    uint64_t length = 0;
  };
  struct MemoryWritten {
    uint64_t written_bytes = 0;  // to the data area
    uint64_t mapped_bytes = 0;   // mapped by reference to blobs holding the same bytes
  };
  // Writes the pieces (block aligned, length > 0, sorted by file offset and
  // disjoint; EINVAL naming the piece otherwise, EFAULT for one past the
  // memory, EFBIG for one ending past 2^62) and sets the size to
  // max(size, `size`), which may not lie past the last piece (EINVAL), nor
  // leave a block of it past the end of the file. First the privileges a
  // write removes (RemovePrivilegesForWrite, `privileged` for root); then,
  // with `dedup` on a volume that dedups, each whole dedup unit of the file
  // that lies within one piece and ends at or before `size` is hashed here
  // and mapped by reference where a blob holds its bytes (DirectDedup); the
  // rest is reserved, written and committed in one DirectCommit (ranges
  // form), the units among it as new blobs. Kernel caches of the inode are
  // the caller's to drop.
  Result<MemoryWritten> MemoryWrite(InodeNumber ino, const char* memory, uint64_t memory_size,
                                    const std::vector<MemoryPiece>& pieces, uint64_t size, bool dedup, bool privileged);
  // Reads each piece (any offsets, length > 0; EINVAL, EFAULT, EFBIG as
  // MemoryWrite's) into the memory with Read, the mount's own read (RAM
  // tier, read-ahead, checksums verified: EIO), in steps of at most
  // kMemoryReadStep; bytes past the end of the file are zeros. Returns the
  // file's size after the reads.
  Result<uint64_t> MemoryRead(InodeNumber ino, char* memory, uint64_t memory_size,
                              const std::vector<MemoryPiece>& pieces);
  static constexpr uint64_t kMemoryReadStep = 8ull << 20;

  // Tests only: empties the record cache (the next look-up of each inode
  // reads the index); calls `hook` in each look-up that missed it, between
  // its index read and its decision to keep the record. Set before the
  // operations it is for, with no other thread in the Filesystem.
  void TEST_DropRecordCache() EXCLUDES(records_mu_) {
    MutexLock lock(&records_mu_);
    records_.clear();
  }
  void TEST_AfterRecordMiss(std::function<void(InodeNumber)> hook) { test_after_record_miss_ = std::move(hook); }

  Volume& volume() { return *volume_; }
  const FsCounters& counters() const { return counters_; }
  RamTier::Stats ram_tier_stats() const { return ram_tier_.stats(); }
  ReadAhead::Stats read_ahead_stats() const { return read_ahead_.stats(); }
  // Space that new data can still use (free minus RAM-tier promises).
  uint64_t free_bytes() const { return allocator_.available_bytes(); }
  uint64_t block_size() const { return block_size_; }

 private:
  // In-memory state of an inode the kernel knows about.
  struct InodeState {
    uint64_t lookups = 0;
    uint32_t opens = 0;
  };
  // A commit in progress: one index batch and the space it frees.
  struct Txn {
    explicit Txn(const Index& index, size_t reserve_bytes = 0) : batch(index, reserve_bytes) {}
    Index::Batch batch;
    std::vector<PhysicalExtent> freed;
    // Applied by CommitTxn (Dedup::ApplyBlobRefs).
    std::map<uint64_t, int64_t> blob_refs;  // blob physical offset -> reference delta
    // Blobs first written by this txn, and blobs whose record it rewrites
    // (DirectDedup adds checksums): the record that ApplyBlobRefs updates.
    std::map<uint64_t, BlobRecord> new_blobs;
    // Records known as they are under mu_ (DirectDedup's hits), not read
    // again; they outlive the txn.
    std::unordered_map<uint64_t, const BlobRecord*> current_blobs;
    // The inode records this batch puts (or deletes: nullopt), in order:
    // CommitTxn applies them to the record cache once the batch is in.
    std::vector<std::pair<InodeNumber, std::optional<InodeRecord>>> inodes;
  };

  Filesystem(std::unique_ptr<Volume> volume, const FilesystemOptions& options);
  Status Recover();
  Status ReclaimEphemeral();

  // Index helpers. An operation that commits holds mu_ from its first read
  // of what it changes; a reader may call the loaders without it.
  // The inode's record: from the record cache, else from the index (and
  // then cached, unless a commit came in between).
  Result<InodeRecord> LoadInode(InodeNumber ino) EXCLUDES(records_mu_);
  Result<InodeRecord> LoadDir(InodeNumber ino);
  void PutInode(Txn* txn, InodeNumber ino, const InodeRecord& record);
  Result<Entry> CreateInode(InodeNumber parent, std::string_view name, InodeRecord record);
  Result<DirentRecord> FindDirent(InodeNumber parent, std::string_view name);
  Result<bool> DirIsEmpty(InodeNumber ino);
  // Drops one link of `ino` (its dirent is removed by the caller); frees it
  // when no link and no open handle remain, else records an orphan.
  Status DropLink(Txn* txn, InodeNumber ino, InodeRecord* record) REQUIRES(mu_);
  void DeleteInode(Txn* txn, InodeNumber ino, const InodeRecord& record) REQUIRES(mu_);
  Status CommitTxn(Txn* txn) REQUIRES(mu_);
  bool IsUnsettled(InodeNumber ino) const;
  // Settles the files of `inos` that are unsettled (SettleAll's steps).
  Status Settle(const std::vector<InodeNumber>& inos);
  // A rename that replaces a name settles an unsettled file that takes it
  // first (both files of an exchange): a crash must not reclaim the file
  // and so lose the name it replaced (ext4's auto_da_alloc, for the same
  // reason).
  Status SettleForRename(InodeNumber parent, std::string_view name, InodeNumber new_parent, std::string_view new_name,
                         unsigned flags);
  void CountLookup(InodeNumber ino) REQUIRES(mu_);
  // The attributes of `ino`: `record` with the RAM tier's overlay (the size
  // and mtime of cached data) on top. A flush commits a file's size and then
  // drops its overlay, both under mu_ and the flush lock: the caller holds
  // one of them from loading `record` on, or takes the overlay first
  // (GetAttr). (DeleteInode drops the overlay of an inode it deletes first:
  // a getattr meanwhile may show its older committed size.) Taken in that
  // order, st_blocks may count a batch being flushed twice for a moment.
  Entry MakeEntry(InodeNumber ino, const InodeRecord& record) const;
  Entry MakeEntry(InodeNumber ino, const InodeRecord& record, const std::optional<RamTier::Overlay>& overlay) const;
  // The inode's I/O lock and flush lock (the lock order, with what each
  // guards: cache/inode_locks.h).
  SharedMutex& IoLock(InodeNumber ino) { return locks_.Io(ino); }
  WaitedMutex& FlushLock(InodeNumber ino) { return locks_.Flush(ino); }
  // Declared after the exclusive I/O lock of an operation that changes a
  // file's bytes or size: drops the file's read-ahead windows when the
  // operation ends, before the I/O lock lets readers in again.
  class ContentChange {
   public:
    ContentChange(ReadAhead* read_ahead, InodeNumber ino) : read_ahead_(read_ahead), ino_(ino) {}
    ~ContentChange() { read_ahead_->Invalidate(ino_); }
    ContentChange(const ContentChange&) = delete;
    ContentChange& operator=(const ContentChange&) = delete;

   private:
    ReadAhead* read_ahead_;
    InodeNumber ino_;
  };
  // Background fetch of a read-ahead window: from the SSD only, no lock (Read
  // does not use a window over RAM-tier data; CommitBatch invalidates).
  Status FetchAhead(InodeNumber ino, uint64_t offset, uint64_t length, char* out);

  // Data-path helpers (file_data.cc).
  // Reads blocks [first, first + count) of `ino` into `out` (holes as zeros).
  // A `speculative` read (read-ahead) neither counts nor logs a checksum
  // mismatch: the reader's own read will, if it comes.
  Status ReadBlocks(InodeNumber ino, uint64_t first_block, uint64_t count, char* out, bool speculative = false);
  // Writes whole blocks of the file `record` at block-aligned `file_offset`,
  // redirect-on-write, and makes them ready to map (FlushBeforeMapping);
  // returns the new extents for the caller to map in its txn. The space is
  // given back on failure.
  Result<std::vector<std::pair<uint64_t, ExtentRecord>>> WriteBlocks(const InodeRecord& record, const char* data,
                                                                     uint64_t file_offset, uint64_t length);
  // Write paths: through the RAM tier, or straight to new blocks.
  Result<size_t> WriteCached(InodeNumber ino, uint64_t offset, const char* data, size_t size,
                             const WriteAccepted* accepted);
  // True when a cached chunk (with `flushing_only`: one being flushed) holds
  // a block of [first_block, last_block); I/O lock held.
  bool FindCachedChunk(InodeNumber ino, uint64_t first_block, uint64_t last_block, bool flushing_only)
      REQUIRES_SHARED(IoLock(ino));
  Result<size_t> WriteThrough(InodeNumber ino, uint64_t offset, const char* data, size_t size);
  // Reads blocks, preferring cached ones; caller holds the I/O lock shared.
  Status ReadBlocksCached(InodeNumber ino, uint64_t first_block, uint64_t count, char* out)
      REQUIRES_SHARED(IoLock(ino));
  // [offset, end) as pieces of RAM-tier chunks when every block of it is
  // cached; false otherwise. The caller holds the I/O lock while it uses them.
  bool CachedPieces(InodeNumber ino, uint64_t offset, uint64_t end, std::vector<iovec>* pieces)
      REQUIRES_SHARED(IoLock(ino));
  // FlushCommitter (flush_commit.cc), called back by flusher_: the commit of
  // a flushed batch, under the inode's flush lock and I/O lock.
  Status CommitBatch(InodeNumber ino, FlushBatch* batch) override REQUIRES(IoLock(ino));
  // The flusher's flushes, for a caller that holds FlushLock(ino) and the I/O
  // lock exclusively (runs every step under them).
  Status FlushLocked(InodeNumber ino) REQUIRES(FlushLock(ino), IoLock(ino)) { return flusher_.FlushLocked(ino); }
  // Crash order rule 2 (docs/design.md): makes the data area durable before a
  // batch that maps data just written to it is committed. Whatever reaches
  // RocksDB's WAL may reach the media at any moment (kernel write-back of
  // the WAL, a memtable flush, another thread's sync), so the data must be
  // durable first, on an image file as on a device of its own. Callers
  // sharing the moment share one fdatasync (BlockStore::Flush). Ephemeral
  // files promise nothing across a crash (reclaimed at mount): no flush.
  // Call it after the data writes completed and before taking mu_, holding
  // FlushLock(ino) (which SetXattr takes to change the ephemeral flag).
  Status FlushBeforeMapping(const InodeRecord& record);
  Status FlushBeforeMapping(InodeNumber ino) override;
  // Before a change of the ephemeral flag: takes `flush_lock` (the file's
  // FlushLock), and flushes the data area when an ephemeral regular file
  // stops being one (`clears`) (xattr.cc).
  Status FlushForEphemeralChange(InodeNumber ino, bool clears, std::unique_lock<WaitedMutex>* flush_lock);
  static void ApplyOverlay(const RamTier::Overlay& overlay, Entry* entry);
  // Unmaps [start, end) (block aligned; end may be UINT64_MAX) into txn.
  Status UnmapRange(Txn* txn, InodeNumber ino, uint64_t start, uint64_t end, uint64_t* unmapped_bytes) REQUIRES(mu_);
  // Unmaps several sorted, disjoint ranges in one pass.
  Status UnmapRanges(Txn* txn, InodeNumber ino, const std::vector<std::pair<uint64_t, uint64_t>>& ranges,
                     uint64_t* unmapped_bytes) REQUIRES(mu_);
  void MapExtents(Txn* txn, InodeNumber ino, const std::vector<std::pair<uint64_t, ExtentRecord>>& extents)
      REQUIRES(mu_);
  std::vector<uint32_t> Checksums(const char* data, uint64_t length) const;
  bool VerifyBlocks(const ExtentRecord& extent, uint64_t first_block, uint64_t count, const char* data);

  std::unique_ptr<Volume> volume_;
  Index& index_;
  BlockStore& store_;
  const uint64_t block_size_;
  const bool checksums_;
  bool dedup_ = false;
  const FilesystemOptions options_;
  const Dedup::BlockSums block_sums_;  // Checksums
  Dedup deduper_;                      // over index_, with block_sums_
  Allocator allocator_;
  ReclaimGate gate_;
  FsCounters counters_;
  RamTier ram_tier_;
  ReadAhead read_ahead_;  // after what its fetches use: destroyed (joined) first
  InodeLocks locks_;      // FlushLock, IoLock
  // The RAM tier's flushes; its thread runs from Open to the destructor.
  RamTierFlusher flusher_;
  // SyncAll on its own thread, asked for by CommitTxn when freed space has
  // been parked too long (CommitTxn runs under mu_, where a sync would stall
  // every metadata operation). Null once the destructor is done with it.
  std::unique_ptr<BackgroundSync> parked_sync_;
  bool opened_ = false;  // Open finished (recovery included): a close may be marked clean
  std::atomic<uint64_t> privilege_epoch_{1};
  // Bumped by CommitTxn, under mu_, after a batch that changed a blob record
  // (created, deleted, or its reference count: Dedup::ApplyBlobRefs is the
  // only online writer of blob records) is committed. Read without a lock:
  // where it has not moved since a look-up (FindBlobs) began, the blob found
  // is still there with the record found (DirectDedup looks again only where
  // it moved).
  std::atomic<uint64_t> blob_epoch_{0};

  // The commit lock, third in the daemon's lock order (cache/inode_locks.h
  // states it whole): under FlushLock(ino) and IoLock(ino), over the leaves.
  Mutex mu_;
  InodeNumber next_ino_ GUARDED_BY(mu_) = 0;
  std::unordered_map<InodeNumber, InodeState> inodes_ GUARDED_BY(mu_);

  // The record cache: inode records as the index holds them, for the
  // look-ups every operation starts with (GetAttr, Lookup, the SetAttrs
  // after a create); an index Get was the most of a stat's time in the
  // daemon. Every inode record is written by a Txn, so CommitTxn, under
  // mu_ and once the batch is in the index, puts what it wrote here (or
  // drops it: a failed commit). A miss is read from the index and kept
  // only if no commit was applied meanwhile (records_seq_ unchanged):
  // readers without mu_ (GetAttr) would otherwise put back a record that a
  // commit had just replaced. Emptied whole at kRecordCacheEntries. A leaf
  // lock.
  static constexpr size_t kRecordCacheEntries = 1u << 16;
  void ApplyToRecordCache(const Txn& txn, bool committed) EXCLUDES(records_mu_);
  mutable Mutex records_mu_;
  std::unordered_map<InodeNumber, InodeRecord> records_ GUARDED_BY(records_mu_);
  uint64_t records_seq_ GUARDED_BY(records_mu_) = 0;
  std::function<void(InodeNumber)> test_after_record_miss_;

  // The inodes whose records carry kInodeUnsettled (none at Open: a clean
  // stop settles every file, an unclean one's are reclaimed). A leaf lock.
  mutable Mutex unsettled_mu_;
  std::unordered_set<InodeNumber> unsettled_ GUARDED_BY(unsettled_mu_);
};

}  // namespace spillfs
