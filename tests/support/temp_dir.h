// TempDir: a fresh directory under /tmp, removed with everything in it when
// the object goes.
#pragma once

#include <string>

namespace spillfs::testing {

class TempDir {
 public:
  // `prefix` names the directory: /tmp/<prefix>-XXXXXX (mode 0700, as
  // mkdtemp makes it). Throws std::runtime_error where it cannot be made.
  explicit TempDir(const std::string& prefix = "spillfs-test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path() + "/" + relative
  std::string Path(const std::string& relative) const { return path_ + "/" + relative; }

 private:
  std::string path_;
};

}  // namespace spillfs::testing
