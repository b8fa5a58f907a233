// The host versions of hash_kernels.h: the xxh3.h code on the calling thread.
#include "spillfs/cuda/hash_kernels.h"

namespace spillfs::cuda {

Status UnitHashesHost(const void* data, size_t length, size_t unit_bytes, Hash128* out) {
  if (unit_bytes == 0) return Status::Invalid("unit_bytes is 0");
  const auto* in = static_cast<const uint8_t*>(data);
  const size_t units = length / unit_bytes;
  for (size_t u = 0; u < units; ++u) out[u] = Xxh3Hash128(in + u * unit_bytes, unit_bytes);
  return Status::OK();
}

Status BlockChecksumsHost(const void* data, size_t length, size_t block_bytes, uint32_t* out) {
  if (block_bytes == 0) return Status::Invalid("block_bytes is 0");
  const auto* in = static_cast<const uint8_t*>(data);
  for (size_t b = 0, offset = 0; offset < length; ++b, offset += block_bytes) {
    const size_t n = length - offset < block_bytes ? length - offset : block_bytes;
    out[b] = static_cast<uint32_t>(Xxh3Hash64(in + offset, n));
  }
  return Status::OK();
}

#if !SPILLFS_HAVE_CUDA
Status UnitHashes(const void*, size_t, size_t, Hash128*, uintptr_t) {
  return Status::Error(ENOTSUP, "spillfs_cuda was built without CUDA");
}
Status UnitHashesOfSpans(const DeviceSpan*, size_t, size_t, Hash128*, uintptr_t) {
  return Status::Error(ENOTSUP, "spillfs_cuda was built without CUDA");
}
Status BlockChecksums(const void*, size_t, size_t, uint32_t*, uintptr_t) {
  return Status::Error(ENOTSUP, "spillfs_cuda was built without CUDA");
}
#endif

}  // namespace spillfs::cuda
