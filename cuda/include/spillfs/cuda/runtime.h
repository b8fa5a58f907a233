// Is CUDA usable in this process, and where does a pointer live?
//
// spillfs_cuda links the CUDA runtime statically, so a library built with it
// loads on a machine with no CUDA libraries, no driver and no GPU; there
// these answer "no device" instead of the load failing. Built without CUDA
// (SPILLFS_HAVE_CUDA unset) they always do.
//
// Threading: all functions are thread-safe. The device count is asked once
// (the first call) and kept: CUDA_VISIBLE_DEVICES and the driver do not change
// under a running process.
#pragma once

namespace spillfs::cuda {

// Number of CUDA devices this process can use; 0 without a driver, without a
// device or in a build without CUDA. Initialises the driver, but creates no
// context (no GPU memory is taken).
int DeviceCount();

// True when at least one CUDA device is usable.
bool Available();

// The CUDA device that holds `ptr` (device or managed memory), or -1 for host
// memory (pinned or not), null, unknown pointers and when CUDA is not
// available. May create the CUDA context of the current device on first use.
int PointerDevice(const void* ptr);

}  // namespace spillfs::cuda
