// Out of memory at the Filesystem layer: a write that needs RAM-tier memory
// the system cannot give returns ENOMEM (a Status, not an exception), changes
// nothing (size, cached bytes, promised space), and the filesystem goes on:
// reads are served, and the same write succeeds once memory is back. The
// fault is injected through the RAM tier's test seam
// (FilesystemOptions::ram_tier_slab_fault); the mounted form is
// tests/integration/out_of_memory_test.cc.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <string>

#include "spillfs/core/filesystem.h"
#include "spillfs/store/volume.h"
#include "support/random_bytes.h"
#include "support/read_bytes.h"
#include "support/temp_dir.h"

namespace spillfs {
namespace {

using testing::RandomBytes;
using testing::ReadBytes;
using testing::TempDir;

constexpr uint64_t kMiB = 1ull << 20;

class WriteEnomemTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Volume::CreateOptions create;
    create.size = 256 * kMiB;
    const std::string dir = dir_.path() + "/vol";
    ASSERT_TRUE(Volume::Create(dir, create).ok());
    auto volume = Volume::Open(dir, Volume::OpenOptions{});
    ASSERT_TRUE(volume.ok()) << volume.status().ToString();
    FilesystemOptions options;
    options.ram_tier_bytes = 128 * kMiB;
    options.ram_tier_warm_bytes = 0;
    options.flush_age_ms = 3600 * 1000;  // nothing flushed behind the test's back
    options.ram_tier_slab_fault = [this] { return no_memory_.load(); };
    auto fs = Filesystem::Open(std::move(volume).value(), options);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    fs_ = std::move(fs).value();
  }

  TempDir dir_{"spillfs-write-enomem-test"};
  std::atomic<bool> no_memory_{false};
  std::unique_ptr<Filesystem> fs_;
};

TEST_F(WriteEnomemTest, WriteWithoutRamTierMemoryFailsWithEnomemAndChangesNothing) {
  auto entry = fs_->MakeNode(kRootInode, "f", S_IFREG | 0644, 0, Caller{});
  ASSERT_TRUE(entry.ok()) << entry.status().ToString();
  const InodeNumber ino = entry->ino;
  const std::string first = RandomBytes(kMiB, 1);
  const std::string second = RandomBytes(kMiB, 2);
  ASSERT_TRUE(fs_->Write(ino, 0, first.data(), first.size()).ok());
  ASSERT_TRUE(fs_->Fsync(ino, false).ok());  // on the SSD; its chunks go back to the pool

  // The pool keeps the freed buffers: a write needing more than it holds.
  no_memory_ = true;
  const uint64_t free_before = fs_->free_bytes();
  const uint64_t used_before = fs_->ram_tier_stats().used_bytes;
  const uint64_t kTooMuch = 64 * kMiB;  // more chunks than one slab's 32 MiB
  std::string big = RandomBytes(kTooMuch, 3);
  bool accepted = false;
  Filesystem::WriteAccepted accept = [&](size_t) { accepted = true; };
  auto failed = fs_->Write(ino, kMiB, big.data(), big.size(), &accept);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), ENOMEM) << failed.status().ToString();
  EXPECT_FALSE(accepted) << "a write that fails must not be answered as done first";
  EXPECT_EQ(fs_->free_bytes(), free_before) << "the space the failed write promised was given back";
  EXPECT_EQ(fs_->ram_tier_stats().used_bytes, used_before) << "the chunks made for the failed write were given back";
  auto attr = fs_->GetAttr(ino);
  ASSERT_TRUE(attr.ok());
  EXPECT_EQ(static_cast<uint64_t>(attr->attr.st_size), kMiB) << "the failed write changed the size";

  // Served meanwhile: reads, and writes that fit in the buffers the pool
  // already has (the failed write's went back to it).
  auto read = ReadBytes(*fs_, ino, 0, kMiB);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_TRUE(*read == first);
  ASSERT_TRUE(fs_->Write(ino, kMiB, second.data(), second.size()).ok());

  // Memory back: the write that failed succeeds.
  no_memory_ = false;
  auto done = fs_->Write(ino, kMiB, big.data(), big.size());
  ASSERT_TRUE(done.ok()) << done.status().ToString();
  EXPECT_EQ(*done, big.size());
  ASSERT_TRUE(fs_->Fsync(ino, false).ok());
  auto all = ReadBytes(*fs_, ino, 0, kMiB + kTooMuch);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_TRUE(*all == first + big);
}

}  // namespace
}  // namespace spillfs
