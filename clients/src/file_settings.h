// The process-wide settings of segment files (spill_config_set) and the
// staging memory they share: one pool of pinned (page-locked, where CUDA is
// there; else 4 KiB-aligned) host buffers of one chunk each, made at first use.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "spillfs/cuda/pinned_pool.h"

namespace spillfs::client {

struct FileSettings {
  std::atomic<uint64_t> pinned_bytes{256ull << 20};  // bound of the staging pool
  std::atomic<uint64_t> chunk_bytes{8ull << 20};     // one staging buffer; multiple of 256 KiB
  std::atomic<uint64_t> io_bytes{1ull << 20};        // one I/O
  std::atomic<unsigned> queue_depth{32};             // I/Os in flight per request
  std::atomic<uint64_t> commit_bytes{256ull << 20};  // direct path: bytes per reserve/commit step
  std::atomic<unsigned> commit_depth{3};             // direct path: steps reserved or committing at once
  std::atomic<bool> direct_path{true};               // use the direct path where the store opens
  std::atomic<bool> o_direct{true};                  // O_DIRECT where the file system takes it
  std::atomic<bool> verify{true};                    // direct path: verify block checksums on read
  std::atomic<bool> unit_hashes{true};               // direct path: hash whole units at commit (blobs)
  std::atomic<bool> device_hashes{true};             // direct path: hash CUDA segments on their GPU
  std::atomic<unsigned> hash_threads{0};             // spill_hash_units on the host (0: automatic)
};

FileSettings& Settings();

// Sets one of the above; 0 or -errno (message set).
int SetSetting(const std::string& key, uint64_t value);

// The staging pool (made, or made anew after its settings changed, at first
// use) and the size of its buffers (*chunk_bytes); `shareable`: the pool
// whose buffers lie in a memfd (memory I/O). 0 or -errno (message set).
int StagingPool(bool shareable, std::shared_ptr<spillfs::cuda::PinnedPool>* out, uint64_t* chunk_bytes);

}  // namespace spillfs::client
