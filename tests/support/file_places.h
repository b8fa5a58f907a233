// Where the tests of the client library's files (spill_file_*:
// segment_file_test, file_rows_test) put them, and the backend
// spill_file_open picks there: a mount of a fresh volume, by the direct path
// or through the mount; a temporary directory on /tmp or on a tmpfs, with
// O_DIRECT or buffered. Header-only: for tests that link spillfs_client.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "spillfs/client.h"
#include "support/mounted_volume.h"

namespace spillfs::testing {

enum class Place { kSpillfsDirect, kSpillfsMount, kTmp, kTmpBuffered, kTmpfs, kTmpfsBuffered };

// Each place's part of the test names (for INSTANTIATE_TEST_SUITE_P).
inline std::string PlaceName(const ::testing::TestParamInfo<Place>& info) {
  switch (info.param) {
    case Place::kSpillfsDirect:
      return "SpillfsDirectPath";
    case Place::kSpillfsMount:
      return "SpillfsThroughTheMount";
    case Place::kTmp:
      return "TmpDirectory";
    case Place::kTmpBuffered:
      return "TmpBuffered";
    case Place::kTmpfs:
      return "Tmpfs";
    case Place::kTmpfsBuffered:
      return "TmpfsBuffered";
  }
  return "?";
}

// spill_file_close, expected to succeed.
struct FileCloser {
  void operator()(spill_file* f) const { EXPECT_EQ(spill_file_close(f), 0) << spill_last_error(); }
};
using FilePtr = std::unique_ptr<spill_file, FileCloser>;

// The directory of one place for one test; a temporary one is removed with
// this object, a mount unmounted.
class PlaceDir {
 public:
  PlaceDir() = default;
  PlaceDir(const PlaceDir&) = delete;
  PlaceDir& operator=(const PlaceDir&) = delete;
  ~PlaceDir() {
    if (!temp_.empty()) std::filesystem::remove_all(temp_);
  }

  // Makes the directory of `place` (a temporary one named after `tag`; a
  // mount of a volume made with `options`) and sets the process-wide
  // settings it needs: direct_path 0 through the mount, o_direct 0 where
  // buffered (the caller sets them back). Skips the test where the place
  // cannot be had (a mount needs root; a tmpfs, /dev/shm). Call it from
  // SetUp: a failure or skip ends the test before its body.
  void Make(Place place, const std::string& tag, const MountedVolume::Options& options = {}) {
    switch (place) {
      case Place::kSpillfsDirect:
      case Place::kSpillfsMount:
        if (geteuid() != 0) GTEST_SKIP() << "mounting a volume (and the direct path) needs root";
        volume_ = std::make_unique<MountedVolume>(options);
        dir_ = volume_->mountpoint();
        backend_ = SPILL_BACKEND_DIRECT_PATH;
        if (place == Place::kSpillfsMount) {
          ASSERT_EQ(spill_config_set("direct_path", 0), 0);
          backend_ = SPILL_BACKEND_MOUNT;
        }
        return;
      case Place::kTmp:
      case Place::kTmpBuffered:
        MakeTemp("/tmp", tag);
        break;
      case Place::kTmpfs:
      case Place::kTmpfsBuffered:
        if (!std::filesystem::exists("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
        MakeTemp("/dev/shm", tag);
        break;
    }
    // A file system that refuses O_DIRECT (a tmpfs before Linux 6.6) gives
    // the buffered backend: ExpectBackend takes either.
    backend_ = SPILL_BACKEND_DIRECT_IO;
    if (place == Place::kTmpBuffered || place == Place::kTmpfsBuffered) {
      ASSERT_EQ(spill_config_set("o_direct", 0), 0);
      backend_ = SPILL_BACKEND_BUFFERED;
    }
  }

  const std::string& dir() const { return dir_; }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  // The mounted volume; null where the place is not a mount.
  MountedVolume* volume() const { return volume_.get(); }

  // Expects `f` on the backend of the place.
  void ExpectBackend(spill_file* f) const {
    int backend = spill_file_backend(f);
    if (backend_ == SPILL_BACKEND_DIRECT_IO && backend == SPILL_BACKEND_BUFFERED) return;  // O_DIRECT refused
    EXPECT_EQ(backend, backend_);
  }

 private:
  void MakeTemp(const std::string& parent, const std::string& tag) {
    std::string tmpl = parent + "/spillfs-" + tag + "-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr) << parent << ": " << std::strerror(errno);
    temp_ = dir_ = tmpl;
  }

  std::unique_ptr<MountedVolume> volume_;
  std::string dir_, temp_;
  int backend_ = 0;
};

}  // namespace spillfs::testing
