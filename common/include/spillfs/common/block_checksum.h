// The two content hashes of the on-disk format, defined once for the daemon,
// fsck and the client library (which must agree bit for bit):
//  - BlockChecksum: the per-block checksum kept in extent records (the low
//    32 bits of XXH3-64 of one block), verified on every read from the SSD;
//  - ContentHash128: the dedup key of a whole dedup unit (XXH3-128).
// Header-only (xxhash is the only dependency) so the self-contained client
// library can use it too.
//
// On x86 the calls go through libxxhash's runtime-dispatched entry points, which
// pick AVX-512, AVX2 or SSE2 as the CPU offers; the values are the same as the
// portable build's, and faster: block verification was the read-ahead
// threads' largest cost once their memset was gone (75af92f; docs/results.md,
// "Read path").
#pragma once

#include <xxhash.h>
#if defined(__x86_64__) || defined(__i386__)
// After xxhash.h: maps XXH3_64bits / XXH3_128bits to the dispatched versions
// (x86 builds of libxxhash only; elsewhere the portable entry points stay).
#include <xxh_x86dispatch.h>
#endif

#include <cstddef>
#include <cstdint>

namespace spillfs {

inline uint32_t BlockChecksum(const void* block, size_t block_size) {
  return static_cast<uint32_t>(XXH3_64bits(block, block_size));
}

inline XXH128_hash_t ContentHash128(const void* data, size_t length) { return XXH3_128bits(data, length); }

}  // namespace spillfs
