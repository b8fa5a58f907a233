#include "support/eventually.h"

#include <thread>

namespace spillfs::testing {

bool Eventually(const std::function<bool()>& cond, std::chrono::milliseconds timeout, std::chrono::milliseconds poll) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!cond()) {
    if (std::chrono::steady_clock::now() >= deadline) return cond();
    std::this_thread::sleep_for(poll);
  }
  return true;
}

}  // namespace spillfs::testing
