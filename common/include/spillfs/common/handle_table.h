// HandleTable: owns the handles of open files that FUSE keeps for the daemon
// as a bare number (fuse_file_info::fh, the handle's address). The kernel
// sends a release for every open it was answered, but not when the daemon
// stops with files still open (SIGTERM, an unmount while busy): what the table
// holds then is freed with it, instead of leaking.
//
// Threading: every method from any thread (one mutex, held only
// around the map: a handle is destroyed outside it). The handle itself is
// reached from its address without the table (no lookup on a request's path);
// the kernel sends no request on a handle after its release, so nothing uses
// a handle once it is taken.
#pragma once

#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace spillfs {

template <typename T>
class HandleTable {
 public:
  // Keeps `handle` until it is taken back; returns its address (never null).
  T* Add(std::unique_ptr<T> handle) {
    T* address = handle.get();
    std::lock_guard lock(mu_);
    handles_.emplace(address, std::move(handle));
    return address;
  }

  // Gives `handle` back to the caller (to free or to release): null for null
  // or a handle the table does not hold.
  std::unique_ptr<T> Take(T* handle) {
    if (handle == nullptr) return nullptr;
    std::lock_guard lock(mu_);
    auto it = handles_.find(handle);
    if (it == handles_.end()) return nullptr;
    std::unique_ptr<T> owned = std::move(it->second);
    handles_.erase(it);
    return owned;
  }

  // Frees `handle` (nothing for null).
  void Free(T* handle) { Take(handle); }

  // Gives back every handle still held (at shutdown, for an owner whose
  // handles need more than freeing).
  std::vector<std::unique_ptr<T>> TakeAll() {
    std::lock_guard lock(mu_);
    std::vector<std::unique_ptr<T>> all;
    all.reserve(handles_.size());
    for (auto& [address, handle] : handles_) all.push_back(std::move(handle));
    handles_.clear();
    return all;
  }

  size_t size() const {
    std::lock_guard lock(mu_);
    return handles_.size();
  }

 private:
  mutable std::mutex mu_;
  std::unordered_map<T*, std::unique_ptr<T>> handles_;
};

}  // namespace spillfs
