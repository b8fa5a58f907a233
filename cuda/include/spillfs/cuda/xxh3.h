// XXH3-64 and XXH3-128 (seed 0, the default 192-byte secret) written once for
// the CPU and the GPU: the functions are __host__ __device__ under nvcc and
// plain inline C++ elsewhere, so CI checks on the CPU the very code the
// kernels run. The values are bit-identical to libxxhash's XXH3_64bits and
// XXH3_128bits for every length (the on-disk block checksum and the dedup key
// of common/block_checksum.h are these).
//
// Written from the XXH3 algorithm (xxhash 0.8's format, stable since 0.8.0):
//  - 0..16 bytes, 17..128 and 129..240 have their own short paths;
//  - longer inputs run 8 64-bit accumulator lanes over 64-byte stripes, 16
//    stripes to a 1 KiB block, each block ending in a scramble of the lanes;
//    the last partial block and a last stripe (the input's final 64 bytes,
//    with its own key) close the loop, and the lanes are merged into the hash.
// The long loop's pieces (AccumulateLane, ScrambleLane, FinishLong*) are
// exposed in xxh3::, so a kernel can split the 8 lanes over threads: lane i
// takes its own input word, keyed, and its neighbour i^1's word unkeyed; no
// other lane interacts until the merge.
//
// Not a general xxhash: no seed, no custom secret, no streaming state. The
// inputs are read bytewise where unaligned (memcpy), which costs the GPU
// nothing where a kernel feeds the long-loop pieces itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define SPILLFS_HD __host__ __device__
#else
#define SPILLFS_HD
#endif

#if !defined(__CUDA_ARCH__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "spillfs/cuda/xxh3.h assumes a little-endian host"
#endif

namespace spillfs::cuda {

// A 128-bit hash as libxxhash's XXH128_hash_t lays it out.
struct Hash128 {
  uint64_t low64;
  uint64_t high64;
  SPILLFS_HD friend bool operator==(const Hash128& a, const Hash128& b) {
    return a.low64 == b.low64 && a.high64 == b.high64;
  }
  SPILLFS_HD friend bool operator!=(const Hash128& a, const Hash128& b) { return !(a == b); }
};

namespace xxh3 {

inline constexpr uint64_t kPrime32_1 = 0x9E3779B1U;
inline constexpr uint64_t kPrime32_2 = 0x85EBCA77U;
inline constexpr uint64_t kPrime32_3 = 0xC2B2AE3DU;
inline constexpr uint64_t kPrime64_1 = 0x9E3779B185EBCA87ULL;
inline constexpr uint64_t kPrime64_2 = 0xC2B2AE3D27D4EB4FULL;
inline constexpr uint64_t kPrime64_3 = 0x165667B19E3779F9ULL;
inline constexpr uint64_t kPrime64_4 = 0x85EBCA77C2B2AE63ULL;
inline constexpr uint64_t kPrime64_5 = 0x27D4EB2F165667C5ULL;
inline constexpr uint64_t kPrimeMx1 = 0x165667919E3779F9ULL;
inline constexpr uint64_t kPrimeMx2 = 0x9FB21C651E98DF25ULL;

inline constexpr size_t kSecretBytes = 192;
inline constexpr size_t kStripeBytes = 64;      // one step of the 8 lanes
inline constexpr size_t kStripesPerBlock = 16;  // (kSecretBytes - kStripeBytes) / 8
inline constexpr size_t kBlockBytes = kStripeBytes * kStripesPerBlock;
inline constexpr size_t kMidSizeMax = 240;  // longer inputs take the long loop
// Key offsets into the secret (bytes). Stripe s of a block is keyed at 8 * s.
inline constexpr size_t kScrambleKey = kSecretBytes - kStripeBytes;  // 128
inline constexpr size_t kLastStripeKey = kScrambleKey - 7;           // 121
inline constexpr size_t kMergeLowKey = 11;
inline constexpr size_t kMergeHighKey = kSecretBytes - 64 - 11;  // 117

// The default secret (xxhash's kSecret), the one constant table of XXH3.
#define SPILLFS_XXH3_SECRET_BYTES                                                                                   \
  0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c, 0xde, 0xd4, 0x6d, \
      0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f, 0xcb, 0x79, 0xe6, 0x4e, 0xcc,   \
      0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21, 0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24,   \
      0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c, 0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88,   \
      0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3, 0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef,   \
      0x46, 0xa9, 0xde, 0xac, 0xd8, 0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7,   \
      0x0b, 0x4f, 0x1d, 0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73,   \
      0x64, 0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb, 0x17,   \
      0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e, 0x2b, 0x16, 0xbe,   \
      0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce, 0x45, 0xcb, 0x3a, 0x8f, 0x95,   \
      0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e

alignas(64) inline constexpr uint8_t kHostSecret[kSecretBytes] = {SPILLFS_XXH3_SECRET_BYTES};
#if defined(__CUDACC__)
// One copy per translation unit: constant memory is not shared across
// translation units without relocatable device code.
alignas(64) static __constant__ uint8_t kDeviceSecret[kSecretBytes] = {SPILLFS_XXH3_SECRET_BYTES};
#endif

SPILLFS_HD inline const uint8_t* Secret() {
#if defined(__CUDA_ARCH__)
  return kDeviceSecret;
#else
  return kHostSecret;
#endif
}

SPILLFS_HD inline uint64_t Read64(const uint8_t* p) {
  uint64_t v;
  memcpy(&v, p, sizeof(v));
  return v;
}
SPILLFS_HD inline uint32_t Read32(const uint8_t* p) {
  uint32_t v;
  memcpy(&v, p, sizeof(v));
  return v;
}
SPILLFS_HD inline uint32_t Swap32(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, 0, 0x0123);
#else
  return __builtin_bswap32(x);
#endif
}
SPILLFS_HD inline uint64_t Swap64(uint64_t x) {
  return (uint64_t{Swap32(static_cast<uint32_t>(x))} << 32) | Swap32(static_cast<uint32_t>(x >> 32));
}
SPILLFS_HD inline uint32_t Rotl32(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }
SPILLFS_HD inline uint64_t Rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// The full 128-bit product of two 64-bit words.
SPILLFS_HD inline Hash128 Mul64To128(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return Hash128{a * b, __umul64hi(a, b)};
#else
  const unsigned __int128 p = static_cast<unsigned __int128>(a) * b;
  return Hash128{static_cast<uint64_t>(p), static_cast<uint64_t>(p >> 64)};
#endif
}
SPILLFS_HD inline uint64_t Mul128Fold64(uint64_t a, uint64_t b) {
  const Hash128 p = Mul64To128(a, b);
  return p.low64 ^ p.high64;
}

SPILLFS_HD inline uint64_t Avalanche(uint64_t h) {
  h ^= h >> 37;
  h *= kPrimeMx1;
  return h ^ (h >> 32);
}
// XXH64's final mix, used by the shortest inputs.
SPILLFS_HD inline uint64_t Avalanche64(uint64_t h) {
  h ^= h >> 33;
  h *= kPrime64_2;
  h ^= h >> 29;
  h *= kPrime64_3;
  return h ^ (h >> 32);
}
SPILLFS_HD inline uint64_t Rrmxmx(uint64_t h, uint64_t len) {
  h ^= Rotl64(h, 49) ^ Rotl64(h, 24);
  h *= kPrimeMx2;
  h ^= (h >> 35) + len;
  h *= kPrimeMx2;
  return h ^ (h >> 28);
}

// 16 input bytes against 16 key bytes.
SPILLFS_HD inline uint64_t Mix16(const uint8_t* in, const uint8_t* key) {
  return Mul128Fold64(Read64(in) ^ Read64(key), Read64(in + 8) ^ Read64(key + 8));
}
// The 128-bit variant's step: two 16-byte pieces into both halves.
SPILLFS_HD inline void Mix32(Hash128& acc, const uint8_t* in1, const uint8_t* in2, const uint8_t* key) {
  acc.low64 += Mix16(in1, key);
  acc.low64 ^= Read64(in2) + Read64(in2 + 8);
  acc.high64 += Mix16(in2, key + 16);
  acc.high64 ^= Read64(in1) + Read64(in1 + 8);
}

// ---- The long loop (more than 240 bytes), lane by lane.

// Lane i's initial value.
SPILLFS_HD inline uint64_t InitialLane(int i) {
  switch (i) {
    case 0:
      return kPrime32_3;
    case 1:
      return kPrime64_1;
    case 2:
      return kPrime64_2;
    case 3:
      return kPrime64_3;
    case 4:
      return kPrime64_4;
    case 5:
      return kPrime32_2;
    case 6:
      return kPrime64_5;
    default:
      return kPrime32_1;
  }
}
// One stripe's step for lane i: `value` is the stripe's word i, `neighbour`
// its word i^1, `key` the key's word i.
SPILLFS_HD inline void AccumulateLane(uint64_t& acc, uint64_t value, uint64_t neighbour, uint64_t key) {
  const uint64_t keyed = value ^ key;
  acc += neighbour + uint64_t{static_cast<uint32_t>(keyed)} * static_cast<uint32_t>(keyed >> 32);
}
// The end of a full block, for one lane (key: the secret's word at
// kScrambleKey + 8 * i).
SPILLFS_HD inline uint64_t ScrambleLane(uint64_t acc, uint64_t key) {
  acc ^= acc >> 47;
  acc ^= key;
  return acc * kPrime32_1;
}
// One 64-byte stripe into all 8 lanes.
SPILLFS_HD inline void AccumulateStripe(uint64_t acc[8], const uint8_t* in, const uint8_t* key) {
  uint64_t v[8];
  for (int i = 0; i < 8; ++i) v[i] = Read64(in + 8 * i);
  for (int i = 0; i < 8; ++i) AccumulateLane(acc[i], v[i], v[i ^ 1], Read64(key + 8 * i));
}
SPILLFS_HD inline uint64_t MergeLanes(const uint64_t acc[8], const uint8_t* key, uint64_t start) {
  uint64_t h = start;
  for (int i = 0; i < 4; ++i)
    h += Mul128Fold64(acc[2 * i] ^ Read64(key + 16 * i), acc[2 * i + 1] ^ Read64(key + 16 * i + 8));
  return Avalanche(h);
}
// The hash of a long input of `len` bytes from its final lanes.
SPILLFS_HD inline uint64_t FinishLong64(const uint64_t acc[8], uint64_t len) {
  return MergeLanes(acc, Secret() + kMergeLowKey, len * kPrime64_1);
}
SPILLFS_HD inline Hash128 FinishLong128(const uint64_t acc[8], uint64_t len) {
  return Hash128{MergeLanes(acc, Secret() + kMergeLowKey, len * kPrime64_1),
                 MergeLanes(acc, Secret() + kMergeHighKey, ~(len * kPrime64_2))};
}
// All of the long loop over `len` (> 240) bytes, one thread.
SPILLFS_HD inline void LongLanes(const uint8_t* in, size_t len, uint64_t acc[8]) {
  const uint8_t* secret = Secret();
  for (int i = 0; i < 8; ++i) acc[i] = InitialLane(i);
  const size_t full_blocks = (len - 1) / kBlockBytes;
  for (size_t b = 0; b < full_blocks; ++b) {
    for (size_t s = 0; s < kStripesPerBlock; ++s)
      AccumulateStripe(acc, in + b * kBlockBytes + s * kStripeBytes, secret + 8 * s);
    for (int i = 0; i < 8; ++i) acc[i] = ScrambleLane(acc[i], Read64(secret + kScrambleKey + 8 * i));
  }
  // The stripes of the last block before its last one: the final stripe is
  // always the input's last 64 bytes, keyed apart, with no scramble after.
  const size_t stripes = ((len - 1) - full_blocks * kBlockBytes) / kStripeBytes;
  for (size_t s = 0; s < stripes; ++s)
    AccumulateStripe(acc, in + full_blocks * kBlockBytes + s * kStripeBytes, secret + 8 * s);
  AccumulateStripe(acc, in + len - kStripeBytes, secret + kLastStripeKey);
}

// ---- Short inputs.

SPILLFS_HD inline uint64_t Hash64Short(const uint8_t* in, size_t len) {
  const uint8_t* secret = Secret();
  if (len > 8) {
    const uint64_t lo = Read64(in) ^ (Read64(secret + 24) ^ Read64(secret + 32));
    const uint64_t hi = Read64(in + len - 8) ^ (Read64(secret + 40) ^ Read64(secret + 48));
    return Avalanche(len + Swap64(lo) + hi + Mul128Fold64(lo, hi));
  }
  if (len >= 4) {
    const uint64_t word = Read32(in + len - 4) + (uint64_t{Read32(in)} << 32);
    return Rrmxmx(word ^ (Read64(secret + 8) ^ Read64(secret + 16)), len);
  }
  if (len > 0) {
    const uint32_t combined =
        (uint32_t{in[0]} << 16) | (uint32_t{in[len >> 1]} << 24) | in[len - 1] | (static_cast<uint32_t>(len) << 8);
    return Avalanche64(combined ^ uint64_t{Read32(secret) ^ Read32(secret + 4)});
  }
  return Avalanche64(Read64(secret + 56) ^ Read64(secret + 64));
}

SPILLFS_HD inline Hash128 Hash128Short(const uint8_t* in, size_t len) {
  const uint8_t* secret = Secret();
  if (len > 8) {
    const uint64_t lo = Read64(in);
    uint64_t hi = Read64(in + len - 8);
    Hash128 m = Mul64To128(lo ^ hi ^ (Read64(secret + 32) ^ Read64(secret + 40)), kPrime64_1);
    m.low64 += uint64_t{len - 1} << 54;
    hi ^= Read64(secret + 48) ^ Read64(secret + 56);
    m.high64 += hi + uint64_t{static_cast<uint32_t>(hi)} * (kPrime32_2 - 1);
    m.low64 ^= Swap64(m.high64);
    Hash128 h = Mul64To128(m.low64, kPrime64_2);
    h.high64 += m.high64 * kPrime64_2;
    return Hash128{Avalanche(h.low64), Avalanche(h.high64)};
  }
  if (len >= 4) {
    const uint64_t word = Read32(in) + (uint64_t{Read32(in + len - 4)} << 32);
    Hash128 m = Mul64To128(word ^ (Read64(secret + 16) ^ Read64(secret + 24)), kPrime64_1 + (len << 2));
    m.high64 += m.low64 << 1;
    m.low64 ^= m.high64 >> 3;
    m.low64 ^= m.low64 >> 35;
    m.low64 *= kPrimeMx2;
    m.low64 ^= m.low64 >> 28;
    return Hash128{m.low64, Avalanche(m.high64)};
  }
  if (len > 0) {
    const uint32_t lo =
        (uint32_t{in[0]} << 16) | (uint32_t{in[len >> 1]} << 24) | in[len - 1] | (static_cast<uint32_t>(len) << 8);
    const uint32_t hi = Rotl32(Swap32(lo), 13);
    return Hash128{Avalanche64(lo ^ uint64_t{Read32(secret) ^ Read32(secret + 4)}),
                   Avalanche64(hi ^ uint64_t{Read32(secret + 8) ^ Read32(secret + 12)})};
  }
  return Hash128{Avalanche64(Read64(secret + 64) ^ Read64(secret + 72)),
                 Avalanche64(Read64(secret + 80) ^ Read64(secret + 88))};
}

// 17..128 bytes: pairs of 16-byte pieces from both ends, outermost last.
SPILLFS_HD inline uint64_t Hash64Upto128(const uint8_t* in, size_t len) {
  const uint8_t* secret = Secret();
  uint64_t acc = len * kPrime64_1;
  for (int i = static_cast<int>((len - 1) / 32); i >= 0; --i) {
    acc += Mix16(in + 16 * i, secret + 32 * i);
    acc += Mix16(in + len - 16 * (i + 1), secret + 32 * i + 16);
  }
  return Avalanche(acc);
}
SPILLFS_HD inline Hash128 Hash128Finish(const Hash128& acc, size_t len) {
  const uint64_t low = acc.low64 + acc.high64;
  const uint64_t high = acc.low64 * kPrime64_1 + acc.high64 * kPrime64_4 + uint64_t{len} * kPrime64_2;
  return Hash128{Avalanche(low), 0 - Avalanche(high)};
}
SPILLFS_HD inline Hash128 Hash128Upto128(const uint8_t* in, size_t len) {
  const uint8_t* secret = Secret();
  Hash128 acc{len * kPrime64_1, 0};
  for (int i = static_cast<int>((len - 1) / 32); i >= 0; --i)
    Mix32(acc, in + 16 * i, in + len - 16 * (i + 1), secret + 32 * i);
  return Hash128Finish(acc, len);
}

// 129..240 bytes: 16-byte (32 for 128 bits) rounds, the first 8 (4) keyed
// from the secret's start, an avalanche, the rest keyed from offset 3, and the
// last 16 (32) bytes keyed at 119 (103).
inline constexpr size_t kMidStartKey = 3;
inline constexpr size_t kMidLastKey = 136 - 17;
SPILLFS_HD inline uint64_t Hash64Upto240(const uint8_t* in, size_t len) {
  const uint8_t* secret = Secret();
  const int rounds = static_cast<int>(len / 16);
  uint64_t acc = len * kPrime64_1;
  for (int i = 0; i < 8; ++i) acc += Mix16(in + 16 * i, secret + 16 * i);
  acc = Avalanche(acc);
  for (int i = 8; i < rounds; ++i) acc += Mix16(in + 16 * i, secret + 16 * (i - 8) + kMidStartKey);
  acc += Mix16(in + len - 16, secret + kMidLastKey);
  return Avalanche(acc);
}
SPILLFS_HD inline Hash128 Hash128Upto240(const uint8_t* in, size_t len) {
  const uint8_t* secret = Secret();
  const int rounds = static_cast<int>(len / 32);
  Hash128 acc{len * kPrime64_1, 0};
  for (int i = 0; i < 4; ++i) Mix32(acc, in + 32 * i, in + 32 * i + 16, secret + 32 * i);
  acc = Hash128{Avalanche(acc.low64), Avalanche(acc.high64)};
  for (int i = 4; i < rounds; ++i) Mix32(acc, in + 32 * i, in + 32 * i + 16, secret + kMidStartKey + 32 * (i - 4));
  Mix32(acc, in + len - 16, in + len - 32, secret + kMidLastKey - 16);
  return Hash128Finish(acc, len);
}

}  // namespace xxh3

// XXH3_64bits(data, len): any length; `data` may be null when len is 0.
SPILLFS_HD inline uint64_t Xxh3Hash64(const void* data, size_t len) {
  const uint8_t* in = static_cast<const uint8_t*>(data);
  if (len <= 16) return xxh3::Hash64Short(in, len);
  if (len <= 128) return xxh3::Hash64Upto128(in, len);
  if (len <= xxh3::kMidSizeMax) return xxh3::Hash64Upto240(in, len);
  uint64_t acc[8];
  xxh3::LongLanes(in, len, acc);
  return xxh3::FinishLong64(acc, len);
}

// XXH3_128bits(data, len): any length; `data` may be null when len is 0.
SPILLFS_HD inline Hash128 Xxh3Hash128(const void* data, size_t len) {
  const uint8_t* in = static_cast<const uint8_t*>(data);
  if (len <= 16) return xxh3::Hash128Short(in, len);
  if (len <= 128) return xxh3::Hash128Upto128(in, len);
  if (len <= xxh3::kMidSizeMax) return xxh3::Hash128Upto240(in, len);
  uint64_t acc[8];
  xxh3::LongLanes(in, len, acc);
  return xxh3::FinishLong128(acc, len);
}

}  // namespace spillfs::cuda
