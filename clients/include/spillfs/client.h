/* spillfs client library: the direct data path (spill_client_*, spill_write,
 * spill_read, spill_read_rows) and segment files on any file system
 * (spill_file_*, below: what spillfs.save and spillfs.load stand on).
 *
 * A process that may open a volume's backing store (an image file or a block
 * device; normally root) asks the daemon through MOUNTPOINT/.spillfs/control
 * for a file's extent layout, or for fresh extents to fill and then commit,
 * and moves the bytes itself with io_uring and O_DIRECT. The daemon never
 * touches the data; it only maps it. Every 4 KiB block read is verified
 * against the checksum the daemon keeps (a mismatch is an error, never wrong
 * bytes).
 *
 * C ABI so one build serves any Python (ctypes) and any torch version.
 *
 * Conventions:
 *  - Functions that return int return 0 (or a byte count) on success and a
 *    negative errno on failure; spill_last_error() then says what went wrong
 *    (a thread-local message, valid until the next call on the same thread).
 *  - Paths are relative to the mount root ("a/b", "/a/b"); an absolute path
 *    under the mountpoint ("/mnt/spill/a/b") is accepted too.
 *  - Buffers may have any alignment; aligned ones (4 KiB) are transferred
 *    without a copy, others bounce through aligned buffers of the library.
 *  - A handle may be used from several threads at once.
 */
#ifndef SPILLFS_CLIENT_H_
#define SPILLFS_CLIENT_H_

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define SPILL_API __attribute__((visibility("default")))
#else
#define SPILL_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct spill_client spill_client;

/* Opens the direct path to the spillfs mount at `mountpoint`: checks that it
 * is a spillfs mount (fuse.spillfs in /proc/self/mountinfo), opens its
 * control file (root only) and the backing store with O_DIRECT. NULL on
 * failure (see spill_last_error() and errno). */
SPILL_API spill_client* spill_client_open(const char* mountpoint);

/* Closes the handle: drops every layout lease and reservation it holds. */
SPILL_API int spill_client_close(spill_client* client);

/* Tunables (all have defaults that suit the CPU and GPU machines):
 *   "queue_depth"       I/Os in flight for spill_write / spill_read (32)
 *   "rows_queue_depth"  I/Os in flight for spill_read_rows (128)
 *   "io_bytes"          size of one sequential I/O (1 MiB, multiple of 4 KiB)
 *   "rows_io_bytes"     largest coalesced row I/O (128 KiB)
 *   "commit_bytes"      bytes reserved and committed per step of a write (256 MiB,
 *                       at most 4 GiB; a step's commit overlaps the next step's
 *                       writes)
 *   "verify"            verify block checksums on read (1)
 *   "checksum_threads"  threads that take and verify the block checksums of
 *                       spill_write / spill_read while the I/O goes on (half
 *                       the cores, 1..4; 0 = on the calling thread)
 *   "layout_cache"      paths whose layout spill_read_rows keeps (16; 0 = none)
 *   "lease_ms"          age after which a kept layout is taken anew (10000; 0 =
 *                       never). A kept layout's lease holds back the reuse of
 *                       all space freed in the volume since it was taken.
 * Returns 0, or -EINVAL for an unknown key or a bad value. */
SPILL_API int spill_client_set(spill_client* client, const char* key, uint64_t value);

/* Creates (or truncates) the file through the mount, then writes `len` bytes
 * of `buf` on the direct path: reserve, io_uring O_DIRECT writes, commit. A
 * partial tail block is padded with zeros on disk; the file size is `len`.
 * Files larger than "commit_bytes" are committed in steps, each visible once
 * committed. Returns 0 or -errno; after an error the file's contents are
 * unspecified (as after a failed write()), and uncommitted space is returned.
 * Durability is that of write(): fsync the file through the mount for more. */
SPILL_API int spill_write(spill_client* client, const char* path, const void* buf, size_t len);

/* Reads up to `len` bytes at `offset` into `buf`. Holes and unwritten
 * extents read as zeros. Returns the number of bytes read (short at the end
 * of the file, 0 at or past it) or -errno (-EIO on a checksum mismatch). */
SPILL_API int64_t spill_read(spill_client* client, const char* path, void* buf, size_t len, uint64_t offset);

/* Batched random row reads for feature tables: row i of `rows` is the
 * `row_bytes` bytes at rows[i] * row_bytes, copied to out + i * row_bytes.
 * Rows may repeat and come in any order. Every row must lie within the file
 * (else -ERANGE, and nothing is read). The layout is kept per path (a lease,
 * refreshed when the file changes or a checksum does not match). Returns 0
 * or -errno. */
SPILL_API int spill_read_rows(spill_client* client, const char* path, uint64_t row_bytes, const uint64_t* rows,
                              size_t n, void* out);

/* Drops the cached layout (and its lease) of `path`; NULL drops all. */
SPILL_API int spill_forget(spill_client* client, const char* path);

/* Counters of this handle since it was opened. */
typedef struct spill_client_stats {
  uint64_t bytes_written; /* by spill_write, to the backing store */
  uint64_t bytes_read;    /* from the backing store (whole blocks) */
  uint64_t ios;           /* io_uring requests completed */
  uint64_t layouts;       /* layout requests sent to the daemon */
  uint64_t layout_cache_hits;
  uint64_t checksum_errors; /* blocks that failed verification (then retried) */
} spill_client_stats;
SPILL_API int spill_client_get_stats(spill_client* client, spill_client_stats* stats);

/* The message of the last error on this thread ("" when none). */
SPILL_API const char* spill_last_error(void);

/* ---- Segment files: any path, host or CUDA memory ----
 *
 * A spill_file moves lists of segments (pointer, length, file offset, host or
 * CUDA device) to and from one file, asynchronously. How, is chosen at open:
 *  - on a spillfs mount, where the process may open the volume's backing
 *    store (root): the direct path (reserve space, io_uring O_DIRECT writes
 *    into the store, commit with block checksums; reads by the file's layout,
 *    every block verified);
 *  - on a spillfs mount otherwise: io_uring O_DIRECT through the mount;
 *  - on any other file system: io_uring O_DIRECT, or buffered io_uring where
 *    the file system refuses O_DIRECT (EINVAL at open).
 * The library assembles the file's bytes in chunk-sized, 4 KiB-aligned
 * staging buffers from a process-wide pool (pinned where CUDA is present):
 * host segments are copied in (or written straight from memory where a
 * 4 KiB-aligned segment covers a whole piece), device segments arrive by
 * device-to-host copies on a stream of the library's that first waits for
 * the caller's stream, never through pageable memory; the disk I/O of one
 * chunk overlaps the copy of the next. Reads run the other way, and the
 * caller's stream is made to wait for the host-to-device copies.
 *
 * Writes build files: the library writes whole 4 KiB blocks. Bytes of a block
 * that a request partly covers keep their contents (read first where they lie
 * inside the file; zeros past its end); blocks no segment touches are not
 * written. So two requests in flight at once on one file must not touch the
 * same 4 KiB block. A write never shrinks the file; its size is exact (no
 * padding shows) once no write request of the handle is in flight.
 *
 * Threading: a spill_file may be used from several threads; requests run on
 * threads of their own and any thread may wait for one. spill_file_truncate,
 * spill_file_close and spill_file_dedup must not overlap a write request in
 * flight on the same range (close and truncate: on the handle; -EBUSY); a
 * dedup may run while write requests of other ranges do (a save writes the
 * units it knows are new while it asks about the others). */

typedef struct spill_file spill_file;
typedef struct spill_request spill_request;

/* spill_file_open flags. */
#define SPILL_FILE_READ 1
#define SPILL_FILE_WRITE 2
#define SPILL_FILE_CREATE 4   /* create it if missing (mode 0644 less the umask); needs WRITE */
#define SPILL_FILE_TRUNCATE 8 /* empty it at open; needs WRITE */

/* Backends (spill_file_backend). */
#define SPILL_BACKEND_DIRECT_PATH 1 /* spillfs mount, the backing store's direct path */
#define SPILL_BACKEND_MOUNT 2       /* spillfs mount, io_uring through the mount */
#define SPILL_BACKEND_DIRECT_IO 3   /* other file system, io_uring O_DIRECT */
#define SPILL_BACKEND_BUFFERED 4    /* other file system refusing O_DIRECT: buffered io_uring */
#define SPILL_BACKEND_MEMORY_IO                                                  \
  5 /* spillfs mount, not allowed the backing store (not root): the daemon moves \
       the bytes between it and staging memory shared with it (a memfd) */

typedef struct spill_segment {
  void* ptr;            /* host or device memory */
  uint64_t length;      /* bytes; 0 is allowed (nothing moves) */
  uint64_t file_offset; /* any alignment */
  int32_t device;       /* -1: host memory, else the CUDA device ordinal */
} spill_segment;

/* What one request did (spill_request_wait). Seconds overlap: copies and
 * hashing run while I/O is in flight. */
typedef struct spill_io_stats {
  uint64_t bytes;        /* bytes of the segments */
  uint64_t io_bytes;     /* bytes written to or read from storage (whole blocks) */
  uint64_t ios;          /* I/O operations */
  double seconds;        /* from the call to completion */
  double copy_seconds;   /* copying into and out of staging buffers (memcpy, waits for device copies) */
  double io_seconds;     /* with at least one I/O in flight */
  double hash_seconds;   /* block checksums and unit hashes of the direct path */
  double daemon_seconds; /* waiting for the daemon: layout, reserve, commit (memory I/O: its I/O too) */
  uint64_t shared_bytes; /* memory I/O writes: bytes the daemon shared with units the volume held (dedup) */
} spill_io_stats;

/* Opens `path` (any path; relative to the working directory unless absolute).
 * flags: SPILL_FILE_READ and/or SPILL_FILE_WRITE, with SPILL_FILE_CREATE and
 * SPILL_FILE_TRUNCATE. size_hint: bytes the file is expected to hold (0: not
 * known); not used yet (preallocation on ext4 made O_DIRECT writes slower).
 * NULL on failure (spill_last_error(), errno). */
SPILL_API spill_file* spill_file_open(const char* path, int flags, uint64_t size_hint);

/* SPILL_BACKEND_* of the handle, or -EINVAL. */
SPILL_API int spill_file_backend(spill_file* file);

/* Starts writing `n` segments (they must not overlap each other) and returns
 * at once: 0 with *out set to a request to wait for, or -errno (nothing
 * started). The array may be freed when this returns; the memory its
 * segments point to must stay valid and unchanged until the request is
 * waited for. Device segments are read after the work queued on `stream`
 * (a cudaStream_t as an integer; 0: the legacy default stream) before this
 * call. A request that fails leaves what it did not write unspecified, like
 * a failed write(); on a full volume it fails with -ENOSPC. */
SPILL_API int spill_file_write_segments(spill_file* file, const spill_segment* segments, size_t n, uintptr_t stream,
                                        spill_request** out);

/* Starts reading `n` segments (they may overlap); as spill_file_write_segments.
 * Every segment must lie within the file (else -ERANGE, nothing started).
 * Device segments are filled by copies that work queued on `stream` after
 * the request completes waits for. */
SPILL_API int spill_file_read_segments(spill_file* file, const spill_segment* segments, size_t n, uintptr_t stream,
                                       spill_request** out);

/* Waits for a request to finish and frees it (exactly once per request, from
 * any thread). Fills *stats when not NULL. Returns 0 or the request's -errno,
 * its message then in spill_last_error() of the waiting thread. */
SPILL_API int spill_request_wait(spill_request* request, spill_io_stats* stats);

/* Makes what completed requests wrote durable (fsync). */
SPILL_API int spill_file_sync(spill_file* file);

/* Sets the file's size (ftruncate through the file system). -EBUSY while a
 * request of the handle is in flight. */
SPILL_API int spill_file_truncate(spill_file* file, uint64_t size);

/* Closes the handle; -EBUSY (the handle stays open) while a request of it is
 * in flight. */
SPILL_API int spill_file_close(spill_file* file);

/* Checkpoint dedup. `hashes` holds 2 x n_units numbers (low, high 64 bits of
 * the XXH3-128 of each unit, as spill_hash_units gives them) for consecutive
 * 256 KiB units of the file from `file_offset` (a multiple of 256 KiB, else
 * -EINVAL). The daemon maps every unit whose bytes the volume already holds
 * into the file by reference (no byte moves; the file grows to cover them)
 * and needed[i] says whether unit i must still be written (1) or not (0).
 * The caller then writes only the needed units (and whatever lies outside
 * whole units): segments that leave the mapped units untouched.
 * Call it before writing that range, with no write of it in flight.
 * -EOPNOTSUPP off a spillfs mount or on a volume without dedup; -EACCES (or
 * -EPERM) where the control file may not be opened (it is root's): in each
 * case nothing was mapped, so write everything. */
SPILL_API int spill_file_dedup(spill_file* file, uint64_t file_offset, const uint64_t* hashes, size_t n_units,
                               uint8_t* needed);

/* Checkpoint dedup of units anywhere in the file, as spill_file_dedup: unit i
 * lies at file_offsets[i] (each a multiple of 256 KiB, strictly increasing:
 * else -EINVAL naming the unit, and nothing is mapped) with the hash
 * hashes[2i], hashes[2i + 1]. One request to the daemon (one flush, one index
 * batch) for up to 65536 units (16 GiB), so a whole checkpoint's storages
 * cost one round trip, not one each. needed[i] as spill_file_dedup's; same
 * errors. */
SPILL_API int spill_file_dedup_units(spill_file* file, const uint64_t* file_offsets, const uint64_t* hashes,
                                     size_t n_units, uint8_t* needed);

/* XXH3-128 of each whole 256 KiB unit of [ptr, ptr + length) into out
 * (2 numbers a unit: low, high 64 bits; length / 262144 units, a trailing
 * partial unit is not hashed), bit-identical to the daemon's dedup hash.
 * device -1: host memory, hashed on the CPU; else a CUDA device, hashed there
 * after the work queued on `stream` (-ENODEV without CUDA or that device).
 * Returns 0 or -errno. Any thread. */
SPILL_API int spill_hash_units(const void* ptr, uint64_t length, int32_t device, uintptr_t stream, uint64_t* out);

/* spill_hash_units of n buffers (ptrs[i], lengths[i]) of one device (-1:
 * host), their hashes one after another in out (buffer i's lengths[i] /
 * 262144 units right after buffer i-1's). On a CUDA device one
 * synchronisation of `stream` for all of them, where a call a buffer costs
 * one each (a checkpoint has hundreds of storages). Returns 0 or -errno. Any
 * thread. */
SPILL_API int spill_hash_units_many(const void* const* ptrs, const uint64_t* lengths, size_t n, int32_t device,
                                    uintptr_t stream, uint64_t* out);

/* The library's version ("0.1.0"); Python refuses a library of another. */
SPILL_API const char* spill_version(void);

/* Process-wide settings of segment files (later opens and requests use them):
 *   "pinned_bytes"  bound of the staging pool (256 MiB; one chunk at least)
 *   "chunk_bytes"   one staging buffer, a multiple of 256 KiB (8 MiB)
 *   "io_bytes"      one I/O, a multiple of 4096 (1 MiB)
 *   "queue_depth"   I/Os in flight per request (32)
 *   "commit_bytes"  direct path: bytes reserved and committed per step (256 MiB)
 *   "commit_depth"  direct path: steps reserved or committing at once (3; 1..8):
 *                   a step's commit (a sync of the data area) overlaps the
 *                   writes of the next depth-1 steps
 *   "direct_path"   use the direct path where possible (1; 0: through the mount)
 *   "o_direct"      use O_DIRECT where the file system takes it (1; 0: buffered)
 *   "verify"        direct path: verify block checksums on read (1)
 *   "unit_hashes"   direct path: hash the whole 256 KiB units written, so the
 *                   volume can share them with later writes (1)
 *   "device_hashes" direct path: a piece of a CUDA segment gets its block
 *                   checksums and unit hashes on its GPU, not on the CPU (1)
 *   "commit_bytes", "commit_depth" also size memory I/O's steps (a request to
 *                   the daemon each) and how many are in flight
 *   "hash_threads"  threads of spill_hash_units on the host (0: automatic)
 * Returns 0, or -EINVAL for an unknown key or a bad value. Any thread. */
SPILL_API int spill_config_set(const char* key, uint64_t value);

/* Batched random row reads from a segment file, for feature tables (the data
 * of a .npy, a raw row-major file): row i of `rows` is the `row_bytes` bytes
 * at data_offset + rows[i] * row_bytes, copied to out + i * row_bytes (host
 * memory, any alignment). Rows may repeat and come in any order; the 4 KiB
 * blocks they touch are read once, neighbouring blocks merged into I/Os of up
 * to 128 KiB, all in flight at once on the calling thread's io_uring. Any
 * backend: on the direct path by the file's layout with every block verified
 * (the layout kept by the handle's client, taken anew once on a checksum
 * mismatch); elsewhere O_DIRECT, or buffered where the file system refuses
 * it. Every row must lie within the file (else -ERANGE naming the first that
 * does not, and nothing is read). Fills *stats when not NULL (bytes: rows
 * asked; io_bytes, ios: what storage moved). Returns 0 or -errno. Any thread,
 * concurrently on one handle. */
SPILL_API int spill_file_read_rows(spill_file* file, uint64_t data_offset, uint64_t row_bytes, const int64_t* rows,
                                   size_t n, void* out, spill_io_stats* stats);

/* ---- GPU feature cache (spillfs.gnn.FeatureStore(device="cuda")) ----
 *
 * The mechanism of a GPU software cache of a feature table (rows grouped in
 * lines of rows_per_line rows); the policy (what to keep, evict, park) is the
 * caller's. Lines live in HBM; a hot-node buffer and a victim buffer in
 * pinned, GPU-mapped host memory; staging in pinned memory. A batch:
 * spill_gpu_cache_gather (a lane a row: an HBM line, else the hot buffer,
 * else an entry of the request ring), then, for the rows that missed,
 * spill_gpu_cache_misses (the ring), spill_gpu_cache_stamps (each slot's last
 * use) and spill_gpu_cache_fill per staging load (the caller put the lines
 * into staging: from the victim buffer, or read with spill_file_read_rows).
 * All work runs on `stream` (a cudaStream_t) and is done when the call
 * returns. -ENOTSUP in a build without CUDA, -ENODEV without the device. One
 * thread at a time per cache. */
typedef struct spill_gpu_cache spill_gpu_cache;

typedef struct spill_gpu_cache_shape {
  uint64_t row_bytes;
  uint64_t rows;
  uint64_t rows_per_line;
  uint64_t cache_lines;   /* HBM */
  uint64_t hot_lines;     /* pinned, mapped */
  uint64_t victim_lines;  /* pinned, mapped */
  uint64_t staging_lines; /* pinned; at least 1 */
} spill_gpu_cache_shape;

typedef struct spill_gpu_gather_counts {
  uint64_t gpu_hits; /* rows from HBM lines */
  uint64_t hot_hits; /* rows from the hot-node buffer */
  uint64_t misses;   /* rows posted to the request ring */
} spill_gpu_gather_counts;

/* One fill: evictions (line evicted_lines[k] leaves slot evicted_slots[k];
 * its bytes go to victim slot victim_slots[k] first where that is >= 0),
 * then the first n_staged lines of staging go to the GPU: ring entry k (row
 * entry_rows[k], in staged line entry_staged[k]) is copied to output row
 * entry_positions[k], and staged line k is installed into slot
 * install_slots[k] (-1: not kept). Arrays may be NULL where their count is 0
 * (victim_slots and install_slots: none). */
typedef struct spill_gpu_fill {
  size_t n_evicted;
  const int64_t* evicted_lines;
  const int64_t* evicted_slots;
  const int64_t* victim_slots;
  size_t n_staged;
  const int64_t* staged_lines;
  const int64_t* install_slots;
  size_t n_entries;
  const int64_t* entry_rows;
  const int64_t* entry_positions;
  const int64_t* entry_staged;
} spill_gpu_fill;

SPILL_API spill_gpu_cache* spill_gpu_cache_create(int32_t device, const spill_gpu_cache_shape* shape);
SPILL_API int spill_gpu_cache_destroy(spill_gpu_cache* cache);
/* which: 0 the hot buffer, 1 the victim buffer, 2 staging (host addresses). */
SPILL_API void* spill_gpu_cache_host_buffer(spill_gpu_cache* cache, int which);
/* Hot line lines[i] is held in slot i of the hot buffer (filled by the caller). */
SPILL_API int spill_gpu_cache_set_hot(spill_gpu_cache* cache, const int64_t* lines, size_t n);
/* out (device, n x row_bytes) gets the rows `index` (device int64, each in
 * [-rows, rows): negatives count from the end) that the GPU tiers hold; the
 * others are posted to the ring (as rows in [0, rows)). An index out of range:
 * -ERANGE naming it and its position, and nothing gathered, counted or
 * stamped. */
SPILL_API int spill_gpu_cache_gather(spill_gpu_cache* cache, const int64_t* index, size_t n, void* out, uint32_t stamp,
                                     uintptr_t stream, spill_gpu_gather_counts* counts);
SPILL_API int spill_gpu_cache_misses(spill_gpu_cache* cache, int64_t* rows, int64_t* positions, size_t n);
SPILL_API int spill_gpu_cache_stamps(spill_gpu_cache* cache, uint32_t* out);
SPILL_API int spill_gpu_cache_fill(spill_gpu_cache* cache, const spill_gpu_fill* fill, void* out, uint32_t stamp,
                                   uintptr_t stream);

#ifdef __cplusplus
}
#endif

#endif /* SPILLFS_CLIENT_H_ */
