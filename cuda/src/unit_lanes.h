// Internal to spillfs_cuda and its tests: one thread's share of a long unit's
// XXH3 loop, as the hash kernels run it, written __host__ __device__ so that
// CI runs the kernels' very indexing (columns, chunks, keys, the last block)
// on the CPU against libxxhash.
//
// A unit (> 240 bytes, a multiple of the 64-byte stripe) is split over
// 8 / kLanes threads; the thread owning lanes [lane0, lane0 + kLanes) reads
// its column of every stripe (kLanes words at byte 8 * lane0), a chunk of
// stripes ahead of use, into two alternating register buffers. Lane i also
// needs its neighbour i^1's word: a pair owned by one thread has both; a
// one-lane thread gets it by warp shuffle on the GPU (every thread of the
// warp must call in step), and reads it from memory on the CPU.
#pragma once

#include <cstddef>
#include <cstdint>

#include "spillfs/cuda/xxh3.h"

// Loops over registers must unroll (a run-time index would move the array to
// local memory). nvcc's host pass takes neither pragma quietly; its host code
// of these functions is never called.
#if defined(__CUDA_ARCH__)
#define SPILLFS_UNROLL _Pragma("unroll")
#elif defined(__CUDACC__)
#define SPILLFS_UNROLL
#else
#define SPILLFS_UNROLL _Pragma("GCC unroll 16")
#endif

namespace spillfs::cuda::internal {

inline constexpr int kSecretWords = xxh3::kSecretBytes / 8;

// The thread's kLanes words of one stripe; `p` points at the first.
template <int kLanes>
SPILLFS_HD inline void LoadColumn(const uint8_t* p, uint64_t (&v)[kLanes]) {
#if defined(__CUDA_ARCH__)
  // Streaming loads (__ldcs): every byte is read once; the caller's data in
  // L2 is worth more than ours.
  if constexpr (kLanes == 1) {
    v[0] = __ldcs(reinterpret_cast<const unsigned long long*>(p));
  } else {
    SPILLFS_UNROLL
    for (int i = 0; i < kLanes; i += 2) {
      const ulonglong2 w = __ldcs(reinterpret_cast<const ulonglong2*>(p + 8 * i));
      v[i] = w.x;
      v[i + 1] = w.y;
    }
  }
#else
  for (int i = 0; i < kLanes; ++i) v[i] = xxh3::Read64(p + 8 * i);
#endif
}

// One stripe into the thread's lanes: v its column, key[l] lane l's key
// word, column the column's address (the CPU's way to a lone lane's
// neighbour), odd whether lane0 is odd.
template <int kLanes>
SPILLFS_HD inline void MixStripe(uint64_t (&acc)[kLanes], const uint64_t (&v)[kLanes], const uint64_t* key,
                                 const uint8_t* column, bool odd) {
  if constexpr (kLanes == 1) {
#if defined(__CUDA_ARCH__)
    (void)column;
    (void)odd;
    const uint64_t neighbour = __shfl_xor_sync(0xffffffffu, static_cast<unsigned long long>(v[0]), 1);
#else
    const uint64_t neighbour = xxh3::Read64(odd ? column - 8 : column + 8);
#endif
    xxh3::AccumulateLane(acc[0], v[0], neighbour, key[0]);
  } else {
    (void)column;
    (void)odd;
    SPILLFS_UNROLL
    for (int l = 0; l < kLanes; ++l) xxh3::AccumulateLane(acc[l], v[l], v[l ^ 1], key[l]);
  }
}

// The whole loop of one unit for lanes [lane0, lane0 + kLanes): `unit` is the
// unit's first byte (16-byte aligned for kLanes >= 2, 8 for 1), unit_bytes
// > 240 and a multiple of 64, `words` the secret as little-endian words. On
// return acc holds the lanes, ready for xxh3::FinishLong64/128.
template <int kLanes>
SPILLFS_HD inline void UnitColumnLanes(const uint8_t* unit, size_t unit_bytes, int lane0, const uint64_t* words,
                                       uint64_t (&acc)[kLanes]) {
  namespace x = xxh3;
  // Stripes loaded at a time: 32 registers of data a buffer at most, two
  // buffers (the chunk being mixed and the next), an even number of chunks a
  // block so the buffers alternate alike in every block.
  constexpr int kChunk = kLanes >= 8 ? 2 : kLanes == 4 ? 4 : 8;
  constexpr int kChunks = static_cast<int>(x::kStripesPerBlock) / kChunk;
  static_assert(kChunks % 2 == 0, "the buffers must alternate alike in every block");
  constexpr int kKeys = static_cast<int>(x::kStripesPerBlock) + kLanes - 1;

  // Stripe s of a block keys lane i with the secret's word s + i.
  uint64_t key[kKeys];
  SPILLFS_UNROLL
  for (int w = 0; w < kKeys; ++w) key[w] = words[lane0 + w];
  SPILLFS_UNROLL
  for (int l = 0; l < kLanes; ++l) acc[l] = x::InitialLane(lane0 + l);

  const bool odd = (lane0 & 1) != 0;
  const uint8_t* in = unit + 8 * lane0;
  const size_t stripes = unit_bytes / x::kStripeBytes;
  const size_t full_blocks = (unit_bytes - 1) / x::kBlockBytes;
  // Stripes of the last block, its last one keyed apart: 1..16.
  const int last_stripes = static_cast<int>(stripes - full_blocks * x::kStripesPerBlock);

  uint64_t buf[2][kChunk][kLanes] = {};  // stripes past the unit stay unread
  // Chunk `chunk` of block `block`; stripes past the unit are not read.
  auto load = [&](uint64_t(&dst)[kChunk][kLanes], size_t block, int chunk) {
    const size_t first = block * x::kStripesPerBlock + chunk * kChunk;
    SPILLFS_UNROLL
    for (int s = 0; s < kChunk; ++s)
      if (first + s < stripes) LoadColumn<kLanes>(in + (first + s) * x::kStripeBytes, dst[s]);
  };
  auto column = [&](size_t block, int stripe) { return in + (block * x::kStripesPerBlock + stripe) * x::kStripeBytes; };

  load(buf[0], 0, 0);
  for (size_t b = 0; b < full_blocks; ++b) {
    SPILLFS_UNROLL
    for (int c = 0; c < kChunks; ++c) {
      if (c + 1 < kChunks) {
        load(buf[(c + 1) & 1], b, c + 1);
      } else {
        load(buf[0], b + 1, 0);
      }
      SPILLFS_UNROLL
      for (int s = 0; s < kChunk; ++s)
        MixStripe<kLanes>(acc, buf[c & 1][s], key + c * kChunk + s, column(b, c * kChunk + s), odd);
    }
    SPILLFS_UNROLL
    for (int l = 0; l < kLanes; ++l) acc[l] = x::ScrambleLane(acc[l], words[x::kScrambleKey / 8 + lane0 + l]);
  }

  // The last block (its first chunk is loaded): no scramble, and its last
  // stripe keyed at byte 121 of the secret, a word straddling two of `words`.
  static_assert(x::kLastStripeKey % 8 == 1, "the last stripe's key starts one byte into a word");
  uint64_t last_key[kLanes];
  SPILLFS_UNROLL
  for (int l = 0; l < kLanes; ++l) {
    const int w = static_cast<int>(x::kLastStripeKey / 8) + lane0 + l;
    last_key[l] = (words[w] >> 8) | (words[w + 1] << 56);
  }
  SPILLFS_UNROLL
  for (int c = 0; c < kChunks; ++c) {
    if (c * kChunk >= last_stripes) break;
    if (c + 1 < kChunks) load(buf[(c + 1) & 1], full_blocks, c + 1);
    SPILLFS_UNROLL
    for (int s = 0; s < kChunk; ++s) {
      const int stripe = c * kChunk + s;
      if (stripe < last_stripes - 1) {
        MixStripe<kLanes>(acc, buf[c & 1][s], key + stripe, column(full_blocks, stripe), odd);
      } else if (stripe == last_stripes - 1) {
        MixStripe<kLanes>(acc, buf[c & 1][s], last_key, column(full_blocks, stripe), odd);
      }
    }
  }
}

}  // namespace spillfs::cuda::internal
