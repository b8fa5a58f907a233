// spill_file_read_rows (libspillfs_client) on every backend: the direct path
// and O_DIRECT through a spillfs mount, O_DIRECT on a plain directory, and
// the buffered fallback. Feature tables of row sizes that are and are not
// multiples of 4 KiB, after a header (a .npy's data offset) or not, whose
// size does not end on a block: random, repeated and boundary rows equal
// the file's bytes; rows that share blocks are read once; rows outside the
// file are refused (-ERANGE naming the row) before anything is read.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "spillfs/client.h"
#include "support/file_places.h"
#include "support/mounted_volume.h"
#include "support/random_bytes.h"

namespace spillfs::testing {
namespace {

class FileRowsTest : public ::testing::TestWithParam<Place> {
 protected:
  void SetUp() override {
    ASSERT_EQ(spill_config_set("direct_path", 1), 0);
    ASSERT_EQ(spill_config_set("o_direct", 1), 0);
    place_.Make(GetParam(), "rows");
  }

  void TearDown() override {
    spill_config_set("direct_path", 1);
    spill_config_set("o_direct", 1);
  }

  // Writes `bytes` to `name` through the file system; its path.
  std::string Write(const std::string& name, const std::string& bytes) {
    std::string path = place_.Path(name);
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    EXPECT_GE(fd, 0) << path << ": " << strerror(errno);
    EXPECT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    EXPECT_EQ(fsync(fd), 0);
    close(fd);
    return path;
  }

  FilePtr Open(const std::string& path) {
    FilePtr f(spill_file_open(path.c_str(), SPILL_FILE_READ, 0));
    EXPECT_NE(f, nullptr) << path << ": " << spill_last_error();
    if (f) place_.ExpectBackend(f.get());
    return f;
  }

  PlaceDir place_;
};

// Reads `rows` and compares each with the bytes of `image`.
void ExpectRows(spill_file* f, const std::string& image, uint64_t offset, uint64_t row_bytes,
                const std::vector<int64_t>& rows, spill_io_stats* stats = nullptr) {
  std::vector<char> out(rows.size() * row_bytes + 1, '\x5a');
  ASSERT_EQ(spill_file_read_rows(f, offset, row_bytes, rows.data(), rows.size(), out.data(), stats), 0)
      << spill_last_error();
  for (size_t i = 0; i < rows.size(); ++i) {
    ASSERT_EQ(std::memcmp(out.data() + i * row_bytes, image.data() + offset + rows[i] * row_bytes, row_bytes), 0)
        << "row " << rows[i] << " at index " << i << " of " << row_bytes << " bytes from offset " << offset;
  }
  EXPECT_EQ(out.back(), '\x5a') << "wrote past the output";
}

TEST_P(FileRowsTest, RandomRepeatedAndBoundaryRowsEqualTheFile) {
  // (row bytes, data offset, rows): rows below, at and above a block; a
  // header of a .npy's size; a row count whose end is not a block boundary.
  struct Table {
    uint64_t row_bytes, offset, count;
  } tables[] = {{12, 128, 1000}, {4096, 0, 37}, {4096, 128, 37}, {5000, 128, 61}, {516, 80, 333}, {3, 0, 4097}};
  std::mt19937_64 rng(11);
  int k = 0;
  for (const Table& t : tables) {
    std::string image = RandomBytes(t.offset + t.row_bytes * t.count, 100 + k);
    std::string path = Write("table" + std::to_string(k++), image);
    FilePtr f = Open(path);
    ASSERT_TRUE(f);
    const int64_t last = static_cast<int64_t>(t.count) - 1;
    ExpectRows(f.get(), image, t.offset, t.row_bytes, {0, last, last, 0, 1, last - 1});
    std::vector<int64_t> rows(500);
    for (auto& r : rows) r = static_cast<int64_t>(rng() % t.count);
    ExpectRows(f.get(), image, t.offset, t.row_bytes, rows);
    std::vector<int64_t> all(t.count);
    for (uint64_t i = 0; i < t.count; ++i) all[i] = static_cast<int64_t>(t.count - 1 - i);
    ExpectRows(f.get(), image, t.offset, t.row_bytes, all);
  }
}

TEST_P(FileRowsTest, RowsSharingABlockAreReadOnce) {
  std::string image = RandomBytes(64 * 4096, 5);
  std::string path = Write("shared", image);
  FilePtr f = Open(path);
  ASSERT_TRUE(f);
  // 64 rows of 64 bytes in block 0, the same again, and one in block 10.
  std::vector<int64_t> rows;
  for (int i = 0; i < 64; ++i) rows.push_back(i);
  for (int i = 0; i < 64; ++i) rows.push_back(63 - i);
  rows.push_back(10 * 4096 / 64);
  spill_io_stats stats{};
  ExpectRows(f.get(), image, 0, 64, rows, &stats);
  EXPECT_EQ(stats.io_bytes, 2 * 4096u);
  EXPECT_EQ(stats.ios, 2u);
  EXPECT_EQ(stats.bytes, rows.size() * 64);
}

TEST_P(FileRowsTest, RowsOutsideTheFileAreRefused) {
  std::string image = RandomBytes(128 + 10 * 100, 6);
  std::string path = Write("small.npy", image);
  FilePtr f = Open(path);
  ASSERT_TRUE(f);
  std::vector<char> out(1000, 0);
  for (int64_t bad : {int64_t{10}, int64_t{-1}, int64_t{1} << 60}) {
    std::vector<int64_t> rows = {0, bad};
    EXPECT_EQ(spill_file_read_rows(f.get(), 128, 100, rows.data(), rows.size(), out.data(), nullptr), -ERANGE);
    std::string message = spill_last_error();
    EXPECT_NE(message.find("row " + std::to_string(bad)), std::string::npos) << message;
    EXPECT_NE(message.find("small.npy"), std::string::npos) << message;
  }
  // A data offset past the end leaves no rows.
  int64_t zero = 0;
  EXPECT_EQ(spill_file_read_rows(f.get(), 4096, 100, &zero, 1, out.data(), nullptr), -ERANGE);
  EXPECT_EQ(spill_file_read_rows(f.get(), 128, 0, &zero, 1, out.data(), nullptr), -EINVAL);
  EXPECT_EQ(spill_file_read_rows(f.get(), 128, 100, &zero, 0, out.data(), nullptr), 0);
  EXPECT_EQ(spill_file_read_rows(nullptr, 128, 100, &zero, 1, out.data(), nullptr), -EINVAL);
}

INSTANTIATE_TEST_SUITE_P(Backends, FileRowsTest,
                         ::testing::Values(Place::kSpillfsDirect, Place::kSpillfsMount, Place::kTmp,
                                           Place::kTmpBuffered),
                         PlaceName);

}  // namespace
}  // namespace spillfs::testing
