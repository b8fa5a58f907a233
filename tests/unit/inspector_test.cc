// Unit tests for fs/inspector.h: a fixed tree is made through Filesystem on a
// fresh volume, the Filesystem is closed, and the volume is opened read-only
// for an Inspector, as `spillfs stat / ls / du` do on an unmounted volume.
// Path resolution, the numbers of Stat and Du, the shape of Ls and Extents,
// the control-interface dispatcher and the Prometheus text are checked
// exactly; dedup accounting (shared blobs counted once) is checked on extent
// records written straight into the index.
#include "spillfs/inspect/inspector.h"

#include <gtest/gtest.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <xxhash.h>

#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "spillfs/control/control_plane.h"
#include "spillfs/core/filesystem.h"
#include "spillfs/kvindex/keys.h"
#include "spillfs/store/volume.h"
#include "support/temp_dir.h"

namespace spillfs {
namespace {

using nlohmann::json;

constexpr uint64_t kBlock = 4096;
constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kVolumeSize = 64 * kMiB;
constexpr uint64_t kCapacity = kVolumeSize - Volume::kDataOffset;

uint64_t RoundUp(uint64_t v) { return (v + kBlock - 1) / kBlock * kBlock; }

std::string Pattern(size_t n, uint8_t seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + i * 7 + i / 4096);
  return s;
}

// The checksum Inspector reports for an extent holding `data` (whole blocks).
std::string ExpectedChecksum(const std::string& data) {
  std::string bytes;
  for (size_t at = 0; at < data.size(); at += kBlock) {
    std::string block = data.substr(at, kBlock);
    block.resize(kBlock, '\0');
    auto sum = static_cast<uint32_t>(XXH3_64bits(block.data(), block.size()));
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>((sum >> (8 * i)) & 0xff));
  }
  char hex[17];
  snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(XXH3_64bits(bytes.data(), bytes.size())));
  return hex;
}

// The fixed tree:
//   /a.txt      10000 bytes                      (nlink 2: also /d/hard)
//   /abs        -> /etc                           (symlink, absolute)
//   /d/         dir
//   /d/b.bin    12288 bytes
//   /d/hard     hard link to /a.txt
//   /d/link     -> b.bin                          (symlink, relative)
//   /d/loop     -> loop                           (symlink to itself)
//   /d/sub/     dir
//   /d/sub/c    1 byte
//   /empty      0 bytes
//   /prealloc   fallocate(0, 8192): one unwritten extent
//   /sparse     4096 bytes at offset 1 MiB (size 1 MiB + 4096)
struct Tree {
  std::string a = Pattern(10000, 1);
  std::string b = Pattern(12288, 2);
  std::string c = "x";
  std::string s = Pattern(4096, 3);
  uint64_t logical() const { return a.size() + b.size() + c.size() + 8192 + kMiB + s.size(); }
  uint64_t mapped() const {
    return RoundUp(a.size()) + RoundUp(b.size()) + RoundUp(c.size()) + 8192 + RoundUp(s.size());
  }
};

class InspectorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = root_.Path("vol");
    Volume::CreateOptions options;
    options.size = kVolumeSize;
    auto sb = Volume::Create(dir_, options);
    ASSERT_TRUE(sb.ok()) << sb.status().ToString();
  }
  void TearDown() override { volume_.reset(); }

  void BuildTree() {
    auto volume = Volume::Open(dir_, {});
    ASSERT_TRUE(volume.ok()) << volume.status().ToString();
    auto fs_or = Filesystem::Open(std::move(volume).value());
    ASSERT_TRUE(fs_or.ok()) << fs_or.status().ToString();
    std::unique_ptr<Filesystem> fs = std::move(fs_or).value();
    Caller caller{0, 0};
    auto file = [&](InodeNumber parent, const char* name, const std::string& data) -> InodeNumber {
      auto e = fs->MakeNode(parent, name, S_IFREG | 0644, 0, caller);
      EXPECT_TRUE(e.ok()) << name << ": " << e.status().ToString();
      if (!e.ok()) return 0;
      if (!data.empty()) {
        auto n = fs->Write(e->ino, 0, data.data(), data.size());
        EXPECT_TRUE(n.ok() && *n == data.size()) << name;
      }
      return e->ino;
    };
    InodeNumber a = file(kRootInode, "a.txt", tree_.a);
    file(kRootInode, "empty", "");
    auto d = fs->MakeDir(kRootInode, "d", 0755, caller);
    ASSERT_TRUE(d.ok());
    file(d->ino, "b.bin", tree_.b);
    auto sub = fs->MakeDir(d->ino, "sub", 0700, caller);
    ASSERT_TRUE(sub.ok());
    file(sub->ino, "c", tree_.c);
    ASSERT_TRUE(fs->Link(a, d->ino, "hard").ok());
    ASSERT_TRUE(fs->Symlink(d->ino, "link", "b.bin", caller).ok());
    ASSERT_TRUE(fs->Symlink(d->ino, "loop", "loop", caller).ok());
    ASSERT_TRUE(fs->Symlink(kRootInode, "abs", "/etc", caller).ok());
    InodeNumber sparse = file(kRootInode, "sparse", "");
    auto n = fs->Write(sparse, kMiB, tree_.s.data(), tree_.s.size());
    ASSERT_TRUE(n.ok());
    InodeNumber pre = file(kRootInode, "prealloc", "");
    ASSERT_TRUE(fs->Fallocate(pre, 0, 0, 8192).ok());
    fs.reset();  // syncs and releases the volume
  }

  // Opens the volume as the tools do.
  Inspector& Open() {
    auto volume = Volume::Open(dir_, Volume::OpenOptions{.read_only = true});
    EXPECT_TRUE(volume.ok()) << volume.status().ToString();
    volume_ = std::move(volume).value();
    inspector_ = std::make_unique<Inspector>(volume_->index(), volume_->superblock());
    return *inspector_;
  }

  // The stat and the du of "/" both count REFERENCED bytes over PHYSICAL
  // ones, and the stat's dedup ratio is their quotient; *STAT gets the stat.
  void ExpectDedupAccounting(Inspector& in, uint64_t referenced, uint64_t physical, json* stat = nullptr) {
    auto s = in.Stat(RuntimeStats{});
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ((*s)["referenced_bytes"], referenced);
    EXPECT_EQ((*s)["physical_bytes"], physical);
    EXPECT_DOUBLE_EQ((*s)["dedup_ratio"].get<double>(), static_cast<double>(referenced) / physical);
    auto du = in.Du("/");
    ASSERT_TRUE(du.ok());
    EXPECT_EQ((*du)["physical_bytes"], physical);
    EXPECT_EQ((*du)["referenced_bytes"], referenced);
    if (stat != nullptr) *stat = *s;
  }

  InodeNumber Resolve(const std::string& path) {
    auto ino = inspector_->ResolvePath(path);
    EXPECT_TRUE(ino.ok()) << path << ": " << ino.status().ToString();
    return ino.ok() ? *ino : 0;
  }

  testing::TempDir root_{"spillfs-inspector"};
  std::string dir_;
  Tree tree_;
  std::unique_ptr<Volume> volume_;
  std::unique_ptr<Inspector> inspector_;
};

TEST_F(InspectorTest, ResolvesPaths) {
  BuildTree();
  Inspector& in = Open();
  EXPECT_EQ(Resolve("/"), kRootInode);
  EXPECT_EQ(Resolve(""), kRootInode);
  EXPECT_EQ(Resolve("/.."), kRootInode);
  InodeNumber d = Resolve("/d");
  InodeNumber sub = Resolve("//d///sub/");
  EXPECT_NE(d, kRootInode);
  EXPECT_NE(sub, d);
  EXPECT_EQ(Resolve("/d/sub/.."), d);
  EXPECT_EQ(Resolve("d/./sub"), sub);
  EXPECT_EQ(Resolve("/a.txt"), Resolve("/d/hard"));
  // A final symlink is not followed; a middle one (relative) is.
  InodeNumber link = Resolve("/d/link");
  InodeNumber b = Resolve("/d/b.bin");
  EXPECT_NE(link, b);
  EXPECT_EQ(Resolve("/d/sub/../link"), link);

  struct Case {
    const char* path;
    int code;
  };
  for (const Case& c : {Case{"/missing", ENOENT}, Case{"/d/missing/x", ENOENT}, Case{"/a.txt/x", ENOTDIR},
                        Case{"/a.txt/", ENOTDIR}, Case{"/d/link/", ENOTDIR},  // follows to b.bin, a file
                        Case{"/abs/passwd", ENOTDIR}, Case{"/d/loop/x", ELOOP}}) {
    auto r = in.ResolvePath(c.path);
    ASSERT_FALSE(r.ok()) << c.path;
    EXPECT_EQ(r.status().code(), c.code) << c.path << ": " << r.status().ToString();
    EXPECT_NE(r.status().message().find(c.path), std::string::npos) << r.status().message();
  }
}

TEST_F(InspectorTest, StatCountsTheTree) {
  BuildTree();
  Inspector& in = Open();
  auto stat = in.Stat(RuntimeStats{});
  ASSERT_TRUE(stat.ok()) << stat.status().ToString();
  const json& s = *stat;
  EXPECT_EQ(s["uuid"], volume_->superblock().UuidString());
  EXPECT_EQ(s["mounted"], false);
  EXPECT_EQ(s["block_size"], kBlock);
  EXPECT_EQ(s["capacity_bytes"], kCapacity);
  EXPECT_EQ(s["logical_bytes"], tree_.logical());
  EXPECT_EQ(s["referenced_bytes"], tree_.mapped());
  EXPECT_EQ(s["physical_bytes"], tree_.mapped());
  EXPECT_EQ(s["used_bytes"], tree_.mapped());
  EXPECT_EQ(s["free_bytes"], kCapacity - tree_.mapped());
  EXPECT_DOUBLE_EQ(s["dedup_ratio"].get<double>(), 1.0);
  EXPECT_EQ(s["files"], 6u);  // a.txt(=hard), empty, b.bin, c, sparse, prealloc
  EXPECT_EQ(s["directories"], 3u);
  EXPECT_EQ(s["symlinks"], 3u);
  EXPECT_EQ(s["special_files"], 0u);
  EXPECT_EQ(s["inodes"], 12u);
  EXPECT_EQ(s["orphans"], 0u);
  for (const char* key : {"ram_tier_bytes", "bytes_written_ssd", "bytes_read_ssd", "bytes_cancelled", "checksum_errors",
                          "data_syncs", "reads", "writes", "queue_depth"}) {
    ASSERT_TRUE(s.contains(key)) << key;
    EXPECT_EQ(s[key], 0u) << key;
  }
  EXPECT_EQ(s["data_sync_failed"], false);
  EXPECT_TRUE(s["data_sync_error"].is_null());
}

TEST_F(InspectorTest, StatOfAnEmptyVolume) {
  Inspector& in = Open();
  auto stat = in.Stat(RuntimeStats{});
  ASSERT_TRUE(stat.ok()) << stat.status().ToString();
  EXPECT_EQ((*stat)["used_bytes"], 0u);
  EXPECT_EQ((*stat)["free_bytes"], kCapacity);
  EXPECT_EQ((*stat)["physical_bytes"], 0u);
  EXPECT_DOUBLE_EQ((*stat)["dedup_ratio"].get<double>(), 1.0);
  EXPECT_EQ((*stat)["files"], 0u);
  EXPECT_EQ((*stat)["directories"], 1u);
}

TEST_F(InspectorTest, StatTakesLiveCountersFromTheDaemon) {
  BuildTree();
  Inspector& in = Open();
  RuntimeStats rt;
  rt.mounted = true;
  rt.has_free_bytes = true;
  rt.free_bytes = kCapacity - 5 * kBlock;
  rt.data_sync_error = "EIO: fdatasync failed";
  // A value of its own for every counter kStatKeys takes from RuntimeStats.
  uint64_t next = 11;
  for (const StatKey& key : kStatKeys) {
    if (key.count != nullptr) rt.*key.count = next++;
    if (key.seconds != nullptr) rt.*key.seconds = static_cast<double>(next++) / 4;
  }
  auto stat = in.Stat(rt);
  ASSERT_TRUE(stat.ok());
  const json& s = *stat;
  EXPECT_EQ(s["mounted"], true);
  EXPECT_EQ(s["free_bytes"], kCapacity - 5 * kBlock);
  EXPECT_EQ(s["used_bytes"], 5 * kBlock);
  EXPECT_EQ(s["data_sync_failed"], true);
  EXPECT_EQ(s["data_sync_error"], "EIO: fdatasync failed");
  int counters = 0;
  for (const StatKey& key : kStatKeys) {
    if (key.count != nullptr) {
      EXPECT_EQ(s[key.key], rt.*key.count) << key.key;
    }
    if (key.seconds != nullptr) {
      EXPECT_DOUBLE_EQ(s[key.key].get<double>(), rt.*key.seconds) << key.key;
    }
    counters += key.count != nullptr || key.seconds != nullptr;
  }
  EXPECT_EQ(counters, 26);
  // The rows name the members they read.
  EXPECT_EQ(s["ram_tier_hits"], rt.ram_tier_hits);
  EXPECT_EQ(s["reads"], rt.reads);
  EXPECT_EQ(s["writes"], rt.writes);
  EXPECT_EQ(s["read_ahead_bytes_fetched"], rt.read_ahead_bytes_fetched);
  EXPECT_EQ(s["read_ahead_bytes_served"], rt.read_ahead_bytes_served);
  EXPECT_DOUBLE_EQ(s["read_ahead_wait_seconds"].get<double>(), rt.read_ahead_wait_seconds);
  EXPECT_DOUBLE_EQ(s["uptime_seconds"].get<double>(), rt.uptime_seconds);
}

// kStatKeys names exactly the keys of the stat object, and the Prometheus
// text takes its types and help lines from it.
TEST_F(InspectorTest, StatKeysTableIsTheStatObject) {
  BuildTree();
  Inspector& in = Open();
  auto stat = in.Stat(RuntimeStats{});
  ASSERT_TRUE(stat.ok());
  std::set<std::string> keys, table;
  for (const auto& [key, value] : stat->items()) keys.insert(key);
  for (const StatKey& key : kStatKeys) EXPECT_TRUE(table.insert(key.key).second) << "twice: " << key.key;
  EXPECT_EQ(keys, table);
  std::string text = PrometheusText(*stat);
  for (const StatKey& key : kStatKeys) {
    const std::string name = std::string("spillfs_") + key.key;
    bool shown = text.find("\n" + name + " ") != std::string::npos;
    EXPECT_EQ(shown, key.type != StatType::kText) << key.key;
    if (!shown) continue;
    EXPECT_NE(text.find("# HELP " + name + " " + key.help + "\n"), std::string::npos) << key.key;
    const char* type = key.type == StatType::kCounter ? "counter" : "gauge";
    EXPECT_NE(text.find("# TYPE " + name + " " + type + "\n"), std::string::npos) << key.key;
  }
}

// Checks that `extents` tiles [0, RoundUp(size)) from `start` without gaps.
void ExpectCovers(const json& extents, uint64_t start, uint64_t length) {
  uint64_t at = start;
  for (const json& e : extents) {
    EXPECT_EQ(e["file_offset"], at);
    EXPECT_EQ(e["physical_offset"].get<uint64_t>() % kBlock, 0u);
    EXPECT_GE(e["physical_offset"].get<uint64_t>(), Volume::kDataOffset);
    at += e["length"].get<uint64_t>();
  }
  EXPECT_EQ(at, start + length);
}

TEST_F(InspectorTest, LsListsDirectoriesLikeLs) {
  BuildTree();
  Inspector& in = Open();
  auto ls = in.Ls({"/"}, Inspector::LsOptions{});
  ASSERT_TRUE(ls.ok()) << ls.status().ToString();
  std::vector<std::string> names;
  for (const json& e : *ls) names.push_back(e["name"].get<std::string>());
  EXPECT_EQ(names, (std::vector<std::string>{"a.txt", "abs", "d", "empty", "prealloc", "sparse"}));
  const json& a = (*ls)[0];
  EXPECT_EQ(a["path"], "/a.txt");
  EXPECT_EQ(a["type"], "file");
  EXPECT_EQ(a["mode"], S_IFREG | 0644);
  EXPECT_EQ(a["size"], tree_.a.size());
  EXPECT_EQ(a["nlink"], 2u);
  EXPECT_EQ(a["uid"], 0u);
  EXPECT_EQ(a["gid"], 0u);
  EXPECT_EQ(a["allocated_bytes"], RoundUp(tree_.a.size()));
  EXPECT_TRUE(a["mtime_ns"].is_number_integer());
  EXPECT_TRUE(std::regex_match(a["mtime"].get<std::string>(), std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z)")))
      << a["mtime"];
  EXPECT_FALSE(a.contains("extents"));
  EXPECT_FALSE(a.contains("generation"));
  EXPECT_EQ((*ls)[1]["type"], "symlink");
  EXPECT_EQ((*ls)[1]["target"], "/etc");
  EXPECT_EQ((*ls)[2]["type"], "dir");
  EXPECT_EQ((*ls)[2]["mode"], S_IFDIR | 0755);

  auto d = in.Ls({"/d/"}, Inspector::LsOptions{.long_format = true});
  ASSERT_TRUE(d.ok());
  std::vector<std::string> paths;
  for (const json& e : *d) paths.push_back(e["path"].get<std::string>());
  EXPECT_EQ(paths, (std::vector<std::string>{"/d/b.bin", "/d/hard", "/d/link", "/d/loop", "/d/sub"}));
  EXPECT_TRUE((*d)[0].contains("generation"));
  EXPECT_EQ((*d)[0]["ephemeral"], false);
  EXPECT_EQ((*d)[4]["mode"], S_IFDIR | 0700);

  // -d: the directory itself; a symlink is shown, not followed.
  auto self = in.Ls({"/d", "/d/link", "/"}, Inspector::LsOptions{.directory = true});
  ASSERT_TRUE(self.ok());
  ASSERT_EQ(self->size(), 3u);
  EXPECT_EQ((*self)[0]["path"], "/d");
  EXPECT_EQ((*self)[0]["type"], "dir");
  EXPECT_EQ((*self)[1]["type"], "symlink");
  EXPECT_EQ((*self)[1]["target"], "b.bin");
  EXPECT_EQ((*self)[2]["path"], "/");
  EXPECT_EQ((*self)[2]["ino"], kRootInode);

  auto missing = in.Ls({"/d", "/nope"}, Inspector::LsOptions{});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), ENOENT);
}

TEST_F(InspectorTest, LsShowsExtents) {
  BuildTree();
  Inspector& in = Open();
  auto ls = in.Ls({"/d/b.bin", "/sparse", "/prealloc", "/empty", "/d"}, false, true);
  ASSERT_TRUE(ls.ok()) << ls.status().ToString();
  ASSERT_EQ(ls->size(), 4u + 5u);
  const json& b = (*ls)[0]["extents"];
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0]["file_offset"], 0u);
  EXPECT_EQ(b[0]["length"], tree_.b.size());
  EXPECT_EQ(b[0]["checksum"], ExpectedChecksum(tree_.b));
  EXPECT_EQ(b[0]["shared"], 1u);
  EXPECT_EQ(b[0]["unwritten"], false);
  EXPECT_EQ(b[0]["blob_id"], 0u);

  const json& sparse = (*ls)[1]["extents"];
  ExpectCovers(sparse, kMiB, kBlock);
  EXPECT_EQ(sparse[0]["checksum"], ExpectedChecksum(tree_.s));

  const json& pre = (*ls)[2]["extents"];
  ExpectCovers(pre, 0, 8192);
  for (const json& e : pre) {
    EXPECT_EQ(e["unwritten"], true);
    EXPECT_TRUE(e["checksum"].is_null());
  }
  EXPECT_TRUE((*ls)[3]["extents"].empty());
  // Directory entries carry extents too (empty for the directory and links).
  for (size_t i = 4; i < ls->size(); ++i) ASSERT_TRUE((*ls)[i].contains("extents"));

  // Extents by inode; physical ranges of different files do not overlap.
  auto a = in.Extents(Resolve("/a.txt"));
  ASSERT_TRUE(a.ok());
  ExpectCovers(*a, 0, RoundUp(tree_.a.size()));
  uint64_t a_phys = (*a)[0]["physical_offset"];
  uint64_t b_phys = b[0]["physical_offset"];
  EXPECT_TRUE(a_phys + RoundUp(tree_.a.size()) <= b_phys || b_phys + tree_.b.size() <= a_phys);
  auto none = in.Extents(987654);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), ENOENT);
}

TEST_F(InspectorTest, DuSumsTrees) {
  BuildTree();
  Inspector& in = Open();
  auto all = in.Du("/");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ((*all)["path"], "/");
  EXPECT_EQ((*all)["logical_bytes"], tree_.logical());
  EXPECT_EQ((*all)["physical_bytes"], tree_.mapped());
  EXPECT_EQ((*all)["referenced_bytes"], tree_.mapped());
  EXPECT_EQ((*all)["files"], 6u);
  EXPECT_EQ((*all)["directories"], 3u);
  EXPECT_EQ((*all)["symlinks"], 3u);

  auto d = in.Du("/d");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ((*d)["logical_bytes"], tree_.b.size() + tree_.a.size() + tree_.c.size());
  EXPECT_EQ((*d)["physical_bytes"], RoundUp(tree_.b.size()) + RoundUp(tree_.a.size()) + RoundUp(tree_.c.size()));
  EXPECT_EQ((*d)["files"], 3u);
  EXPECT_EQ((*d)["directories"], 2u);
  EXPECT_EQ((*d)["symlinks"], 2u);

  auto sparse = in.Du("/sparse");
  ASSERT_TRUE(sparse.ok());
  EXPECT_EQ((*sparse)["logical_bytes"], kMiB + kBlock);
  EXPECT_EQ((*sparse)["physical_bytes"], kBlock);
  EXPECT_EQ((*sparse)["files"], 1u);
  EXPECT_EQ((*sparse)["directories"], 0u);

  auto sub = in.Du("/d/sub/");
  ASSERT_TRUE(sub.ok());
  EXPECT_EQ((*sub)["path"], "/d/sub");
  EXPECT_EQ((*sub)["logical_bytes"], 1u);
  EXPECT_EQ((*sub)["physical_bytes"], kBlock);

  for (const char* bad : {"/missing", "/d/missing", "/empty/x"}) {
    auto r = in.Du(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), std::string(bad) == "/empty/x" ? ENOTDIR : ENOENT) << bad;
  }
}

// Dedup accounting before the dedup engine exists: three files whose extents
// name one blob (the third only a slice of it) and one private file.
TEST_F(InspectorTest, SharedBlobsCountOnce) {
  {
    auto volume = Volume::Open(dir_, {});
    ASSERT_TRUE(volume.ok()) << volume.status().ToString();
    Index& index = (*volume)->index();
    Index::Batch batch(index);
    const uint64_t blob_phys = Volume::kDataOffset + 16 * kBlock;
    auto add = [&](InodeNumber ino, const char* name, uint64_t size,
                   std::vector<std::pair<uint64_t, ExtentRecord>> extents) {
      InodeRecord r;
      r.mode = S_IFREG | 0600;
      r.nlink = 1;
      r.size = size;
      for (auto& [offset, e] : extents) {
        r.allocated_bytes += e.length;
        batch.Put(Family::kExtent, keys::Extent(ino, offset), e.Encode());
      }
      batch.Put(Family::kInode, keys::Ino(ino), r.Encode());
      batch.Put(Family::kDirent, keys::Dirent(kRootInode, name), DirentRecord{ino, S_IFREG}.Encode());
    };
    ExtentRecord blob{.physical = blob_phys, .length = 2 * kBlock, .flags = 0, .blob_id = 7, .block_checksums = {1, 2}};
    ExtentRecord slice{
        .physical = blob_phys + kBlock, .length = kBlock, .flags = 0, .blob_id = 7, .block_checksums = {2}};
    ExtentRecord own{
        .physical = blob_phys + 8 * kBlock, .length = kBlock, .flags = 0, .blob_id = 0, .block_checksums = {3}};
    add(100, "one", 2 * kBlock, {{0, blob}});
    add(101, "two", 3 * kBlock, {{0, blob}, {2 * kBlock, own}});
    add(102, "three", kBlock, {{0, slice}});
    ASSERT_TRUE(index.Commit(&batch, true).ok());
  }
  Inspector& in = Open();
  json stat;
  ASSERT_NO_FATAL_FAILURE(ExpectDedupAccounting(in, 6 * kBlock, 3 * kBlock, &stat));
  EXPECT_EQ(stat["logical_bytes"], 6 * kBlock);
  EXPECT_EQ(stat["files"], 3u);

  auto ls = in.Ls({"/"}, false, true);
  ASSERT_TRUE(ls.ok());
  ASSERT_EQ(ls->size(), 3u);  // one, three, two
  EXPECT_EQ((*ls)[0]["extents"][0]["shared"], 3u);
  EXPECT_EQ((*ls)[0]["extents"][0]["blob_id"], 7u);
  EXPECT_EQ((*ls)[1]["extents"][0]["shared"], 3u);
  EXPECT_EQ((*ls)[2]["extents"][0]["shared"], 3u);
  EXPECT_EQ((*ls)[2]["extents"][1]["shared"], 1u);
  EXPECT_NE((*ls)[0]["extents"][0]["checksum"], (*ls)[1]["extents"][0]["checksum"]);

  auto one = in.Du("/one");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ((*one)["physical_bytes"], 2 * kBlock);
}

// Physical bytes are the union of the mapped ranges, however they overlap:
// contained, equal, and overlapping past the end of an earlier range.
TEST_F(InspectorTest, PhysicalBytesAreTheUnionOfRanges) {
  const uint64_t p = Volume::kDataOffset + 32 * kBlock;
  {
    auto volume = Volume::Open(dir_, {});
    ASSERT_TRUE(volume.ok()) << volume.status().ToString();
    Index& index = (*volume)->index();
    Index::Batch batch(index);
    auto add = [&](InodeNumber ino, uint64_t physical, uint64_t length) {
      InodeRecord r;
      r.mode = S_IFREG | 0600;
      r.nlink = 1;
      r.size = length;
      ExtentRecord e;
      e.physical = physical;
      e.length = length;
      batch.Put(Family::kExtent, keys::Extent(ino, 0), e.Encode());
      batch.Put(Family::kInode, keys::Ino(ino), r.Encode());
      batch.Put(Family::kDirent, keys::Dirent(kRootInode, "p" + std::to_string(ino)),
                DirentRecord{ino, S_IFREG}.Encode());
    };
    add(1001, p, 3 * kBlock);               // [0, 3)
    add(1002, p + 2 * kBlock, 2 * kBlock);  // [2, 4): one block past the first
    add(1003, p + 10 * kBlock, kBlock);     // [10, 11)
    add(1004, p + 10 * kBlock, kBlock);     // the same range again
    add(1005, p + kBlock, kBlock);          // inside the first
    ASSERT_TRUE(index.Commit(&batch, true).ok());
  }
  Inspector& in = Open();
  ASSERT_NO_FATAL_FAILURE(ExpectDedupAccounting(in, 8 * kBlock, 5 * kBlock));
  auto one = in.Du("/p1002");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ((*one)["physical_bytes"], 2 * kBlock);
  EXPECT_EQ((*one)["logical_bytes"], 2 * kBlock);
}

TEST_F(InspectorTest, ControlRequests) {
  BuildTree();
  Inspector& in = Open();
  RuntimeStats rt;
  rt.mounted = true;
  auto call = [&](const std::string& request) {
    json reply = json::parse(ControlPlane::AnswerInspection(in, request, rt), nullptr, false);
    EXPECT_FALSE(reply.is_discarded()) << request;
    EXPECT_TRUE(reply.is_object() && reply.contains("ok")) << reply;
    return reply;
  };
  json stat = call(R"({"op":"stat"})");
  EXPECT_EQ(stat["ok"], true);
  EXPECT_EQ(stat["result"]["mounted"], true);
  EXPECT_EQ(stat["result"]["logical_bytes"], tree_.logical());

  json ls = call(R"({"op":"ls","paths":["/d/b.bin","/d/sub"],"long":true,"extents":true})");
  ASSERT_EQ(ls["ok"], true) << ls;
  ASSERT_EQ(ls["result"].size(), 2u);
  EXPECT_EQ(ls["result"][0]["extents"][0]["length"], tree_.b.size());
  EXPECT_EQ(ls["result"][1]["path"], "/d/sub/c");
  EXPECT_TRUE(ls["result"][1].contains("generation"));

  json ls_dir = call(R"({"op":"ls","paths":["/d/sub"],"directory":true})");
  ASSERT_EQ(ls_dir["ok"], true);
  EXPECT_EQ(ls_dir["result"][0]["path"], "/d/sub");
  EXPECT_FALSE(ls_dir["result"][0].contains("extents"));

  json du = call(R"({"op":"du","path":"/d"})");
  ASSERT_EQ(du["ok"], true);
  EXPECT_EQ(du["result"]["files"], 3u);

  struct Bad {
    const char* request;
    int code;
  };
  for (const Bad& bad :
       {Bad{R"({"op":"ls","paths":["/nope"]})", ENOENT}, Bad{R"({"op":"du","path":"/a.txt/x"})", ENOTDIR},
        Bad{R"({"op":"du"})", EINVAL}, Bad{R"({"op":"ls","paths":"/"})", EINVAL},
        Bad{R"({"op":"ls","paths":[1]})", EINVAL}, Bad{R"({"op":"frob"})", EINVAL}, Bad{R"({"nop":1})", EINVAL},
        Bad{"not json", EINVAL}, Bad{"", EINVAL}, Bad{"[1,2]", EINVAL}}) {
    json reply = call(bad.request);
    EXPECT_EQ(reply["ok"], false) << bad.request;
    EXPECT_EQ(reply["errno"], bad.code) << bad.request << " -> " << reply;
    EXPECT_TRUE(reply["error"].is_string() && !reply["error"].get<std::string>().empty());
  }
}

TEST_F(InspectorTest, PrometheusText) {
  BuildTree();
  Inspector& in = Open();
  RuntimeStats rt;
  rt.mounted = true;
  rt.bytes_written_ssd = 12345;
  rt.uptime_seconds = 1.5;
  auto stat = in.Stat(rt);
  ASSERT_TRUE(stat.ok());
  std::string text = PrometheusText(*stat);
  std::istringstream lines(text);
  std::string line;
  std::regex sample(R"(spillfs_[a-z_]+(\{uuid="[0-9a-f-]+"\})? ([-+0-9.eE]+|NaN|[+-]Inf))");
  std::regex help(R"(# HELP spillfs_[a-z_]+ .+)");
  std::regex type(R"(# TYPE spillfs_[a-z_]+ (counter|gauge))");
  int samples = 0;
  while (std::getline(lines, line)) {
    EXPECT_TRUE(std::regex_match(line, sample) || std::regex_match(line, help) || std::regex_match(line, type)) << line;
    if (line[0] != '#') ++samples;
  }
  EXPECT_EQ(text.back(), '\n');
  auto has = [&](const std::string& s) { return text.find(s) != std::string::npos; };
  EXPECT_TRUE(has("\nspillfs_bytes_written_ssd 12345\n"));
  EXPECT_TRUE(has("# TYPE spillfs_bytes_written_ssd counter\n"));
  EXPECT_TRUE(has("# TYPE spillfs_free_bytes gauge\n"));
  EXPECT_TRUE(has("\nspillfs_free_bytes " + std::to_string((*stat)["free_bytes"].get<uint64_t>()) + "\n"));
  EXPECT_TRUE(has("\nspillfs_files 6\n"));
  EXPECT_TRUE(has("\nspillfs_mounted 1\n"));
  EXPECT_TRUE(has("\nspillfs_dedup_ratio 1\n"));
  EXPECT_TRUE(has("\nspillfs_uptime_seconds 1.5\n"));
  EXPECT_TRUE(has("spillfs_info{uuid=\"" + (*stat)["uuid"].get<std::string>() + "\"} 1\n"));
  EXPECT_FALSE(has("spillfs_uuid"));
  // Every numeric and boolean key of the stat object, plus spillfs_info.
  int numeric = 0;
  for (const auto& [key, value] : stat->items()) numeric += value.is_number() || value.is_boolean();
  EXPECT_EQ(samples, numeric + 1);

  // Nested objects flatten; strings and nulls are skipped.
  std::string nested = PrometheusText(json{{"a", {{"b", 2}}}, {"s", "x"}, {"n", nullptr}});
  EXPECT_EQ(nested, "# HELP spillfs_a_b spillfs a_b\n# TYPE spillfs_a_b gauge\nspillfs_a_b 2\n");
}

}  // namespace
}  // namespace spillfs
