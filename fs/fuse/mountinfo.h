// Internal to the daemon (not installed): what /proc/self/mountinfo says of
// a mount point, read without touching the mount (which, before FUSE's INIT
// is answered, would wait).
#pragma once

#include <optional>
#include <string>

namespace spillfs {

// The "major:minor" of the filesystem mounted at `mountpoint` (for FUSE, the
// name of its bdi under /sys/class/bdi; the minor is its connection's number
// under /sys/fs/fuse/connections); nullopt if nothing is mounted there.
std::optional<std::string> MountDevice(const std::string& mountpoint);

}  // namespace spillfs
