// The inspection commands (spillfs stat / ls / du / top) run as a user runs
// them. A fixed tree is written through a real mount; then
//  - on the unmounted volume (index opened read-only by the command): JSON
//    parsed and checked against the tree, extents consistent with the file
//    sizes, golden human output for the deterministic fields, and errors
//    (missing path, not a volume, not mounted) exiting 1 with a message;
//  - on the mounted volume: answers through MOUNTPOINT/.spillfs/control, the
//    Prometheus file MOUNTPOINT/.spillfs/stats, `top`, and the refusal to open
//    a mounted volume's directory directly.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/mounted_volume.h"

namespace spillfs::testing {
namespace {

using nlohmann::json;

constexpr uint64_t kBlock = 4096;
constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kCapacity = 64 * kMiB - kMiB;  // --size 64M minus the superblock area

uint64_t RoundUp(uint64_t v) { return (v + kBlock - 1) / kBlock * kBlock; }

std::string Pattern(size_t n, uint8_t seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + i * 13 + i / 4096);
  return s;
}

void WriteFile(const std::string& path, const std::string& data, off_t offset = 0) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0) << path << ": " << strerror(errno);
  if (!data.empty()) {
    ASSERT_EQ(pwrite(fd, data.data(), data.size(), offset), static_cast<ssize_t>(data.size())) << path;
  }
  ASSERT_EQ(close(fd), 0);
}

std::string Canonical(const std::string& path) { return std::filesystem::canonical(path).string(); }

// The fixed tree (sizes in bytes):
//   /a.txt        10000
//   /d/b.bin      12288
//   /d/link    -> b.bin
//   /d/sub/c      1
//   /empty        0
//   /sparse       4096 at offset 1 MiB (size 1 MiB + 4096)
constexpr uint64_t kA = 10000, kB = 12288, kC = 1, kSparse = kMiB + kBlock;
constexpr uint64_t kLogical = kA + kB + kC + kSparse;
constexpr uint64_t kPhysical = 12288 + 12288 + 4096 + 4096;

class ToolsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MountedVolume::Options options;
    options.size = "64M";
    volume_ = std::make_unique<MountedVolume>(options);
    const MountedVolume& v = *volume_;
    WriteFile(v.Path("a.txt"), Pattern(kA, 1));
    ASSERT_EQ(mkdir(v.Path("d").c_str(), 0755), 0);
    ASSERT_EQ(mkdir(v.Path("d/sub").c_str(), 0755), 0);
    WriteFile(v.Path("d/b.bin"), Pattern(kB, 2));
    WriteFile(v.Path("d/sub/c"), "c");
    ASSERT_EQ(symlink("b.bin", v.Path("d/link").c_str()), 0);
    WriteFile(v.Path("empty"), "");
    WriteFile(v.Path("sparse"), Pattern(kBlock, 3), static_cast<off_t>(kMiB));
    // The files are new and small: closed, they wait in the RAM tier
    // (docs/design.md, "Crash order"). An fsync of any of them settles all,
    // so that the volume's records hold them as the tests expect.
    int fd = open(v.Path("empty").c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(fsync(fd), 0);
    close(fd);
    vol_ = Canonical(v.volume());
    mnt_ = Canonical(v.mountpoint());
  }

  void Unmount() {
    std::string error;
    ASSERT_TRUE(volume_->Unmount(&error)) << error;
  }

  // Runs spillfs; expects exit status `rc`; returns stdout+stderr.
  std::string Run(const std::string& args, int rc = 0) {
    std::string output;
    int got = RunSpillfs(args, &output);
    EXPECT_EQ(got, rc) << "spillfs " << args << "\n" << output;
    return output;
  }

  json RunJson(const std::string& args) {
    std::string output = Run(args);
    json parsed = json::parse(output, nullptr, false);
    EXPECT_FALSE(parsed.is_discarded()) << "spillfs " << args << " printed no JSON:\n" << output;
    return parsed.is_discarded() ? json() : parsed;
  }

  std::unique_ptr<MountedVolume> volume_;
  std::string vol_;
  std::string mnt_;
};

// The stat of the test tree, of VOLUME, mounted or not.
void ExpectStatOfTree(const json& s, const std::string& volume, bool mounted) {
  ASSERT_TRUE(s.is_object()) << s;
  for (const char* key : {"capacity_bytes", "used_bytes", "free_bytes", "logical_bytes", "physical_bytes",
                          "dedup_ratio", "files", "directories", "ram_tier_bytes", "bytes_written_ssd",
                          "bytes_read_ssd", "bytes_cancelled", "checksum_errors", "uuid", "mounted", "volume"}) {
    ASSERT_TRUE(s.contains(key)) << key;
  }
  EXPECT_EQ(s.at("mounted"), mounted);
  EXPECT_EQ(s.at("volume"), volume);
  EXPECT_EQ(s.at("capacity_bytes"), kCapacity);
  EXPECT_EQ(s.at("used_bytes").get<uint64_t>() + s.at("free_bytes").get<uint64_t>(), kCapacity);
  EXPECT_EQ(s.at("logical_bytes"), kLogical);
  EXPECT_EQ(s.at("physical_bytes"), kPhysical);
  EXPECT_DOUBLE_EQ(s.at("dedup_ratio").get<double>(), 1.0);
  EXPECT_EQ(s.at("files"), 5u);
  EXPECT_EQ(s.at("directories"), 3u);
  EXPECT_TRUE(std::regex_match(s.at("uuid").get<std::string>(),
                               std::regex("[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")))
      << s.at("uuid");
}

// Extents tile the written part of each file: in order, without overlap,
// block aligned, their lengths adding up to the file's blocks.
void ExpectExtentsMatchSizes(const json& entries) {
  ASSERT_TRUE(entries.is_array());
  for (const json& e : entries) {
    ASSERT_TRUE(e.contains("extents")) << e;
    const json& extents = e.at("extents");
    uint64_t size = e.at("size");
    std::string name = e.at("name");
    if (e.at("type") != "file") {
      EXPECT_TRUE(extents.empty()) << name;
      continue;
    }
    uint64_t start = name == "sparse" ? kMiB : 0;
    uint64_t at = start;
    for (const json& x : extents) {
      EXPECT_EQ(x.at("file_offset"), at) << name;
      EXPECT_EQ(x.at("physical_offset").get<uint64_t>() % kBlock, 0u) << name;
      EXPECT_GT(x.at("length").get<uint64_t>(), 0u) << name;
      EXPECT_EQ(x.at("shared"), 1u) << name;
      EXPECT_EQ(x.at("unwritten"), false) << name;
      EXPECT_TRUE(x.at("checksum").is_string()) << name;
      at += x.at("length").get<uint64_t>();
    }
    EXPECT_EQ(at, RoundUp(size)) << name;
    EXPECT_EQ(at - start, e.at("allocated_bytes").get<uint64_t>()) << name;
  }
}

// ---- unmounted volume ----

TEST_F(ToolsTest, StatJsonOfUnmountedVolume) {
  Unmount();
  json s = RunJson("stat --json " + vol_);
  ExpectStatOfTree(s, vol_, false);
  EXPECT_EQ(s["used_bytes"], kPhysical);
  EXPECT_TRUE(s["mountpoint"].is_null());
  EXPECT_EQ(s["bytes_written_ssd"], 0u);
  // Twice in a row (nothing left locked or changed by the first).
  EXPECT_EQ(RunJson("stat --json " + vol_ + "/"), s);
}

TEST_F(ToolsTest, LsExtentsJsonOfUnmountedVolume) {
  Unmount();
  json root = RunJson("ls --extents --json --volume " + vol_ + " /");
  ASSERT_EQ(root.size(), 4u) << root;
  std::vector<std::string> paths;
  for (const json& e : root) paths.push_back(e["path"]);
  EXPECT_EQ(paths, (std::vector<std::string>{"/a.txt", "/d", "/empty", "/sparse"}));
  ExpectExtentsMatchSizes(root);
  EXPECT_EQ(root[0]["size"], kA);
  EXPECT_EQ(root[3]["size"], kSparse);

  json files = RunJson("ls --extents --json --volume " + vol_ + " d/b.bin /d/sub/ /d/link");
  ASSERT_EQ(files.size(), 3u) << files;
  EXPECT_EQ(files[0]["path"], "d/b.bin");
  EXPECT_EQ(files[0]["volume_path"], "/d/b.bin");
  EXPECT_EQ(files[0]["size"], kB);
  EXPECT_EQ(files[1]["path"], "/d/sub/c");
  EXPECT_EQ(files[1]["size"], kC);
  EXPECT_EQ(files[2]["type"], "symlink");
  EXPECT_EQ(files[2]["target"], "b.bin");
  ExpectExtentsMatchSizes(files);
  // Files never share physical space without dedup.
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const json* list : {&root, &files}) {
    for (const json& e : *list) {
      for (const json& x : e["extents"]) ranges.emplace_back(x["physical_offset"], x["length"]);
    }
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    EXPECT_LE(ranges[i - 1].first + ranges[i - 1].second, ranges[i].first);
  }

  // The volume directory itself stands for its root; paths keep the prefix.
  json by_dir = RunJson("ls --json " + vol_);
  ASSERT_EQ(by_dir.size(), 4u);
  EXPECT_EQ(by_dir[0]["path"], vol_ + "/a.txt");
  EXPECT_EQ(by_dir[0]["volume_path"], "/a.txt");
  EXPECT_FALSE(by_dir[0].contains("extents"));
  json dir_itself = RunJson("ls -d --json --volume " + vol_ + " /d");
  ASSERT_EQ(dir_itself.size(), 1u);
  EXPECT_EQ(dir_itself[0]["type"], "dir");
  EXPECT_EQ(dir_itself[0]["mode"], S_IFDIR | 0755);
}

TEST_F(ToolsTest, DuOfUnmountedVolume) {
  Unmount();
  json all = RunJson("du --json " + vol_);
  EXPECT_EQ(all["logical_bytes"], kLogical);
  EXPECT_EQ(all["physical_bytes"], kPhysical);
  EXPECT_EQ(all["files"], 5u);
  EXPECT_EQ(all["directories"], 3u);
  json d = RunJson("du --json --volume " + vol_ + " /d");
  EXPECT_EQ(d["path"], "/d");
  EXPECT_EQ(d["logical_bytes"], kB + kC);
  EXPECT_EQ(d["physical_bytes"], RoundUp(kB) + RoundUp(kC));
  EXPECT_EQ(d["files"], 2u);
  EXPECT_EQ(d["directories"], 2u);
  EXPECT_EQ(d["symlinks"], 1u);
  json sparse = RunJson("du --json --volume " + vol_ + " sparse");
  EXPECT_EQ(sparse["logical_bytes"], kSparse);
  EXPECT_EQ(sparse["physical_bytes"], kBlock);
}

// Lines of `text` without those matching `skip`.
std::string Without(const std::string& text, const std::regex& skip) {
  std::istringstream in(text);
  std::string line, out;
  while (std::getline(in, line)) {
    if (!std::regex_search(line, skip)) out += line + "\n";
  }
  return out;
}

TEST_F(ToolsTest, GoldenHumanOutput) {
  Unmount();
  EXPECT_EQ(Without(Run("stat " + vol_), std::regex("^(volume|uuid) ")),
            "mounted         no\n"
            "capacity        63.0 MiB\n"
            "used            32.0 KiB (0.0%)\n"
            "free            63.0 MiB\n"
            "files           5\n"
            "directories     3\n"
            "logical         1.0 MiB\n"
            "physical        32.0 KiB\n"
            "dedup ratio     1.00\n"
            "ram tier        0 B\n"
            "ssd written     0 B (0 B by the direct path)\n"
            "deduplicated    0 B\n"
            "ssd read        0 B\n"
            "data syncs      0\n"
            "cancelled       0 B\n"
            "checksum errors 0\n");
  EXPECT_EQ(Run("stat " + vol_).substr(0, 16 + vol_.size() + 1), "volume          " + vol_ + "\n");

  EXPECT_EQ(Run("ls --volume " + vol_ + " / /d"), "/a.txt\n/d\n/empty\n/sparse\n/d/b.bin\n/d/link -> b.bin\n/d/sub\n");

  EXPECT_EQ(Run("du --volume " + vol_ + " /d"),
            "path            /d\n"
            "logical         12.0 KiB\n"
            "physical        16.0 KiB\n"
            "dedup ratio     1.00\n"
            "files           2\n"
            "directories     2\n"
            "other           1\n");

  // Long format: mode, links, owner and human size are fixed; the time is not.
  std::string long_ls = Run("ls -l --volume " + vol_ + " /d");
  std::regex time(R"(\d{4}-\d\d-\d\d \d\d:\d\d )");
  EXPECT_EQ(std::regex_replace(long_ls, time, "TIME "),
            "-rw-r--r--   1     0     0   12.0 KiB TIME /d/b.bin\n"
            "lrwxrwxrwx   1     0     0        5 B TIME /d/link -> b.bin\n"
            "drwxr-xr-x   2     0     0        0 B TIME /d/sub\n")
      << long_ls;

  // Extents: one line per extent under a header; physical offsets vary with
  // the allocator, so only the other columns are fixed.
  std::string extents = Run("ls --extents --volume " + vol_ + " /d/sub/c");
  std::regex line(R"(/d/sub/c\n +FILE_OFFSET +PHYSICAL +LENGTH CHECKSUM +SHARED\n +0 +\d+ +4\.0 KiB [0-9a-f]{16} 1\n)");
  EXPECT_TRUE(std::regex_match(extents, line)) << extents;
}

TEST_F(ToolsTest, ErrorsExitOne) {
  Unmount();
  std::string out = Run("stat " + vol_ + "/no-such-dir", 1);
  EXPECT_NE(out.find("spillfs stat: " + vol_ + "/no-such-dir: No such file or directory"), std::string::npos) << out;
  out = Run("stat /proc", 1);
  EXPECT_NE(out.find("neither inside a mounted spillfs nor a spillfs volume"), std::string::npos) << out;
  out = Run("stat " + vol_ + "/index", 1);  // inside a volume, but not a volume
  EXPECT_NE(out.find("neither inside a mounted spillfs nor a spillfs volume"), std::string::npos) << out;
  out = Run("ls --volume " + vol_ + " /nope", 1);
  EXPECT_NE(out.find("spillfs ls: /nope: No such file or directory (in volume " + vol_ + ")"), std::string::npos)
      << out;
  out = Run("ls --volume " + vol_ + " /a.txt/x", 1);
  EXPECT_NE(out.find("/a.txt/x: Not a directory"), std::string::npos) << out;
  out = Run("du --volume " + mnt_ + " /", 1);  // an empty directory
  EXPECT_NE(out.find("is not a spillfs volume"), std::string::npos) << out;
  out = Run("du --volume " + vol_ + " /missing", 1);
  EXPECT_NE(out.find("spillfs du: /missing: No such file or directory"), std::string::npos) << out;
  out = Run("top " + vol_ + " --count 1", 1);
  EXPECT_NE(out.find("is not mounted"), std::string::npos) << out;
  // One bad path among good ones: the good ones are still listed.
  out = Run("ls --volume " + vol_ + " /nope /empty", 1);
  EXPECT_NE(out.find("/empty\n"), std::string::npos) << out;
  // Bad mount options: each is refused, naming the option and the bound.
  ExpectMountsRefused(
      vol_, mnt_,
      {
          {"--read-ahead 1T", "spillfs mount: --read-ahead: 1T is more than the most, 256.0 MiB"},
          {"--read-ahead lots", "spillfs mount: --read-ahead: "},
          {"--ram-tier-warm lots", "spillfs mount: --ram-tier-warm: "},
          {"--flush-batch 4K", "spillfs mount: --flush-batch: 4K is less than the least, 256.0 KiB"},
          {"--flush-batch 0", "spillfs mount: --flush-batch: 0 is less than the least, 256.0 KiB"},
          {"--flush-batch 2G", "spillfs mount: --flush-batch: 2G is more than the most, 1.0 GiB"},
          {"--bytes-per-sync -1", "spillfs mount: --bytes-per-sync: "},
          {"--bytes-per-sync 4K", "spillfs mount: --bytes-per-sync: 4K is less than the least, 1.0 MiB"},
      });
  // Nothing was left locked: the volume still mounts.
  std::string error;
  EXPECT_TRUE(volume_->Mount(&error)) << error;
}

// A plain umount returns before the daemon lets go of the volume: a mount
// started then waits for the lock instead of failing.
TEST_F(ToolsTest, MountWaitsForAProcessThatHoldsTheVolume) {
  Unmount();
  const std::string lock_path = vol_ + "/lock";
  int fd = open(lock_path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0) << strerror(errno);
  struct CloseAtEnd {
    int* fd;
    ~CloseAtEnd() {
      if (*fd >= 0) close(*fd);
    }
  } close_at_end{&fd};
  ASSERT_EQ(flock(fd, LOCK_EX | LOCK_NB), 0);
  const std::string pid = std::to_string(getpid());
  ASSERT_EQ(ftruncate(fd, 0), 0);
  ASSERT_EQ(pwrite(fd, pid.data(), pid.size(), 0), static_cast<ssize_t>(pid.size()));
  // Held throughout: fails after the wait, naming the holder.
  std::string out = Run("mount " + vol_ + " " + mnt_ + " --lock-wait 1", 1);
  EXPECT_NE(out.find("volume " + vol_ + " is in use by process " + pid + ", still after 1 s"), std::string::npos)
      << out;
  // Other mistakes are reported at once, without the wait.
  out = Run("mount " + vol_ + " " + mnt_ + " --read-ahead lots", 1);
  EXPECT_EQ(out.find("waiting"), std::string::npos) << out;
  // Let go once the mount says it waits: it mounts.
  const std::string command = std::string(SpillfsBinary()) + " mount " + vol_ + " " + mnt_ + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string text;
  char line[4096];
  while (fgets(line, sizeof(line), pipe) != nullptr) {
    text += line;
    if (fd >= 0 && text.find("waiting up to 30 s for it to let go") != std::string::npos) {
      close(fd);
      fd = -1;
    }
  }
  const int status = pclose(pipe);
  EXPECT_EQ(fd, -1) << "the mount never said that it waits:\n" << text;
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << text;
  EXPECT_NE(text.find("mounted on " + mnt_), std::string::npos) << text;
  {
    std::ifstream a(mnt_ + "/a.txt", std::ios::binary);
    EXPECT_EQ(std::string(std::istreambuf_iterator<char>(a), {}), Pattern(kA, 1));
  }
  // The lock the mount waited for went to the daemon it forked (no gap in
  // which another process could take the volume), which names itself in it.
  const size_t at = text.find("(daemon pid ");
  ASSERT_NE(at, std::string::npos) << text;
  const std::string daemon_pid = std::to_string(std::stoul(text.substr(at + 12)));
  std::ifstream holder(lock_path);
  std::string named;
  std::getline(holder, named);
  EXPECT_EQ(named, daemon_pid);
  Run("umount " + mnt_, 0);
}

// ---- mounted volume (through MOUNTPOINT/.spillfs/control) ----

TEST_F(ToolsTest, MountedVolumeDirectoryIsRefused) {
  for (const std::string cmd : {"stat ", "du ", "ls "}) {
    std::string out = Run(cmd + vol_, 1);
    EXPECT_NE(out.find("mounted at " + mnt_), std::string::npos) << out;
    EXPECT_NE(out.find("use the mount point"), std::string::npos) << out;
  }
  std::string out = Run("ls --volume " + vol_ + " /", 1);
  EXPECT_NE(out.find("mounted at " + mnt_), std::string::npos) << out;
}

TEST_F(ToolsTest, StatThroughTheMount) {
  sync();
  json s = RunJson("stat --json " + mnt_);
  ExpectStatOfTree(s, vol_, true);
  EXPECT_EQ(s["mountpoint"], mnt_);
  // Any path inside the mount names the mount.
  json inner = RunJson("stat --json " + mnt_ + "/d/sub");
  EXPECT_EQ(inner["uuid"], s["uuid"]);
  std::string human = Run("stat " + mnt_);
  EXPECT_NE(human.find("mounted         at " + mnt_ + "\n"), std::string::npos) << human;
  EXPECT_NE(human.find("files           5\n"), std::string::npos) << human;
}

TEST_F(ToolsTest, LsAndDuThroughTheMount) {
  sync();
  json d = RunJson("ls --extents --json " + mnt_ + "/d");
  ASSERT_EQ(d.size(), 3u) << d;
  EXPECT_EQ(d[0]["path"], mnt_ + "/d/b.bin");
  EXPECT_EQ(d[0]["volume_path"], "/d/b.bin");
  EXPECT_EQ(d[0]["size"], kB);
  EXPECT_EQ(d[1]["path"], mnt_ + "/d/link");
  EXPECT_EQ(d[1]["type"], "symlink");
  EXPECT_EQ(d[2]["path"], mnt_ + "/d/sub");
  ExpectExtentsMatchSizes(d);
  // A symlink given on the command line is listed, not followed.
  json link = RunJson("ls --json " + mnt_ + "/d/link");
  ASSERT_EQ(link.size(), 1u);
  EXPECT_EQ(link[0]["type"], "symlink");
  EXPECT_EQ(link[0]["path"], mnt_ + "/d/link");

  json du = RunJson("du --json " + mnt_);
  EXPECT_EQ(du["logical_bytes"], kLogical);
  EXPECT_EQ(du["physical_bytes"], kPhysical);
  EXPECT_EQ(du["files"], 5u);
  json sub = RunJson("du --json " + mnt_ + "/d/sub");
  EXPECT_EQ(sub["logical_bytes"], kC);
  EXPECT_EQ(sub["directories"], 1u);

  std::string out = Run("ls " + mnt_ + "/missing", 1);
  EXPECT_NE(out.find("No such file or directory"), std::string::npos) << out;
}

TEST_F(ToolsTest, PrometheusStatsFile) {
  std::ifstream in(mnt_ + "/.spillfs/stats");
  ASSERT_TRUE(in.good()) << mnt_ << "/.spillfs/stats cannot be opened";
  std::stringstream text;
  text << in.rdbuf();
  std::string stats = text.str();
  EXPECT_NE(
      stats.find("# TYPE spillfs_capacity_bytes gauge\nspillfs_capacity_bytes " + std::to_string(kCapacity) + "\n"),
      std::string::npos)
      << stats;
  EXPECT_NE(stats.find("\nspillfs_files 5\n"), std::string::npos) << stats;
  EXPECT_NE(stats.find("\nspillfs_mounted 1\n"), std::string::npos) << stats;
  EXPECT_NE(stats.find("# TYPE spillfs_bytes_written_ssd counter\n"), std::string::npos) << stats;
}

TEST_F(ToolsTest, TopPrintsOneLinePerRefresh) {
  std::string out = Run("top " + mnt_ + " --interval 0.2 --count 3");
  std::istringstream lines(out);
  std::string line;
  std::vector<std::string> all;
  while (std::getline(lines, line)) all.push_back(line);
  ASSERT_EQ(all.size(), 4u) << out;
  EXPECT_TRUE(all[0].starts_with("TIME ")) << all[0];
  EXPECT_NE(all[0].find("IOPS"), std::string::npos);
  EXPECT_EQ(out.find('\x1b'), std::string::npos) << "ANSI codes on a pipe";
  for (size_t i = 1; i < all.size(); ++i) {
    EXPECT_TRUE(std::regex_search(all[i], std::regex(R"(^\d\d:\d\d:\d\d +\S)"))) << all[i];
  }
  std::string bad = Run("top " + mnt_ + " --interval 0", 1);
  EXPECT_NE(bad.find("--interval"), std::string::npos) << bad;
}

}  // namespace
}  // namespace spillfs::testing
