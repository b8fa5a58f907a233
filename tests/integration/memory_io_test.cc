// Memory I/O through the control file (mem_write, mem_read; docs/design.md,
// "Memory I/O") on a mounted volume, by callers that are not root: each runs
// in a forked child that drops to uid/gid 65534 before it opens anything on
// the mount (as permissions_test does), builds its requests over
// control::Channel and hands what it saw back to the parent as JSON, where
// it is checked. The volume is mounted with -o allow_other, without which
// FUSE lets no other user in at all.
//
// Besides the round trip (with dedup), every check the daemon makes of a
// caller's descriptors and pieces is shown refusing, with its errno; and
// what such a caller must never reach (a file it cannot open, the flags of
// one descriptor with the inode of another) is shown out of reach.
#include <fcntl.h>
#include <grp.h>
#include <libgen.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "spillfs/common/control_protocol.h"
#include "spillfs/control/caller_files.h"
#include "support/errno_names.h"
#include "support/file_io.h"
#include "support/mounted_volume.h"
#include "support/random_bytes.h"
#include "support/shared_volume.h"
#include "support/temp_dir.h"

namespace spillfs::testing {
namespace {

using nlohmann::json;

constexpr uid_t kNobody = 65534;
constexpr uint64_t kUnit = 256 << 10;  // the dedup unit
constexpr uint64_t kBlock = 4096;

// Runs `fn` in a child process as uid and gid 65534 with no supplementary
// groups (the saved uid `saved_uid`: 65534 unless a test means to regain
// root), and returns the JSON it returned, or {"child_failed": why}.
json AsNobody(const std::function<json()>& fn, uid_t saved_uid = kNobody) {
  int fds[2];
  if (pipe(fds) != 0) return {{"child_failed", "pipe"}};
  const pid_t pid = fork();
  if (pid < 0) return {{"child_failed", "fork"}};
  if (pid == 0) {
    close(fds[0]);
    json result;
    if (setgroups(0, nullptr) == 0 && setresgid(kNobody, kNobody, kNobody) == 0 &&
        setresuid(kNobody, kNobody, saved_uid) == 0) {
      try {
        result = fn();
      } catch (const std::exception& e) {
        result = {{"child_failed", e.what()}};
      }
    } else {
      result = {{"child_failed", "cannot drop to uid 65534"}};
    }
    const std::string text = result.dump();
    for (size_t done = 0; done < text.size();) {
      const ssize_t n = write(fds[1], text.data() + done, text.size() - done);
      if (n <= 0 && errno != EINTR) break;
      if (n > 0) done += static_cast<size_t>(n);
    }
    _exit(0);
  }
  close(fds[1]);
  std::string text;
  char buffer[65536];
  ssize_t n;
  while ((n = read(fds[0], buffer, sizeof buffer)) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) text.append(buffer, static_cast<size_t>(n));
  }
  close(fds[0]);
  waitpid(pid, nullptr, 0);
  json result = json::parse(text, nullptr, false);
  if (result.is_discarded()) return {{"child_failed", "no result (the child died?)"}};
  return result;
}

// One request's outcome as JSON: {"ok":true,"result":...} or
// {"ok":false,"errno":N,"error":"..."}.
json Ask(control::Channel& channel, const json& request) {
  auto reply = channel.Request(request);
  if (reply.ok()) return {{"ok", true}, {"result", *reply}};
  return {{"ok", false}, {"errno", reply.status().code()}, {"error", reply.status().message()}};
}

// The errno of a refusal (0 for success), for EXPECT_EQ.
int ErrnoOf(const json& outcome) { return outcome.value("ok", false) ? 0 : outcome.value("errno", -1); }

#define EXPECT_REFUSED(outcome, code) \
  EXPECT_EQ(ErrnoOf(outcome), (code)) << #outcome << " = " << (outcome).dump() << ", expected " << ErrnoName(code)

// A memfd of `size` bytes holding `bytes` at offset 0, with `seals` added
// (F_SEAL_SHRINK, the daemon's condition, unless told otherwise), mapped
// read-write unless sealed against writing. For the child.
struct Memfd {
  int fd = -1;
  char* data = nullptr;
  size_t size = 0;
};
Memfd MakeMemfd(size_t size, const std::string& bytes = "", unsigned seals = F_SEAL_SHRINK) {
  Memfd m;
  m.size = size;
  m.fd = memfd_create("spillfs-test", MFD_ALLOW_SEALING | MFD_CLOEXEC);
  if (m.fd < 0 || ftruncate(m.fd, static_cast<off_t>(size)) != 0) throw std::runtime_error("memfd_create");
  if (!bytes.empty() && !WriteAll(m.fd, bytes.data(), bytes.size(), 0)) throw std::runtime_error("memfd write");
  if (seals != 0 && fcntl(m.fd, F_ADD_SEALS, seals) != 0) throw std::runtime_error("F_ADD_SEALS");
  const bool writable = !(seals & F_SEAL_WRITE);
  void* data = mmap(nullptr, size, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, m.fd, 0);
  if (data == MAP_FAILED) throw std::runtime_error("mmap");
  m.data = static_cast<char*>(data);
  return m;
}

// Pieces as the request carries them: memory offset, file offset, length, ...
json Pieces(std::initializer_list<std::array<uint64_t, 3>> pieces) {
  json flat = json::array();
  for (const auto& p : pieces) {
    for (uint64_t v : p) flat.push_back(v);
  }
  return flat;
}

json MemWrite(int fd, int memfd, const json& pieces, uint64_t size, bool dedup) {
  return {{"op", "mem_write"}, {"fd", fd}, {"memfd", memfd}, {"pieces", pieces}, {"size", size}, {"dedup", dedup}};
}
json MemRead(int fd, int memfd, const json& pieces) {
  return {{"op", "mem_read"}, {"fd", fd}, {"memfd", memfd}, {"pieces", pieces}};
}

// Lets other users reach the mount point: mkdtemp makes the directory
// above it 0700.
void MakeTraversable(const std::string& mountpoint) {
  std::string copy = mountpoint;
  ASSERT_EQ(chmod(dirname(copy.data()), 0755), 0) << ErrnoName(errno);
  ASSERT_EQ(chmod(mountpoint.c_str(), 0755), 0) << ErrnoName(errno);
}

class MemoryIoTest : public SharedVolumeTest {
 protected:
  static void SetUpTestSuite() {
    MountedVolume::Options options;
    options.mount_options = "allow_other";
    MountSharedVolume(options);
  }

  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "mounting a volume and dropping to uid 65534 need root";
    ASSERT_NO_FATAL_FAILURE(SharedVolumeTest::SetUp());
    ASSERT_NO_FATAL_FAILURE(MakeTraversable(volume_->mountpoint()));
    ASSERT_EQ(chmod(dir_.c_str(), 0777), 0) << ErrnoName(errno);
  }

  std::string control_path() const { return control::ControlPath(volume_->mountpoint()); }

  // The child's channel, opened after it dropped to 65534.
  control::Channel OpenChannel() const {
    auto channel = control::Channel::Open(control_path());
    if (!channel.ok()) throw std::runtime_error("open control: " + channel.status().ToString());
    return std::move(channel).value();
  }

  json StatAsRoot() {
    auto stat = control::Request(volume_->mountpoint(), {{"op", "stat"}});
    EXPECT_TRUE(stat.ok()) << stat.status().ToString();
    return stat.ok() ? *stat : json::object();
  }
};

int OpenOrThrow(const std::string& path, int flags, mode_t mode = 0644) {
  const int fd = open(path.c_str(), flags | O_CLOEXEC, mode);
  if (fd < 0) throw std::runtime_error("open " + path + ": " + std::strerror(errno));
  return fd;
}

// ---- what a caller that is not root may ask ----

TEST_F(MemoryIoTest, AnyoneOpensTheControlFileAndRootsOpsAreRefused) {
  struct stat st {};
  ASSERT_EQ(stat(control_path().c_str(), &st), 0) << ErrnoName(errno);
  EXPECT_EQ(st.st_mode, S_IFREG | 0666);
  WriteFile(P("f"), std::string(8192, 'f'));
  const std::string rel = "/" + dir_.substr(volume_->mountpoint().size() + 1) + "/f";
  json out = AsNobody([&] {
    control::Channel channel = OpenChannel();
    return json{{"volume", Ask(channel, {{"op", "volume"}})},
                {"stat", Ask(channel, {{"op", "stat"}})},
                {"layout", Ask(channel, {{"op", "layout"}, {"path", rel}})},
                {"reserve", Ask(channel, {{"op", "reserve"}, {"length", 4096}})},
                {"commit", Ask(channel, {{"op", "commit"}, {"path", rel}, {"file_offset", 0}, {"length", 0}})},
                {"dedup", Ask(channel, {{"op", "dedup"}, {"path", rel}, {"file_offset", 0}, {"hashes", {1, 2}}})},
                {"ls", Ask(channel, {{"op", "ls"}, {"paths", {rel}}})},
                {"unknown", Ask(channel, {{"op", "frob"}})}};
  });
  ASSERT_FALSE(out.contains("child_failed")) << out;
  ASSERT_EQ(ErrnoOf(out["volume"]), 0) << out["volume"];
  EXPECT_EQ(out["volume"]["result"]["memory_io"], true);
  EXPECT_EQ(ErrnoOf(out["stat"]), 0) << out["stat"];
  for (const char* op : {"layout", "reserve", "commit", "dedup", "ls", "unknown"}) {
    EXPECT_REFUSED(out[op], EACCES);
  }
  EXPECT_EQ(out["layout"]["error"], "op 'layout' is root's: it hands out the data area");
}

// ---- the round trip ----

TEST_F(MemoryIoTest, RoundTripWithDedup) {
  // Four whole units and two blocks more, of which the file keeps 5000
  // bytes: pieces of two units and of two units and two blocks.
  const uint64_t size = 4 * kUnit + 5000;
  const uint64_t span = 4 * kUnit + 2 * kBlock;
  std::string bytes = RandomBytes(span, 4101);
  std::fill(bytes.begin() + static_cast<long>(size), bytes.end(), '\0');  // the file holds zeros past its end
  const json pieces = Pieces({{0, 0, 2 * kUnit}, {2 * kUnit, 2 * kUnit, 2 * kUnit + 2 * kBlock}});
  const uint64_t deduplicated_before = StatAsRoot().value("bytes_deduplicated", uint64_t{0});
  json out = AsNobody([&] {
    control::Channel channel = OpenChannel();
    Memfd source = MakeMemfd(span, bytes);
    Memfd back = MakeMemfd(span + 3 * kBlock);
    const int a = OpenOrThrow(P("a"), O_CREAT | O_RDWR);
    const int b = OpenOrThrow(P("b"), O_CREAT | O_WRONLY);
    json result;
    result["write_a"] = Ask(channel, MemWrite(a, source.fd, pieces, size, true));
    // Read back whole, past the end (zeros), and at offsets and lengths of no alignment.
    std::memset(back.data, 0x5a, back.size);
    result["read_a"] = Ask(channel, MemRead(a, back.fd, Pieces({{0, 0, span + 3 * kBlock}})));
    result["a_equal"] = std::memcmp(back.data, bytes.data(), span) == 0;
    result["a_zeros_past_end"] = std::all_of(back.data + span, back.data + back.size, [](char c) { return c == 0; });
    std::memset(back.data, 0x5a, back.size);
    result["read_odd"] = Ask(channel, MemRead(a, back.fd, Pieces({{1, 12345, 777}, {5000, size - 10, 100}})));
    result["odd_equal"] = std::memcmp(back.data + 1, bytes.data() + 12345, 777) == 0 &&
                          std::memcmp(back.data + 5000, bytes.data() + size - 10, 10) == 0 &&
                          std::all_of(back.data + 5010, back.data + 5100, [](char c) { return c == 0; });
    // The same bytes again, into another file: its whole units are mapped.
    result["write_b"] = Ask(channel, MemWrite(b, source.fd, pieces, size, true));
    // And without dedup: everything written.
    const int c = OpenOrThrow(P("c"), O_CREAT | O_RDWR);
    result["write_c"] = Ask(channel, MemWrite(c, source.fd, pieces, size, false));
    return result;
  });
  ASSERT_FALSE(out.contains("child_failed")) << out;
  ASSERT_EQ(ErrnoOf(out["write_a"]), 0) << out["write_a"];
  EXPECT_EQ(out["write_a"]["result"]["written_bytes"], span);
  EXPECT_EQ(out["write_a"]["result"]["mapped_bytes"], 0u);
  ASSERT_EQ(ErrnoOf(out["read_a"]), 0) << out["read_a"];
  EXPECT_EQ(out["read_a"]["result"]["size"], size);
  EXPECT_EQ(out["read_a"]["result"]["ino"], out["write_a"]["result"]["ino"]);
  EXPECT_EQ(out["a_equal"], true);
  EXPECT_EQ(out["a_zeros_past_end"], true);
  ASSERT_EQ(ErrnoOf(out["read_odd"]), 0) << out["read_odd"];
  EXPECT_EQ(out["odd_equal"], true);
  ASSERT_EQ(ErrnoOf(out["write_b"]), 0) << out["write_b"];
  EXPECT_EQ(out["write_b"]["result"]["mapped_bytes"], 4 * kUnit);
  EXPECT_EQ(out["write_b"]["result"]["written_bytes"], 2 * kBlock);  // the tail only
  ASSERT_EQ(ErrnoOf(out["write_c"]), 0) << out["write_c"];
  EXPECT_EQ(out["write_c"]["result"]["written_bytes"], span);
  EXPECT_EQ(out["write_c"]["result"]["mapped_bytes"], 0u);
  // Through the mount: what was written, at its size, to the byte.
  const std::string want = bytes.substr(0, size);
  for (const char* name : {"a", "b", "c"}) EXPECT_TRUE(ReadFile(P(name)) == want) << name;
  EXPECT_EQ(StatAsRoot().value("bytes_deduplicated", uint64_t{0}) - deduplicated_before, 4 * kUnit);
}

// Requests of one file on several handles at once (as reserve and commit may run).
TEST_F(MemoryIoTest, WritesOfOneFileOnSeveralHandlesAtOnce) {
  constexpr int kWriters = 4;
  constexpr uint64_t kEach = 4 * kUnit;
  const std::string bytes = RandomBytes(kWriters * kEach, 4102);
  json out = AsNobody([&] {
    const int fd = OpenOrThrow(P("shared"), O_CREAT | O_RDWR);
    Memfd source = MakeMemfd(bytes.size(), bytes);
    std::vector<json> outcomes(kWriters);
    std::vector<std::thread> writers;
    for (int w = 0; w < kWriters; ++w) {
      writers.emplace_back([&, w] {
        control::Channel channel = OpenChannel();
        const uint64_t at = w * kEach;
        outcomes[w] = Ask(channel, MemWrite(fd, source.fd, Pieces({{at, at, kEach}}), at + kEach, w % 2 == 0));
      });
    }
    for (std::thread& t : writers) t.join();
    return json(outcomes);
  });
  ASSERT_FALSE(out.is_object() && out.contains("child_failed")) << out;
  for (const json& outcome : out) EXPECT_EQ(ErrnoOf(outcome), 0) << outcome;
  EXPECT_TRUE(ReadFile(P("shared")) == bytes);
}

// ---- the checks of the caller's descriptors ----

TEST_F(MemoryIoTest, DescriptorsAreChecked) {
  const std::string data = RandomBytes(2 * kUnit, 4103);
  json out = AsNobody([&] {
    control::Channel channel = OpenChannel();
    Memfd memory = MakeMemfd(2 * kUnit, data);
    const json one = Pieces({{0, 0, kBlock}});
    const int rdwr = OpenOrThrow(P("target"), O_CREAT | O_RDWR);
    const int rdonly = OpenOrThrow(P("target"), O_RDONLY);
    const int wronly = OpenOrThrow(P("target"), O_WRONLY);
    const int append = OpenOrThrow(P("target"), O_WRONLY | O_APPEND);
    const int path_only = OpenOrThrow(P("target"), O_PATH);
    const int directory = OpenOrThrow(dir_, O_RDONLY | O_DIRECTORY);
    const int control_fd = OpenOrThrow(control_path(), O_RDWR);
    char tmp_path[] = "/tmp/spillfs-memio-XXXXXX";
    const int elsewhere = mkstemp(tmp_path);
    unlink(tmp_path);
    const int dev_null = OpenOrThrow("/dev/null", O_WRONLY);
    // Memfds that are not what the daemon needs.
    Memfd unsealed = MakeMemfd(kUnit, data.substr(0, kUnit), 0);
    Memfd write_sealed = MakeMemfd(kUnit, data.substr(0, kUnit), F_SEAL_SHRINK | F_SEAL_WRITE);
    const int memfd_rdonly = OpenOrThrow("/proc/self/fd/" + std::to_string(memory.fd), O_RDONLY);
    json r;
    r["ok_write"] = Ask(channel, MemWrite(rdwr, memory.fd, one, kBlock, false));
    r["ok_write_wronly"] = Ask(channel, MemWrite(wronly, memory.fd, one, kBlock, false));
    r["ok_read_rdonly"] = Ask(channel, MemRead(rdonly, memory.fd, one));
    r["write_rdonly"] = Ask(channel, MemWrite(rdonly, memory.fd, one, kBlock, false));
    r["read_wronly"] = Ask(channel, MemRead(wronly, memory.fd, one));
    r["write_append"] = Ask(channel, MemWrite(append, memory.fd, one, kBlock, false));
    r["write_o_path"] = Ask(channel, MemWrite(path_only, memory.fd, one, kBlock, false));
    r["read_o_path"] = Ask(channel, MemRead(path_only, memory.fd, one));
    r["fd_not_open"] = Ask(channel, MemWrite(900, memory.fd, one, kBlock, false));
    r["fd_negative"] = Ask(channel, MemWrite(-1, memory.fd, one, kBlock, false));
    r["fd_not_a_number"] =
        Ask(channel, {{"op", "mem_write"}, {"fd", "3"}, {"memfd", memory.fd}, {"pieces", one}, {"size", kBlock}});
    r["other_fs"] = Ask(channel, MemWrite(elsewhere, memory.fd, one, kBlock, false));
    r["dev_null"] = Ask(channel, MemWrite(dev_null, memory.fd, one, kBlock, false));
    r["directory"] = Ask(channel, MemRead(directory, memory.fd, one));
    r["control_file"] = Ask(channel, MemWrite(control_fd, memory.fd, one, kBlock, false));
    r["memfd_unsealed"] = Ask(channel, MemWrite(rdwr, unsealed.fd, one, kBlock, false));
    r["memfd_plain_file"] = Ask(channel, MemWrite(rdwr, rdwr, one, kBlock, false));
    r["memfd_tmp_file"] = Ask(channel, MemRead(rdwr, elsewhere, one));
    r["memfd_rdonly"] = Ask(channel, MemWrite(rdwr, memfd_rdonly, one, kBlock, false));
    r["memfd_not_open"] = Ask(channel, MemWrite(rdwr, 901, one, kBlock, false));
    r["write_sealed_read"] = Ask(channel, MemRead(rdwr, write_sealed.fd, one));
    r["write_sealed_write"] = Ask(channel, MemWrite(rdwr, write_sealed.fd, one, kBlock, false));
    return r;
  });
  ASSERT_FALSE(out.contains("child_failed")) << out;
  for (const char* ok : {"ok_write", "ok_write_wronly", "ok_read_rdonly", "write_sealed_write"}) {
    EXPECT_REFUSED(out[ok], 0);
  }
  for (const char* bad : {"write_rdonly", "read_wronly", "write_append", "write_o_path", "read_o_path", "fd_not_open",
                          "fd_negative", "memfd_not_open"}) {
    EXPECT_REFUSED(out[bad], EBADF);
  }
  EXPECT_REFUSED(out["fd_not_a_number"], EINVAL);
  EXPECT_REFUSED(out["other_fs"], EXDEV);
  EXPECT_REFUSED(out["dev_null"], EXDEV);
  EXPECT_NE(out["other_fs"].value("error", "").find("not of this spillfs mount"), std::string::npos) << out["other_fs"];
  for (const char* bad : {"directory", "control_file", "memfd_unsealed", "memfd_plain_file", "memfd_tmp_file",
                          "memfd_rdonly", "write_sealed_read"}) {
    EXPECT_REFUSED(out[bad], EINVAL);
  }
  EXPECT_NE(out["memfd_unsealed"].value("error", "").find("F_SEAL_SHRINK"), std::string::npos) << out;
  EXPECT_NE(out["memfd_plain_file"].value("error", "").find("not a memfd"), std::string::npos) << out;
  EXPECT_TRUE(ReadFile(P("target")) == data.substr(0, kBlock));
}

// The file of another spillfs mount is another file system; a bind mount of
// this one is this one.
TEST_F(MemoryIoTest, OnlyFilesOfThisMountBindMountsIncluded) {
  MountedVolume::Options options;
  options.mount_options = "allow_other";
  MountedVolume other(options);
  ASSERT_TRUE(other.mounted());
  ASSERT_NO_FATAL_FAILURE(MakeTraversable(other.mountpoint()));
  const std::string other_dir = other.Path("pub");
  ASSERT_EQ(mkdir(other_dir.c_str(), 0777), 0) << ErrnoName(errno);
  ASSERT_EQ(chmod(other_dir.c_str(), 0777), 0) << ErrnoName(errno);
  TempDir bind_root("spillfs-memio-bind");
  ASSERT_EQ(chmod(bind_root.path().c_str(), 0755), 0) << ErrnoName(errno);
  ASSERT_EQ(mount(dir_.c_str(), bind_root.path().c_str(), nullptr, MS_BIND, nullptr), 0) << ErrnoName(errno);
  const std::string data = RandomBytes(kUnit, 4104);
  json out = AsNobody([&] {
    control::Channel channel = OpenChannel();
    Memfd memory = MakeMemfd(kUnit, data);
    const int theirs = OpenOrThrow(other_dir + "/f", O_CREAT | O_RDWR);
    const int bound = OpenOrThrow(bind_root.path() + "/g", O_CREAT | O_RDWR);
    const json all = Pieces({{0, 0, kUnit}});
    return json{{"other_mount", Ask(channel, MemWrite(theirs, memory.fd, all, kUnit, true))},
                {"bind_mount", Ask(channel, MemWrite(bound, memory.fd, all, kUnit, true))}};
  });
  EXPECT_EQ(umount2(bind_root.path().c_str(), MNT_DETACH), 0) << ErrnoName(errno);
  ASSERT_FALSE(out.contains("child_failed")) << out;
  EXPECT_REFUSED(out["other_mount"], EXDEV);
  EXPECT_NE(out["other_mount"].value("error", "").find("fuse.spillfs"), std::string::npos) << out;
  EXPECT_REFUSED(out["bind_mount"], 0);
  EXPECT_EQ(ReadFile(other_dir + "/f"), "");
  EXPECT_TRUE(ReadFile(P("g")) == data);
}

// ---- the checks of the pieces ----

TEST_F(MemoryIoTest, PiecesAreChecked) {
  const std::string data = RandomBytes(4 * kUnit, 4105);
  json out = AsNobody([&] {
    control::Channel channel = OpenChannel();
    Memfd memory = MakeMemfd(4 * kUnit, data);
    const int fd = OpenOrThrow(P("f"), O_CREAT | O_RDWR);
    const uint64_t kTop = UINT64_MAX - kBlock + 1;  // 2^64 - 4096: a sum that wraps
    json too_many = json::array();
    for (uint64_t i = 0; i < (control::kMaxMemoryPieces + 1) * 3; ++i) too_many.push_back(0);
    json r;
    r["past_memfd"] = Ask(channel, MemWrite(fd, memory.fd, Pieces({{3 * kUnit, 0, 2 * kUnit}}), 2 * kUnit, false));
    r["read_past_memfd"] = Ask(channel, MemRead(fd, memory.fd, Pieces({{4 * kUnit - 1, 0, 2}})));
    r["wrapping_memory"] = Ask(channel, MemWrite(fd, memory.fd, Pieces({{kTop, 0, 2 * kBlock}}), 2 * kBlock, false));
    r["wrapping_file"] = Ask(channel, MemWrite(fd, memory.fd, Pieces({{0, kTop, 2 * kBlock}}), 0, false));
    r["past_2_62"] = Ask(channel, MemWrite(fd, memory.fd, Pieces({{0, 1ull << 62, kBlock}}), 0, false));
    r["read_wrapping_file"] = Ask(channel, MemRead(fd, memory.fd, Pieces({{0, UINT64_MAX - 10, 100}})));
    r["misaligned_memory"] = Ask(channel, MemWrite(fd, memory.fd, Pieces({{512, 0, kBlock}}), kBlock, false));
    r["misaligned_file"] = Ask(channel, MemWrite(fd, memory.fd, Pieces({{0, 100, kBlock}}), kBlock, false));
    r["misaligned_length"] = Ask(channel, MemWrite(fd, memory.fd, Pieces({{0, 0, 1000}}), 1000, false));
    r["empty_piece"] = Ask(channel, MemWrite(fd, memory.fd, Pieces({{0, 0, 0}}), 0, false));
    r["read_empty_piece"] = Ask(channel, MemRead(fd, memory.fd, Pieces({{0, 0, 0}})));
    r["unsorted"] =
        Ask(channel, MemWrite(fd, memory.fd, Pieces({{0, kUnit, kBlock}, {0, 0, kBlock}}), kUnit + kBlock, false));
    r["overlapping"] =
        Ask(channel, MemWrite(fd, memory.fd, Pieces({{0, 0, 2 * kBlock}, {0, kBlock, kBlock}}), 2 * kBlock, false));
    r["size_past_pieces"] = Ask(channel, MemWrite(fd, memory.fd, Pieces({{0, 0, kBlock}}), kBlock + 1, false));
    r["blocks_past_size"] = Ask(channel, MemWrite(fd, memory.fd, Pieces({{0, 0, 3 * kBlock}}), kBlock, false));
    r["not_triples"] =
        Ask(channel, {{"op", "mem_write"}, {"fd", fd}, {"memfd", memory.fd}, {"pieces", {0, 0}}, {"size", 0}});
    r["no_size"] =
        Ask(channel, {{"op", "mem_write"}, {"fd", fd}, {"memfd", memory.fd}, {"pieces", Pieces({{0, 0, kBlock}})}});
    r["too_many"] = Ask(channel, {{"op", "mem_read"}, {"fd", fd}, {"memfd", memory.fd}, {"pieces", too_many}});
    // More bytes than the memfd holds, over the same memory twice.
    r["read_more_than_memfd"] = Ask(channel, MemRead(fd, memory.fd, Pieces({{0, 0, 4 * kUnit}, {0, 0, kBlock}})));
    r["more_than_memfd"] = Ask(channel, MemWrite(fd, memory.fd, Pieces({{0, 0, 4 * kUnit}, {0, 4 * kUnit, kBlock}}),
                                                 4 * kUnit + kBlock, false));
    return r;
  });
  ASSERT_FALSE(out.contains("child_failed")) << out;
  for (const char* bad : {"past_memfd", "read_past_memfd", "wrapping_memory"}) EXPECT_REFUSED(out[bad], EFAULT);
  for (const char* bad : {"wrapping_file", "past_2_62", "read_wrapping_file"}) EXPECT_REFUSED(out[bad], EFBIG);
  for (const char* bad :
       {"misaligned_memory", "misaligned_file", "misaligned_length", "empty_piece", "read_empty_piece", "unsorted",
        "overlapping", "size_past_pieces", "blocks_past_size", "not_triples", "no_size"}) {
    EXPECT_REFUSED(out[bad], EINVAL);
  }
  EXPECT_REFUSED(out["too_many"], E2BIG);
  EXPECT_REFUSED(out["read_more_than_memfd"], E2BIG);
  EXPECT_REFUSED(out["more_than_memfd"], E2BIG);
  EXPECT_NE(out["past_memfd"].value("error", "").find("piece 0"), std::string::npos) << out["past_memfd"];
  EXPECT_EQ(ReadFile(P("f")), "");  // nothing refused wrote a byte
}

// ---- what a write by a caller that is not root removes ----

TEST_F(MemoryIoTest, SetIdBitsGoWhenACallerOtherThanRootWrites) {
  const std::string data = RandomBytes(kBlock, 4106);
  // Owned by root (the test), writable by all.
  WriteFile(P("setuid"), "", 04777);
  WriteFile(P("setgid_exec"), "", 06777);    // both go (group-executable)
  WriteFile(P("setgid_noexec"), "", 02767);  // set-group-ID without group-execute stays (locking)
  WriteFile(P("setuid_root"), "", 04777);
  json out = AsNobody([&] {
    control::Channel channel = OpenChannel();
    Memfd memory = MakeMemfd(kBlock, data);
    json r;
    for (const char* name : {"setuid", "setgid_exec", "setgid_noexec"}) {
      const int fd = OpenOrThrow(P(name), O_RDWR);
      r[name] = Ask(channel, MemWrite(fd, memory.fd, Pieces({{0, 0, kBlock}}), kBlock, false));
    }
    return r;
  });
  ASSERT_FALSE(out.contains("child_failed")) << out;
  for (const char* name : {"setuid", "setgid_exec", "setgid_noexec"}) EXPECT_REFUSED(out[name], 0);
  auto mode = [&](const char* name) {
    struct stat st {};
    EXPECT_EQ(stat(P(name).c_str(), &st), 0) << ErrnoName(errno);
    return st.st_mode & 07777;
  };
  EXPECT_EQ(mode("setuid"), 0777u);
  EXPECT_EQ(mode("setgid_exec"), 0777u);
  EXPECT_EQ(mode("setgid_noexec"), 02767u);
  EXPECT_TRUE(ReadFile(P("setuid")) == data);
  // Root keeps them (CAP_FSETID), as through the mount; root may use the
  // memory ops too.
  auto channel = control::Channel::Open(control_path());
  ASSERT_TRUE(channel.ok()) << channel.status().ToString();
  const int memfd = memfd_create("root", MFD_ALLOW_SEALING | MFD_CLOEXEC);
  ASSERT_GE(memfd, 0);
  ASSERT_TRUE(WriteAll(memfd, data.data(), data.size(), 0));
  ASSERT_EQ(fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  Fd file(open(P("setuid_root").c_str(), O_RDWR | O_CLOEXEC));
  ASSERT_TRUE(file.valid());
  json root = Ask(*channel, MemWrite(file.get(), memfd, Pieces({{0, 0, kBlock}}), kBlock, true));
  close(memfd);
  EXPECT_REFUSED(root, 0);
  EXPECT_EQ(mode("setuid_root"), 04777u);
  EXPECT_TRUE(ReadFile(P("setuid_root")) == data);
}

// ---- what such a caller never reaches ----

TEST_F(MemoryIoTest, AFileTheCallerCannotOpenIsNeverReached) {
  const std::string secret = RandomBytes(2 * kBlock, 4107);
  WriteFile(P("secret"), secret, 0600);  // root's
  const std::string mine = RandomBytes(2 * kBlock, 4108);
  json out = AsNobody([&] {
    control::Channel channel = OpenChannel();
    json r;
    r["open_secret"] = open(P("secret").c_str(), O_RDONLY) < 0 ? errno : 0;
    // A descriptor of the secret's path that opens nothing: O_PATH needs
    // only search permission on the directory.
    const int secret_path = OpenOrThrow(P("secret"), O_PATH);
    const int own = OpenOrThrow(P("mine"), O_CREAT | O_RDWR, 0600);
    if (!WriteAll(own, mine.data(), mine.size(), 0)) throw std::runtime_error("write mine");
    Memfd memory = MakeMemfd(2 * kBlock);
    const json both = Pieces({{0, 0, 2 * kBlock}});
    r["read_o_path"] = Ask(channel, MemRead(secret_path, memory.fd, both));
    r["write_o_path"] = Ask(channel, MemWrite(secret_path, memory.fd, both, 2 * kBlock, false));
    r["o_path_left_memory_alone"] = std::all_of(memory.data, memory.data + memory.size, [](char c) { return c == 0; });
    // Its own descriptor names its own file's inode, and only that.
    r["read_own"] = Ask(channel, MemRead(own, memory.fd, both));
    r["own_bytes"] = std::memcmp(memory.data, mine.data(), mine.size()) == 0;
    std::memset(memory.data, 'w', memory.size);
    r["write_own"] = Ask(channel, MemWrite(own, memory.fd, both, 2 * kBlock, false));
    struct stat st {};
    fstat(own, &st);
    r["own_ino"] = st.st_ino;
    return r;
  });
  ASSERT_FALSE(out.contains("child_failed")) << out;
  EXPECT_EQ(out["open_secret"], EACCES);
  EXPECT_REFUSED(out["read_o_path"], EBADF);
  EXPECT_REFUSED(out["write_o_path"], EBADF);
  EXPECT_EQ(out["o_path_left_memory_alone"], true);
  EXPECT_REFUSED(out["read_own"], 0);
  EXPECT_EQ(out["own_bytes"], true);
  EXPECT_REFUSED(out["write_own"], 0);
  EXPECT_EQ(out["write_own"]["result"]["ino"], out["own_ino"]);
  EXPECT_TRUE(ReadFile(P("secret")) == secret);
  EXPECT_EQ(ReadFile(P("mine")), std::string(2 * kBlock, 'w'));
}

// The caller is the thread that wrote the request: one that has exited by
// the time the reply is read is gone (its id may be another task's by then).
TEST_F(MemoryIoTest, TheCallerIsTheThreadThatWroteTheRequest) {
  json out = AsNobody([&] {
    const int fd = OpenOrThrow(P("f"), O_CREAT | O_RDWR);
    Memfd memory = MakeMemfd(kBlock);
    const int control_fd = OpenOrThrow(control_path(), O_RDWR);
    const std::string request = MemRead(fd, memory.fd, Pieces({{0, 0, kBlock}})).dump();
    auto reply = [&] {
      std::string text(4096, '\0');
      const ssize_t n = pread(control_fd, text.data(), text.size(), 0);
      text.resize(n > 0 ? static_cast<size_t>(n) : 0);
      return json::parse(text, nullptr, false);
    };
    json r;
    std::thread([&] { (void)WriteAll(control_fd, request.data(), request.size(), 0); }).join();
    r["gone"] = reply();
    (void)WriteAll(control_fd, request.data(), request.size(), 0);
    r["here"] = reply();
    return r;
  });
  ASSERT_FALSE(out.contains("child_failed")) << out;
  EXPECT_EQ(out["gone"]["errno"], ESRCH) << out["gone"];
  EXPECT_EQ(out["here"]["ok"], true) << out["here"];
}

// A caller whose credentials changed between its request and the reply is
// refused: the descriptors it has by then may be a privileged program's (a
// set-user-ID program it ran, which opened files it could not open).
TEST_F(MemoryIoTest, ACallerWhoseCredentialsChangedIsRefused) {
  json out = AsNobody(
      [&] {
        const int fd = OpenOrThrow(P("f"), O_CREAT | O_RDWR);
        Memfd memory = MakeMemfd(kBlock);
        const int control_fd = OpenOrThrow(control_path(), O_RDWR);
        const std::string request = MemRead(fd, memory.fd, Pieces({{0, 0, kBlock}})).dump();
        auto reply = [&] {
          std::string text(4096, '\0');
          const ssize_t n = pread(control_fd, text.data(), text.size(), 0);
          text.resize(n > 0 ? static_cast<size_t>(n) : 0);
          return json::parse(text, nullptr, false);
        };
        json r;
        (void)WriteAll(control_fd, request.data(), request.size(), 0);  // as uid 65534
        if (seteuid(0) != 0) throw std::runtime_error("seteuid(0)");
        r["changed"] = reply();
        if (seteuid(kNobody) != 0) throw std::runtime_error("seteuid(65534)");
        (void)WriteAll(control_fd, request.data(), request.size(), 0);
        r["same"] = reply();
        return r;
      },
      /*saved_uid=*/0);
  ASSERT_FALSE(out.contains("child_failed")) << out;
  EXPECT_EQ(out["changed"]["errno"], EPERM) << out["changed"];
  EXPECT_EQ(out["same"]["ok"], true) << out["same"];
}

// A handle stays its opener's: a request a root process writes on a handle
// a user opened (the user handed it to a set-user-ID program as its output)
// gets no root-only op, and no memory I/O on the root process's descriptors.
TEST_F(MemoryIoTest, AHandleOpenedByAUserGetsNothingARootWriterCouldHave) {
  json out = AsNobody(
      [&] {
        const int fd = OpenOrThrow(P("f"), O_CREAT | O_RDWR);
        Memfd memory = MakeMemfd(kBlock);
        const int control_fd = OpenOrThrow(control_path(), O_RDWR);  // opened as uid 65534
        auto ask = [&](const json& request) {
          const std::string text = request.dump();
          (void)WriteAll(control_fd, text.data(), text.size(), 0);
          std::string reply(4096, '\0');
          const ssize_t n = pread(control_fd, reply.data(), reply.size(), 0);
          reply.resize(n > 0 ? static_cast<size_t>(n) : 0);
          return json::parse(reply, nullptr, false);
        };
        json r;
        if (seteuid(0) != 0) throw std::runtime_error("seteuid(0)");
        r["ls"] = ask({{"op", "ls"}, {"paths", {"/"}}});  // written as root
        r["mem_read"] = ask(MemRead(fd, memory.fd, Pieces({{0, 0, kBlock}})));
        if (seteuid(kNobody) != 0) throw std::runtime_error("seteuid(65534)");
        r["mine"] = ask(MemRead(fd, memory.fd, Pieces({{0, 0, kBlock}})));
        return r;
      },
      /*saved_uid=*/0);
  ASSERT_FALSE(out.contains("child_failed")) << out;
  EXPECT_EQ(out["ls"]["errno"], EACCES) << out["ls"];
  EXPECT_EQ(out["mem_read"]["errno"], EPERM) << out["mem_read"];
  EXPECT_EQ(out["mine"]["ok"], true) << out["mine"];
}

// The caller's file size limit holds, as for a write through the mount.
TEST_F(MemoryIoTest, TheCallersFileSizeLimitHolds) {
  const std::string data = RandomBytes(2 * kUnit, 4109);
  json out = AsNobody([&] {
    control::Channel channel = OpenChannel();
    Memfd memory = MakeMemfd(2 * kUnit, data);
    const int fd = OpenOrThrow(P("f"), O_CREAT | O_RDWR);
    const rlimit limit{kUnit, kUnit};
    if (setrlimit(RLIMIT_FSIZE, &limit) != 0) throw std::runtime_error("setrlimit");
    return json{{"past", Ask(channel, MemWrite(fd, memory.fd, Pieces({{0, 0, 2 * kUnit}}), 2 * kUnit, false))},
                {"within", Ask(channel, MemWrite(fd, memory.fd, Pieces({{0, 0, kUnit}}), kUnit, false))}};
  });
  ASSERT_FALSE(out.contains("child_failed")) << out;
  EXPECT_REFUSED(out["past"], EFBIG);
  EXPECT_REFUSED(out["within"], 0);
  EXPECT_TRUE(ReadFile(P("f")) == data.substr(0, kUnit));
}

// ---- the parsers of the caller's /proc files ----

TEST(CallerFilesTest, ParsesFdInfoMountInfoAndLimits) {
  auto info = ParseFdInfo("pos:\t0\nflags:\t02102002\nmnt_id:\t29\nino:\t12345\n");
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->flags, 02102002);
  EXPECT_EQ(info->flags & O_ACCMODE, O_RDWR);
  EXPECT_TRUE(info->flags & O_APPEND);
  EXPECT_EQ(info->mnt_id, 29);
  EXPECT_EQ(info->ino, 12345u);
  EXPECT_EQ(ParseFdInfo("pos:\t0\nflags:\t02\nmnt_id:\t29\n").status().code(), EIO);  // before Linux 5.14
  EXPECT_EQ(ParseFdInfo("flags:\t09\nmnt_id:\t29\nino:\t1\n").status().code(), EIO);  // not octal
  const std::string mountinfo =
      "22 1 0:21 / /proc rw,nosuid - proc proc rw\n"
      "290 22 0:55 /sub /mnt/a\\040b rw,nosuid shared:5 - fuse.spillfs /vol rw,user_id=0\n";
  auto entry = FindMountById(mountinfo, 290);
  ASSERT_TRUE(entry.has_value());
  EXPECT_EQ(entry->device, "0:55");
  EXPECT_EQ(entry->mountpoint, "/mnt/a b");
  EXPECT_EQ(entry->fstype, "fuse.spillfs");
  EXPECT_FALSE(FindMountById(mountinfo, 29).has_value());
  EXPECT_FALSE(FindMountById(mountinfo, 2).has_value());
  // The command may hold spaces and parentheses; field 22 is the start time.
  auto start = ParseStartTime("4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 1 0 0 0 2 3 0 0 20 0 1 0 987654 1 2\n");
  ASSERT_TRUE(start.ok()) << start.status().ToString();
  EXPECT_EQ(*start, 987654u);
  EXPECT_EQ(ParseStartTime("4242 (a) S 1 2 3").status().code(), EIO);
  const std::string limits =
      "Limit                     Soft Limit           Hard Limit           Units     \n"
      "Max cpu time              unlimited            unlimited            seconds   \n"
      "Max file size             1048576              unlimited            bytes     \n";
  auto limit = ParseFileSizeLimit(limits);
  ASSERT_TRUE(limit.ok());
  EXPECT_EQ(*limit, std::optional<uint64_t>(1048576));
  auto unlimited = ParseFileSizeLimit("Max file size             unlimited            unlimited            bytes\n");
  ASSERT_TRUE(unlimited.ok());
  EXPECT_FALSE(unlimited->has_value());
  EXPECT_EQ(ParseFileSizeLimit("Max cpu time unlimited unlimited seconds\n").status().code(), EIO);
}

}  // namespace
}  // namespace spillfs::testing
