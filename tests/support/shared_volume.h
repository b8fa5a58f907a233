// SharedVolumeTest: the fixture of suites whose tests share one mounted
// volume (mounted once per suite) and each work in a directory of their own,
// named after the test, with umask 0 so that modes are exactly as asked.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "support/mounted_volume.h"

namespace spillfs::testing {

class SharedVolumeTest : public ::testing::Test {
 protected:
  // Mounts the suite's volume; a failure is kept in setup_error_ and
  // reported by each test's SetUp. A suite that needs other options calls it
  // from a SetUpTestSuite of its own.
  static void MountSharedVolume(const MountedVolume::Options& options = MountedVolume::Options());
  static void SetUpTestSuite() { MountSharedVolume(); }
  static void TearDownTestSuite() { volume_.reset(); }

  // Asserts the volume is mounted and makes this test's directory (0755).
  void SetUp() override;

  // A path inside this test's own directory.
  std::string P(const std::string& relative) const { return dir_ + "/" + relative; }

  static inline std::unique_ptr<MountedVolume> volume_;
  static inline std::string setup_error_;
  std::string dir_;
};

}  // namespace spillfs::testing
