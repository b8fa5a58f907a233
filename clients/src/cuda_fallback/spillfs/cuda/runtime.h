// Stand-in (see README): no CUDA.
#pragma once

namespace spillfs::cuda {
inline bool Available() { return false; }
inline int PointerDevice(const void*) { return -1; }
inline int DeviceCount() { return 0; }
}  // namespace spillfs::cuda
