/* spillfs client library: the direct data path.
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

#ifdef __cplusplus
}
#endif

#endif /* SPILLFS_CLIENT_H_ */
