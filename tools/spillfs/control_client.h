// The client side of a mount's control interface, MOUNTPOINT/.spillfs/control:
// open it O_RDWR, pwrite one JSON request at offset 0, then pread the JSON
// reply from offset 0 until a short read. The reply is
// {"ok":true,"result":...} or {"ok":false,"errno":N,"error":"message"}.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "spillfs/common/status.h"

namespace spillfs::cli {

inline constexpr const char* kControlDir = ".spillfs";
inline constexpr const char* kControlFile = "control";
inline constexpr const char* kStatsFile = "stats";

// MOUNTPOINT/.spillfs/control
std::string ControlPath(const std::string& mountpoint);

// Sends `request` to the mount at `mountpoint` and returns the reply's
// "result". An error reply becomes a Status with the reply's errno and
// message; a missing control file, an I/O error or a malformed reply become
// errors that say so.
Result<nlohmann::json> ControlRequest(const std::string& mountpoint, const nlohmann::json& request);

}  // namespace spillfs::cli
