#include "support/shared_volume.h"

#include <sys/stat.h>

#include <cerrno>
#include <exception>

#include "support/errno_names.h"

namespace spillfs::testing {

void SharedVolumeTest::MountSharedVolume(const MountedVolume::Options& options) {
  umask(0);
  try {
    volume_ = std::make_unique<MountedVolume>(options);
  } catch (const std::exception& e) {
    setup_error_ = e.what();
  }
}

void SharedVolumeTest::SetUp() {
  ASSERT_NE(volume_, nullptr) << "could not mount a volume: " << setup_error_;
  umask(0);
  dir_ = volume_->Path(::testing::UnitTest::GetInstance()->current_test_info()->name());
  ASSERT_EQ(mkdir(dir_.c_str(), 0755), 0) << "mkdir " << dir_ << ": " << ErrnoName(errno);
}

}  // namespace spillfs::testing
