#include "fork_guard.h"

#include <pthread.h>

#include <algorithm>

namespace spillfs::client {
namespace {

// The live guards. Never destroyed (a fork may come during static
// destruction); taken first before a fork, released last after it.
std::mutex& RegistryMutex() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::vector<ForkGuard*>& Registry() {
  static auto* guards = new std::vector<ForkGuard*>;
  return *guards;
}

}  // namespace

ForkGuard::ForkGuard(std::initializer_list<std::mutex*> mutexes) : mutexes_(mutexes) {
  static std::once_flag installed;
  std::call_once(installed,
                 [] { pthread_atfork(&ForkGuard::BeforeFork, &ForkGuard::AfterFork, &ForkGuard::AfterFork); });
  std::lock_guard lock(RegistryMutex());
  Registry().push_back(this);
}

ForkGuard::~ForkGuard() {
  std::lock_guard lock(RegistryMutex());
  auto& guards = Registry();
  guards.erase(std::remove(guards.begin(), guards.end(), this), guards.end());
}

void ForkGuard::BeforeFork() {
  RegistryMutex().lock();
  for (ForkGuard* guard : Registry()) {
    for (std::mutex* mu : guard->mutexes_) mu->lock();
  }
}

void ForkGuard::AfterFork() {
  // In the child too this thread is the one that locked them.
  for (ForkGuard* guard : Registry()) {
    for (auto it = guard->mutexes_.rbegin(); it != guard->mutexes_.rend(); ++it) (*it)->unlock();
  }
  RegistryMutex().unlock();
}

}  // namespace spillfs::client
