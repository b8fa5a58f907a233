// Eventually: polls a condition until it holds or a timeout passes. For tests
// of work that happens after the call that caused it has returned: the
// write-behind flusher, the background index sync, FUSE's RELEASE of a closed file.
#pragma once

#include <chrono>
#include <functional>

namespace spillfs::testing {

// True as soon as `cond` holds; false if it still does not after `timeout`.
bool Eventually(const std::function<bool()>& cond, std::chrono::milliseconds timeout = std::chrono::seconds(10),
                std::chrono::milliseconds poll = std::chrono::milliseconds(5));

}  // namespace spillfs::testing
