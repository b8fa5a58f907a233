// Unit tests for the control protocol as written once: the envelope and the
// request loop of spillfs/common/control_protocol.h, the mountinfo reader of
// spillfs/common/mountinfo.h, and ControlPlane, the one dispatcher of the
// daemon, driven through its handles on a Filesystem over a fresh volume
// (what the FUSE adapter does for MOUNT/.spillfs/control and .../stats).
#include "spillfs/control/control_plane.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include "spillfs/common/block_checksum.h"
#include "spillfs/common/control_protocol.h"
#include "spillfs/common/mountinfo.h"
#include "spillfs/store/volume.h"
#include "support/temp_dir.h"

namespace spillfs {
namespace {

using testing::TempDir;

using nlohmann::json;

// ---- the envelope and the request loop ----

TEST(ControlProtocolTest, Names) {
  EXPECT_EQ(control::ControlPath("/mnt/x"), "/mnt/x/.spillfs/control");
  EXPECT_EQ(control::ControlPath("/mnt/x/"), "/mnt/x/.spillfs/control");
  EXPECT_EQ(control::StatsPath("/"), "/.spillfs/stats");
  EXPECT_EQ(control::OpOf(json{{"op", "du"}}), "du");
  EXPECT_EQ(control::OpOf(json{{"op", 1}}), "?");
}

TEST(ControlProtocolTest, RepliesRoundTrip) {
  auto ok = control::ParseReply(control::ReplyText(control::OkReply(json{{"ino", 7}})), "c");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, (json{{"ino", 7}}));
  auto refused = control::ParseReply(control::ReplyText(control::ErrorReply(Status::Error(ENOENT, "/x: gone"))), "c");
  EXPECT_EQ(refused.status().code(), ENOENT);
  EXPECT_EQ(refused.status().message(), "/x: gone");
  EXPECT_EQ(control::ReplyText(control::ErrorReply(Status::Invalid("bad"))),
            R"({"errno":22,"error":"bad","ok":false})");
  // Names are bytes: what is not UTF-8 is replaced, never thrown on.
  std::string text = control::ReplyText(control::OkReply(std::string("a\xff")));
  EXPECT_EQ(text, "{\"ok\":true,\"result\":\"a\xef\xbf\xbd\"}");
}

TEST(ControlProtocolTest, MalformedReplies) {
  struct Case {
    const char* reply;
    int code;
  };
  for (const Case& c :
       {Case{"", EPROTO}, Case{"[1]", EPROTO}, Case{R"({"result":1})", EPROTO}, Case{R"({"ok":true})", EPROTO},
        Case{R"({"ok":false})", EIO}, Case{R"({"ok":false,"errno":0,"error":"x"})", EIO},
        Case{R"({"ok":false,"errno":"2","error":"x"})", EIO}, Case{R"({"ok":false,"errno":28})", ENOSPC}}) {
    auto parsed = control::ParseReply(c.reply, "/m/.spillfs/control");
    EXPECT_FALSE(parsed.ok()) << c.reply;
    EXPECT_EQ(parsed.status().code(), c.code) << c.reply;
    EXPECT_FALSE(parsed.status().message().empty()) << c.reply;
  }
}

// A client refuses a daemon of another control protocol version, or of none
// (daemons from before the version), with a message naming both versions.
TEST(ControlProtocolTest, ADaemonOfAnotherProtocolVersionIsRefusedNamingBoth) {
  const std::string from = "/m/.spillfs/control";
  const std::string ours = std::to_string(control::kProtocolVersion);
  EXPECT_TRUE(control::CheckProtocol({{control::kProtocolVersionKey, control::kProtocolVersion}}, from).ok());
  Status older = control::CheckProtocol({{"block_size", 4096}}, from);
  EXPECT_EQ(older.code(), EPROTO);
  EXPECT_NE(older.message().find("version none"), std::string::npos) << older.message();
  EXPECT_NE(older.message().find("this client version " + ours), std::string::npos) << older.message();
  EXPECT_NE(older.message().find(from), std::string::npos) << older.message();
  Status newer = control::CheckProtocol({{control::kProtocolVersionKey, control::kProtocolVersion + 1}}, from);
  EXPECT_EQ(newer.code(), EPROTO);
  EXPECT_NE(newer.message().find("version " + std::to_string(control::kProtocolVersion + 1)), std::string::npos)
      << newer.message();
  EXPECT_EQ(control::CheckProtocol(nlohmann::json::array(), from).code(), EPROTO);
}

// Over a plain file the "reply" is the request read back: a shorter request
// on the same handle covers the longer one before it with blanks.
TEST(ControlProtocolTest, ChannelPadsShorterRequests) {
  TempDir dir("spillfs-control");
  const std::string path = dir.path() + "/control";
  std::ofstream(path).close();
  auto channel = control::Channel::Open(path);
  ASSERT_TRUE(channel.ok()) << channel.status().ToString();
  auto first = channel->RequestText(R"({"op":"ls","paths":["/a/long/path"]})", "ls");
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(*first, R"({"op":"ls","paths":["/a/long/path"]})");
  auto second = channel->RequestText(R"({"op":"stat"})", "stat");
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->size(), first->size());
  EXPECT_EQ(second->substr(0, 13), R"({"op":"stat"})");
  EXPECT_EQ(second->find_first_not_of(' ', 13), std::string::npos);
  EXPECT_TRUE(json::parse(*second, nullptr, false).is_object());
  // More than one read's worth comes back whole.
  std::string big = "\"" + std::string(3 << 20, 'x') + "\"";
  auto whole = channel->RequestText(big, "big");
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(*whole, big);
}

TEST(ControlProtocolTest, ChannelOpenErrors) {
  TempDir dir("spillfs-control");
  auto missing = control::Channel::Open(dir.path() + "/none");
  EXPECT_EQ(missing.status().code(), ENOTSUP);
  EXPECT_NE(missing.status().message().find("no control file " + dir.path() + "/none"), std::string::npos);
  auto request = control::Request(dir.path(), json{{"op", "stat"}});
  EXPECT_EQ(request.status().code(), ENOTSUP);
}

// ---- mountinfo ----

TEST(MountInfoTest, ParsesEntries) {
  std::istringstream text(
      "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
      "36 22 0:52 / /mnt/with\\040space rw,nosuid master:3 shared:9 - fuse.spillfs /vols/v\\0401 rw,user_id=0\n"
      "37 22 0:53 / /mnt/a rw - fuse.spillfs /vols/a rw\n"
      "38 37 0:54 / /mnt/a rw - tmpfs tmpfs rw\n"
      "39 22 0:55 /sub /mnt/a/b rw - fuse.spillfs /vols/b rw\n"
      "garbage line\n"
      "40 22 0:56 / /mnt/c rw no-dash-here\n");
  std::vector<MountEntry> table = ParseMountInfo(text);
  ASSERT_EQ(table.size(), 5u);
  EXPECT_EQ(table[1].device, "0:52");
  EXPECT_EQ(table[1].mountpoint, "/mnt/with space");
  EXPECT_EQ(table[1].fstype, "fuse.spillfs");
  EXPECT_EQ(table[1].source, "/vols/v 1");
  EXPECT_EQ(table[4].root, "/sub");

  EXPECT_EQ(FindMountAt(table, "/mnt/a")->fstype, "tmpfs");  // stacked: the last one
  EXPECT_FALSE(FindMountAt(table, "/mnt"));
  EXPECT_EQ(FindMountHolding(table, "/mnt/a/b/c")->mountpoint, "/mnt/a/b");
  EXPECT_EQ(FindMountHolding(table, "/mnt/a/bc")->device, "0:54");
  EXPECT_EQ(FindMountHolding(table, "/mnt/a")->device, "0:54");
  EXPECT_EQ(FindMountHolding(table, "/etc")->mountpoint, "/");
  EXPECT_EQ(FindMountOfSource(table, control::kFsType, "/vols/b")->mountpoint, "/mnt/a/b");
  EXPECT_FALSE(FindMountOfSource(table, control::kFsType, "/dev/sda1"));

  EXPECT_EQ(UnescapeMountField("a\\134b\\011c\\0"), "a\\b\tc\\0");
  EXPECT_EQ(UnescapeMountField("\\08x\\"), "\\08x\\");
}

TEST(MountInfoTest, ReadsThisProcess) {
  auto root = FindMountHolding("/");
  ASSERT_TRUE(root.has_value());
  EXPECT_EQ(root->mountpoint, "/");
  EXPECT_NE(root->device.find(':'), std::string::npos);
}

// ---- ControlPlane, the dispatcher ----

class ControlPlaneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string vol = dir_.path() + "/vol";
    Volume::CreateOptions create;
    create.size = 64 << 20;
    ASSERT_TRUE(Volume::Create(vol, create).ok());
    auto volume = Volume::Open(vol, Volume::OpenOptions{});
    ASSERT_TRUE(volume.ok()) << volume.status().ToString();
    FilesystemOptions options;
    options.ram_tier_bytes = 8 << 20;  // writes stay in memory until flushed
    auto fs = Filesystem::Open(std::move(volume).value(), options);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    fs_ = std::move(fs).value();
    control_ = std::make_unique<ControlPlane>(fs_.get());
  }
  void TearDown() override {
    control_.reset();
    fs_.reset();
  }

  // Writes `request` on `handle` at offset 0 as `caller` (root unless
  // given), padded over the handle's longest request unless `pad` is false,
  // and reads the whole reply.
  std::string Send(ControlPlane::Handle* handle, std::string request, bool pad = true,
                   ControlPlane::RequestCaller caller = {}) {
    size_t& longest = longest_[handle];
    if (pad && request.size() < longest) request.append(longest - request.size(), ' ');
    longest = std::max(longest, request.size());
    auto written = control_->Write(handle, 0, request, caller);
    EXPECT_TRUE(written.ok()) << written.status().ToString();
    std::string reply;
    for (;;) {
      ControlPlane::ReplyBytes part = control_->Read(handle, reply.size(), 4096);
      reply.append(part.bytes);
      if (part.bytes.size() < 4096) return reply;
    }
  }
  // One request on a handle of its own; the reply parsed.
  json Ask(const std::string& request) {
    auto handle = control_->Open(ControlPlane::kControlIno, O_RDWR, /*opener_uid=*/0);
    EXPECT_TRUE(handle.ok());
    json reply = json::parse(Send(*handle, request), nullptr, false);
    Release(*handle);
    EXPECT_TRUE(reply.is_object()) << request;
    return reply;
  }

  InodeNumber MakeFile(const std::string& name, const std::string& bytes) {
    auto e = fs_->MakeNode(kRootInode, name, S_IFREG | 0644, 0, Caller{});
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    auto n = fs_->Write(e->ino, 0, bytes.data(), bytes.size());
    EXPECT_TRUE(n.ok());
    return e->ino;
  }

  // A handle of its own holding `length` bytes reserved (the lease of a
  // commit); the caller releases it (Release).
  ControlPlane::Handle* Reserved(uint64_t length) {
    auto opened = control_->Open(ControlPlane::kControlIno, O_RDWR, /*opener_uid=*/0);
    EXPECT_TRUE(opened.ok());
    json reserved = json::parse(Send(*opened, R"({"op":"reserve","length":)" + std::to_string(length) + "}"));
    EXPECT_EQ(reserved["ok"], true) << reserved;
    return *opened;
  }
  void Release(ControlPlane::Handle* handle) {
    control_->Release(handle);
    longest_.erase(handle);
  }
  // Three distinct dedup units written to `name` and flushed: the volume's
  // blobs; their bytes.
  std::string MakeThreeUnits(const std::string& name) {
    std::string data;
    for (uint64_t i = 0; i < 3 * kUnit; ++i) data.push_back(static_cast<char>((i * 2654435761u) >> 13));
    for (uint64_t u = 0; u < 3; ++u) data[u * kUnit] = static_cast<char>(u);
    MakeFile(name, data);
    EXPECT_TRUE(fs_->FlushAll().ok());
    return data;
  }
  // The references of every blob, sorted.
  std::vector<uint64_t> BlobRefs() {
    std::vector<uint64_t> out;
    auto cursor = fs_->volume().index().NewCursor(Family::kBlob, "p");
    for (cursor->Seek("p"); cursor->Valid(); cursor->Next()) out.push_back(BlobRecord::Decode(cursor->value())->refs);
    std::sort(out.begin(), out.end());
    return out;
  }
  // Each request refused with its errno and message, exactly.
  struct Refusal {
    std::string request;
    int code;
    std::string message;
  };
  void ExpectRefused(const std::vector<Refusal>& refusals) {
    for (const Refusal& bad : refusals) {
      json refused = Ask(bad.request);
      EXPECT_EQ(refused["ok"], false) << bad.request;
      EXPECT_EQ(refused["errno"], bad.code) << bad.request << " -> " << refused;
      EXPECT_EQ(refused["error"], bad.message) << bad.request;
    }
  }

  static constexpr uint64_t kUnit = 256 << 10;  // the dedup unit
  std::map<ControlPlane::Handle*, size_t> longest_;
  TempDir dir_{"spillfs-control-plane"};
  std::unique_ptr<Filesystem> fs_;
  std::unique_ptr<ControlPlane> control_;
};

TEST_F(ControlPlaneTest, Names) {
  auto dir = control_->Lookup(kRootInode, control::kDirName);
  ASSERT_TRUE(dir.has_value());
  EXPECT_EQ(dir->ino, ControlPlane::kDirIno);
  EXPECT_EQ(control_->Lookup(ControlPlane::kDirIno, "control")->ino, ControlPlane::kControlIno);
  EXPECT_EQ(control_->Lookup(ControlPlane::kDirIno, "stats")->ino, ControlPlane::kStatsIno);
  EXPECT_FALSE(control_->Lookup(ControlPlane::kDirIno, "other"));
  auto listing = control_->ReadDir(ControlPlane::kDirIno);
  ASSERT_TRUE(listing.ok());
  ASSERT_EQ(listing->size(), 4u);
  EXPECT_EQ((*listing)[2].name, "control");
  EXPECT_EQ((*listing)[3].name, "stats");
  // Anyone may open the control file (what they may ask is by op: below).
  EXPECT_EQ(control_->GetAttr(ControlPlane::kControlIno)->attr.st_mode, S_IFREG | 0666);
  EXPECT_EQ(control_->Open(ControlPlane::kStatsIno, O_RDWR, /*opener_uid=*/0).status().code(), EACCES);
}

// A caller that is not root may send volume, stat, mem_write and mem_read;
// every other op is refused, named. A request written by two callers is
// refused whole.
TEST_F(ControlPlaneTest, CallersOtherThanRoot) {
  MakeFile("f", std::string(4096, 'x'));
  auto opened = control_->Open(ControlPlane::kControlIno, O_RDWR, /*opener_uid=*/65534);
  ASSERT_TRUE(opened.ok());
  ControlPlane::Handle* handle = *opened;
  const ControlPlane::RequestCaller nobody{65534, 0};
  for (const char* request : {R"({"op":"layout","path":"/f"})", R"({"op":"reserve","length":4096})",
                              R"({"op":"commit","path":"/f","file_offset":0,"length":4096})",
                              R"({"op":"dedup","path":"/f","file_offset":0,"hashes":[1,2]})",
                              R"({"op":"ls","paths":["/f"]})", R"({"op":"du","path":"/"})", R"({"op":"frob"})"}) {
    json reply = json::parse(Send(handle, request, true, nobody));
    EXPECT_EQ(reply["ok"], false) << request;
    EXPECT_EQ(reply["errno"], EACCES) << request << " -> " << reply;
  }
  EXPECT_EQ(json::parse(Send(handle, R"({"op":"layout","path":"/f"})", true, nobody))["error"],
            "op 'layout' is root's: it hands out the data area");
  json volume = json::parse(Send(handle, R"({"op":"volume"})", true, nobody));
  ASSERT_EQ(volume["ok"], true) << volume;
  // No mount here (SetMountDevice): no memory I/O.
  EXPECT_EQ(volume["result"]["memory_io"], false);
  EXPECT_EQ(json::parse(Send(handle, R"({"op":"stat"})", true, nobody))["ok"], true);
  json mem = json::parse(Send(handle, R"({"op":"mem_read","fd":3,"memfd":4,"pieces":[0,0,4096]})", true, nobody));
  EXPECT_EQ(mem["errno"], ENOTSUP) << mem;
  // Root writing on a handle a user opened (a set-user-ID program given it
  // as its output): no root-only op.
  EXPECT_EQ(json::parse(Send(handle, R"({"op":"layout","path":"/f"})"))["errno"], EACCES);
  Release(handle);
  // Root's request, its end written by someone else: refused.
  opened = control_->Open(ControlPlane::kControlIno, O_RDWR, /*opener_uid=*/0);
  ASSERT_TRUE(opened.ok());
  handle = *opened;
  const std::string layout = R"({"op":"layout","path":"/f"})";
  ASSERT_TRUE(control_->Write(handle, 0, layout.substr(0, 10), {}).ok());
  ASSERT_TRUE(control_->Write(handle, 10, layout.substr(10), nobody).ok());
  json mixed = json::parse(std::string(control_->Read(handle, 0, 1 << 20).bytes));
  EXPECT_EQ(mixed["errno"], EPERM) << mixed;
  // And root's own, whole: answered.
  EXPECT_EQ(json::parse(Send(handle, layout))["ok"], true);
  Release(handle);
}

TEST_F(ControlPlaneTest, RoutesEveryOp) {
  const std::string bytes(3 * 4096, 'x');
  MakeFile("f", bytes);
  json stat = Ask(R"({"op":"stat"})");
  ASSERT_EQ(stat["ok"], true) << stat;
  EXPECT_EQ(stat["result"]["mounted"], true);
  EXPECT_EQ(stat["result"]["files"], 1u);
  EXPECT_GT(stat["result"]["ram_tier_capacity_bytes"], 0u);
  // The settings alone, as stat gives them, and nothing counted.
  json volume = Ask(R"({"op":"volume"})");
  ASSERT_EQ(volume["ok"], true) << volume;
  for (const char* key : {"uuid", "format_version", "block_size", "checksums", "dedup"}) {
    EXPECT_EQ(volume["result"][key], stat["result"][key]) << key;
  }
  EXPECT_FALSE(volume["result"].contains("files"));
  // ls and du flush the RAM tier first: the listing shows the extents.
  json ls = Ask(R"({"op":"ls","paths":["/f"],"extents":true})");
  ASSERT_EQ(ls["ok"], true) << ls;
  ASSERT_EQ(ls["result"][0]["extents"].size(), 1u);
  EXPECT_EQ(ls["result"][0]["extents"][0]["length"], bytes.size());
  json du = Ask(R"({"op":"du","path":"/"})");
  ASSERT_EQ(du["ok"], true) << du;
  EXPECT_EQ(du["result"]["physical_bytes"], bytes.size());
  json layout = Ask(R"({"op":"layout","path":"/f"})");
  ASSERT_EQ(layout["ok"], true) << layout;
  EXPECT_EQ(layout["result"]["size"], bytes.size());
  EXPECT_EQ(layout["result"]["extents"][0]["block_checksums"].size(), 3u);
}

TEST_F(ControlPlaneTest, ReserveAndCommitOnOneHandle) {
  MakeFile("g", "");
  auto opened = control_->Open(ControlPlane::kControlIno, O_RDWR, /*opener_uid=*/0);
  ASSERT_TRUE(opened.ok());
  ControlPlane::Handle* handle = *opened;
  const uint64_t free_before = fs_->free_bytes();
  const std::string listing = R"({"op":"ls","paths":["/g","/g","/g","/g","/g","/g","/g","/g"]})";
  EXPECT_EQ(json::parse(Send(handle, listing))["ok"], true);
  // The handle keeps the bytes past a shorter request: unpadded, it is not JSON.
  const std::string reserve = R"({"op":"reserve","length":8192})";
  EXPECT_EQ(json::parse(Send(handle, reserve, /*pad=*/false))["error"], "the request is not a JSON object");
  json reserved = json::parse(Send(handle, reserve));
  ASSERT_EQ(reserved["ok"], true) << reserved;
  EXPECT_EQ(fs_->free_bytes(), free_before - 8192);
  json refused = json::parse(Send(handle, R"({"op":"commit","path":"/g","file_offset":0,"length":8192})"));
  EXPECT_EQ(refused["errno"], EINVAL) << refused;  // the volume keeps checksums: one per block
  EXPECT_EQ(refused["error"], "expected 2 block checksums, got 0");
  json committed = json::parse(
      Send(handle, R"({"op":"commit","path":"/g","file_offset":0,"length":8192,"size":8000,"block_checksums":[1,2]})"));
  ASSERT_EQ(committed["ok"], true) << committed;
  Release(handle);
  EXPECT_EQ(fs_->free_bytes(), free_before - 8192);  // committed: the file holds it
  json ls = Ask(R"({"op":"ls","paths":["/g"]})");
  EXPECT_EQ(ls["result"][0]["size"], 8000u);
}

// The refusals, exactly: the envelope, the inspection ops and the direct path.
TEST_F(ControlPlaneTest, Refusals) {
  struct Bad {
    const char* request;
    int code;
    const char* message;
  };
  for (const Bad& bad : {
           Bad{"not json", EINVAL, "the request is not a JSON object"},
           Bad{"", EINVAL, "the request is not a JSON object"},
           Bad{"[1,2]", EINVAL, "the request is not a JSON object"},
           Bad{R"({"nop":1})", EINVAL, "the request has no \"op\""},
           Bad{R"({"op":7})", EINVAL, "the request has no \"op\""},
           Bad{R"({"op":"frob"})", EINVAL, "unknown op 'frob'"},
           Bad{R"({"op":"du"})", EINVAL, "du needs \"path\""},
           Bad{R"({"op":"ls","paths":"/"})", EINVAL, "ls needs \"paths\": a list of paths"},
           Bad{R"({"op":"ls","paths":["/nope"]})", ENOENT, "/nope: no such file or directory"},
           Bad{R"({"op":"reserve"})", EINVAL, "request lacks \"length\""},
           Bad{R"({"op":"reserve","length":-1})", EINVAL, "\"length\" must be a non-negative integer"},
           Bad{R"({"op":"layout","path":"/nope"})", ENOENT, "/nope: no such file or directory"},
           Bad{R"({"op":"commit","path":"/","file_offset":0,"length":4096})", EINVAL,
               "commit length 4096 != reserved 0"},
       }) {
    json reply = Ask(bad.request);
    EXPECT_EQ(reply["ok"], false) << bad.request;
    EXPECT_EQ(reply["errno"], bad.code) << bad.request << " -> " << reply;
    EXPECT_EQ(reply["error"], bad.message) << bad.request;
  }
  // A malformed field the JSON library trips over.
  json reply = Ask(R"({"op":"ls","paths":[1]})");
  EXPECT_EQ(reply["errno"], EINVAL);
  EXPECT_EQ(reply["error"].get<std::string>().rfind("bad request: ", 0), 0u) << reply;
  reply = Ask(R"({"op":"layout"})");
  EXPECT_EQ(reply["errno"], EINVAL);
  EXPECT_EQ(reply["error"].get<std::string>().rfind("malformed request: ", 0), 0u) << reply;
}

// The dedup op's "units" form: units anywhere in the file in one request,
// "needed" in the order given, the blobs' references counted; bad units
// refused with the unit named. And a commit over several file ranges.
TEST_F(ControlPlaneTest, DedupUnitsAndRangedCommit) {
  const std::string data = MakeThreeUnits("a");
  MakeFile("b", "");
  auto numbers = [&](uint64_t u) {
    XXH128_hash_t h = ContentHash128(data.data() + u * kUnit, kUnit);
    return std::to_string(h.low64) + "," + std::to_string(h.high64);
  };
  ASSERT_EQ(BlobRefs(), (std::vector<uint64_t>{1, 1, 1}));
  const uint64_t physical = Ask(R"({"op":"du","path":"/"})")["result"]["physical_bytes"];
  json reply = Ask(R"({"op":"dedup","path":"/b","units":[0,)" + numbers(2) + "," + std::to_string(2 * kUnit) + ",1,2," +
                   std::to_string(5 * kUnit) + "," + numbers(0) + "]}");
  ASSERT_EQ(reply["ok"], true) << reply;
  EXPECT_EQ(reply["result"]["needed"], json::parse("[0,1,0]"));
  EXPECT_EQ(reply["result"]["mapped_bytes"], 2 * kUnit);
  EXPECT_EQ(BlobRefs(), (std::vector<uint64_t>{1, 2, 2}));
  json ls = Ask(R"({"op":"ls","paths":["/b"]})");
  EXPECT_EQ(ls["result"][0]["size"], 6 * kUnit);
  EXPECT_EQ(Ask(R"({"op":"du","path":"/"})")["result"]["physical_bytes"], physical) << "shared, not copied";

  const std::string u = std::to_string(kUnit);
  ExpectRefused({
      {R"({"op":"dedup","path":"/b","units":[)" + u + ",1,2,0,3,4]}", EINVAL,
       "dedup units must be sorted by file offset without overlap: unit 1 at 0 comes after unit 0 at 262144"},
      {R"({"op":"dedup","path":"/b","units":[)" + u + ",1,2," + u + ",3,4]}", EINVAL,
       "dedup units must be sorted by file offset without overlap: unit 1 at 262144 repeats unit 0 at 262144"},
      {R"({"op":"dedup","path":"/b","units":[0,1,2,4096,3,4]})", EINVAL,
       "dedup unit 1 at file offset 4096 is not at a multiple of the dedup unit (262144 bytes)"},
      {R"({"op":"dedup","path":"/b","units":[0,1]})", EINVAL, "\"units\" must be an array of 3-tuples of numbers"},
      {R"({"op":"dedup","path":"/b","file_offset":0,"units":[0,1,2]})", EINVAL,
       "dedup takes \"units\" or \"file_offset\" with \"hashes\", not both"},
  });
  EXPECT_EQ(BlobRefs(), (std::vector<uint64_t>{1, 2, 2})) << "nothing mapped by a refused request";

  // A commit over two file ranges of "g".
  MakeFile("g", "");
  ControlPlane::Handle* handle = Reserved(12288);
  json refused = json::parse(Send(
      handle, R"({"op":"commit","path":"/g","ranges":[0,4096,4096,4096],"length":12288,"block_checksums":[1,2,3]})"));
  EXPECT_EQ(refused["errno"], EINVAL) << refused;
  EXPECT_EQ(refused["error"], "the file ranges hold 8192 bytes, the reserved space 12288");
  json committed = json::parse(Send(
      handle,
      R"({"op":"commit","path":"/g","ranges":[0,4096,65536,8192],"length":12288,"size":70000,"block_checksums":[1,2,3]})"));
  ASSERT_EQ(committed["ok"], true) << committed;
  Release(handle);
  ls = Ask(R"({"op":"ls","paths":["/g"],"extents":true})");
  EXPECT_EQ(ls["result"][0]["size"], 70000u);
  ASSERT_EQ(ls["result"][0]["extents"].size(), 2u) << ls;
  EXPECT_EQ(ls["result"][0]["extents"][0]["length"], 4096u);
  EXPECT_EQ(ls["result"][0]["extents"][1]["length"], 8192u);
}

// The 32 hex digits of a hash in "unit_hashes": its 16 bytes as the daemon
// lays (low, high) out.
std::string Hex(XXH128_hash_t h) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(&h);
  std::string out;
  char two[3];
  for (size_t i = 0; i < sizeof(h); ++i) {
    std::snprintf(two, sizeof(two), "%02x", bytes[i]);
    out += two;
  }
  return out;
}

// The compact form of the units ("unit_runs" with "unit_hashes"): a dedup
// request maps what the "units" form maps and answers "needed" as a string;
// a commit's units become blobs; every bad run, hash or mix of forms is
// refused with what is wrong named, and maps nothing.
TEST_F(ControlPlaneTest, DedupAndCommitCompactUnits) {
  const std::string data = MakeThreeUnits("a");
  auto hash = [&](uint64_t u) { return ContentHash128(data.data() + u * kUnit, kUnit); };

  ASSERT_EQ(BlobRefs(), (std::vector<uint64_t>{1, 1, 1}));
  const std::string u = std::to_string(kUnit);
  auto numbers = [&](XXH128_hash_t h) { return std::to_string(h.low64) + "," + std::to_string(h.high64); };

  // The same units both ways: at 0, 2 and 5 units, the middle one unknown.
  MakeFile("b", "");
  MakeFile("c", "");
  const XXH128_hash_t unknown{1, 2};
  json old_form = Ask(R"({"op":"dedup","path":"/b","units":[0,)" + numbers(hash(2)) + "," + std::to_string(2 * kUnit) +
                      "," + numbers(unknown) + "," + std::to_string(5 * kUnit) + "," + numbers(hash(0)) + "]}");
  ASSERT_EQ(old_form["ok"], true) << old_form;
  EXPECT_EQ(old_form["result"]["needed"], json::parse("[0,1,0]"));
  json compact =
      Ask(R"({"op":"dedup","path":"/c","unit_runs":[0,1,)" + std::to_string(2 * kUnit) + ",1," +
          std::to_string(5 * kUnit) + R"(,1],"unit_hashes":")" + Hex(hash(2)) + Hex(unknown) + Hex(hash(0)) + "\"}");
  ASSERT_EQ(compact["ok"], true) << compact;
  EXPECT_EQ(compact["result"]["needed"], "010");
  EXPECT_EQ(compact["result"]["mapped_bytes"], old_form["result"]["mapped_bytes"]);
  EXPECT_EQ(compact["result"]["unit_bytes"], kUnit);
  EXPECT_EQ(BlobRefs(), (std::vector<uint64_t>{1, 3, 3}));
  EXPECT_EQ(Ask(R"({"op":"ls","paths":["/c"]})")["result"][0]["size"], 6 * kUnit);
  // One run of three units (adjacent runs are fine too).
  MakeFile("d", "");
  json run = Ask(R"({"op":"dedup","path":"/d","unit_runs":[0,2,)" + std::to_string(2 * kUnit) +
                 R"(,1],"unit_hashes":")" + Hex(hash(0)) + Hex(hash(1)) + Hex(hash(2)) + "\"}");
  ASSERT_EQ(run["ok"], true) << run;
  EXPECT_EQ(run["result"]["needed"], "000");
  EXPECT_EQ(BlobRefs(), (std::vector<uint64_t>{2, 4, 4}));

  const std::string dedup = R"({"op":"dedup","path":"/b",)";
  const std::string h1 = Hex(hash(1)), h2 = h1 + Hex(hash(2));
  ExpectRefused({
      {dedup + R"("unit_runs":[)" + u + R"(,1,0,1],"unit_hashes":")" + h2 + "\"}", EINVAL,
       "unit runs must be sorted by file offset without overlap: run 1 at 0 starts before run 0 ends at "
       "524288"},
      {dedup + R"("unit_runs":[0,2,)" + u + R"(,1],"unit_hashes":")" + h2 + h1 + "\"}", EINVAL,
       "unit runs must be sorted by file offset without overlap: run 1 at 262144 starts before run 0 ends at "
       "524288"},
      {dedup + R"("unit_runs":[4096,1],"unit_hashes":")" + h1 + "\"}", EINVAL,
       "unit run 0 at file offset 4096 is not at a multiple of the dedup unit (262144 bytes)"},
      {dedup + R"("unit_runs":[0,1,)" + u + R"(,0],"unit_hashes":")" + h1 + "\"}", EINVAL,
       "unit run 1 at file offset 262144 has no units"},
      {dedup + R"("unit_runs":[18446744073709289472,2],"unit_hashes":")" + h2 + "\"}", EFBIG,
       "unit run 0 at file offset 18446744073709289472 of 2 units is past the largest file offset"},
      {dedup + R"("unit_runs":[0],"unit_hashes":")" + h1 + "\"}", EINVAL,
       "\"unit_runs\" must be an array of 2-tuples of numbers"},
      {dedup + R"("unit_runs":[0,-1],"unit_hashes":")" + h1 + "\"}", EINVAL,
       "\"unit_runs\" holds a value that is not a u64"},
      {dedup + R"("unit_runs":[0,1],"unit_hashes":[1,2]})", EINVAL, "\"unit_hashes\" must be a string of hex digits"},
      {dedup + R"("unit_runs":[0,2],"unit_hashes":")" + h1 + "\"}", EINVAL,
       "\"unit_hashes\" holds 32 hex digits; the unit runs hold 2 units, 32 digits each"},
      {dedup + R"("unit_runs":[0,1],"unit_hashes":")" + h1 + "0\"}", EINVAL,
       "\"unit_hashes\" holds 33 hex digits; the unit runs hold 1 units, 32 digits each"},
      {dedup + R"("unit_runs":[0,1,)" + std::to_string(3 * kUnit) + R"(,1],"unit_hashes":")" + h1 + "0123A" +
           h1.substr(5) + "\"}",
       EINVAL,
       "\"unit_hashes\": unit 1 (file offset 786432) has 'A' at digit 4 of its hash, not a lowercase hex "
       "digit"},
      {dedup + R"("unit_runs":[0,1],"unit_hashes":"0\u0001)" + h1.substr(2) + "\"}", EINVAL,
       "\"unit_hashes\": unit 0 (file offset 0) has byte 0x01 at digit 1 of its hash, not a lowercase hex "
       "digit"},
      {dedup + R"("unit_runs":[0,1]})", EINVAL,
       "\"unit_runs\" and \"unit_hashes\" go together: the request lacks \"unit_hashes\""},
      {dedup + R"("unit_hashes":")" + h1 + "\"}", EINVAL,
       "\"unit_runs\" and \"unit_hashes\" go together: the request lacks \"unit_runs\""},
      {dedup + R"("units":[0,1,2],"unit_runs":[0,1],"unit_hashes":")" + h1 + "\"}", EINVAL,
       "dedup takes \"units\" or \"unit_runs\" with \"unit_hashes\", not both"},
      {dedup + R"("file_offset":0,"hashes":[1,2],"unit_runs":[0,1],"unit_hashes":")" + h1 + "\"}", EINVAL,
       "dedup takes \"unit_runs\" with \"unit_hashes\" or \"file_offset\" with \"hashes\", not both"},
  });
  EXPECT_EQ(BlobRefs(), (std::vector<uint64_t>{2, 4, 4})) << "nothing mapped by a refused request";

  // A commit of two whole units of "g" with their hashes in the compact
  // form: they become blobs (how many units a blob holds is the core's),
  // which a dedup request then finds and shares.
  MakeFile("g", "");
  ControlPlane::Handle* handle = Reserved(2 * kUnit);
  std::string sums = "1";
  for (int i = 1; i < 128; ++i) sums += ",1";
  const XXH128_hash_t g0{11, 12}, g1{13, 14};
  const std::string commit = R"({"op":"commit","path":"/g","file_offset":0,"length":524288,"size":524288,)"
                             R"("block_checksums":[)" +
                             sums + "],";
  json refused = json::parse(
      Send(handle, commit + R"("units":[0,1,2],"unit_runs":[0,2],"unit_hashes":")" + Hex(g0) + Hex(g1) + "\"}"));
  EXPECT_EQ(refused["errno"], EINVAL) << refused;
  EXPECT_EQ(refused["error"], "commit takes \"units\" or \"unit_runs\" with \"unit_hashes\", not both");
  refused = json::parse(Send(handle, commit + R"("unit_runs":[0,2],"unit_hashes":")" + Hex(g0) + "\"}"));
  EXPECT_EQ(refused["errno"], EINVAL) << refused;
  EXPECT_EQ(refused["error"], "\"unit_hashes\" holds 32 hex digits; the unit runs hold 2 units, 32 digits each");
  json committed =
      json::parse(Send(handle, commit + R"("unit_runs":[0,2],"unit_hashes":")" + Hex(g0) + Hex(g1) + "\"}"));
  ASSERT_EQ(committed["ok"], true) << committed;
  Release(handle);
  EXPECT_GT(BlobRefs().size(), 3u) << "the commit made blobs";
  const uint64_t physical = Ask(R"({"op":"du","path":"/"})")["result"]["physical_bytes"];
  MakeFile("h", "");
  json found =
      Ask(R"({"op":"dedup","path":"/h","unit_runs":[)" + u + R"(,2],"unit_hashes":")" + Hex(g0) + Hex(g1) + "\"}");
  ASSERT_EQ(found["ok"], true) << found;
  EXPECT_EQ(found["result"]["needed"], "00");
  EXPECT_EQ(found["result"]["mapped_bytes"], 2 * kUnit);
  EXPECT_EQ(Ask(R"({"op":"du","path":"/"})")["result"]["physical_bytes"], physical) << "shared, not copied";
}

// Without a Filesystem (an unmounted volume) the direct-path ops are unknown.
// The compact hashes are read without the JSON lexer where the client
// library's spelling has them at the top level; spelled otherwise (a space,
// escapes) or nested in another object, the request means what its JSON says.
TEST_F(ControlPlaneTest, CompactUnitHashesSpelledAnyWayMeanTheSame) {
  const std::string data = MakeThreeUnits("a");
  auto hash = [&](uint64_t u) { return ContentHash128(data.data() + u * kUnit, kUnit); };
  const std::string hex = Hex(hash(0)) + Hex(hash(1));
  int file = 0;
  auto dedup = [&](const std::string& tail) {
    const std::string name = "f" + std::to_string(file++);
    MakeFile(name, "");
    return Ask(R"({"op":"dedup","path":"/)" + name + R"(","unit_runs":[0,2],)" + tail);
  };
  for (const std::string& tail : {R"("unit_hashes":")" + hex + "\"}", R"("unit_hashes": ")" + hex + "\"}",
                                  R"("unit_hashes":")" + hex + R"(","x":{"unit_hashes":""}})",
                                  R"("x":{"unit_hashes":"00"},"unit_hashes":")" + hex + "\"}"}) {
    json reply = dedup(tail);
    ASSERT_EQ(reply["ok"], true) << tail << " " << reply;
    EXPECT_EQ(reply["result"]["needed"], "00") << tail;
  }
  // Nested only: no top-level hashes, refused as such.
  json nested = dedup(R"("x":{"unit_hashes":")" + hex + "\"}}");
  EXPECT_EQ(nested["ok"], false) << nested;
  EXPECT_NE(nested.dump().find("go together"), std::string::npos) << nested;
  // A key that only ends in the name, escaped quote and all, is not it.
  json odd = dedup(R"("x\"unit_hashes":")" + hex + "\"}");
  EXPECT_EQ(odd["ok"], false) << odd;
}

TEST_F(ControlPlaneTest, InspectionAloneRefusesTheDirectPath) {
  Inspector inspector(fs_->volume().index(), fs_->volume().superblock());
  json reply = json::parse(ControlPlane::AnswerInspection(inspector, R"({"op":"layout","path":"/"})", {}));
  EXPECT_EQ(reply["errno"], EINVAL);
  EXPECT_EQ(reply["error"], "unknown op 'layout'");
  reply = json::parse(ControlPlane::AnswerInspection(inspector, R"({"op":"stat"})", {}));
  EXPECT_EQ(reply["ok"], true);
  EXPECT_EQ(reply["result"]["mounted"], false);
}

TEST_F(ControlPlaneTest, StatsFileIsPrometheusText) {
  auto opened = control_->Open(ControlPlane::kStatsIno, O_RDONLY, /*opener_uid=*/0);
  ASSERT_TRUE(opened.ok());
  EXPECT_EQ(control_->Write(*opened, 0, "x", {}).status().code(), EBADF);
  std::string text(control_->Read(*opened, 0, 1 << 20).bytes);
  control_->Release(*opened);
  EXPECT_NE(text.find("# HELP spillfs_info Identity of the volume.\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nspillfs_mounted 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("# TYPE spillfs_read_ahead_windows counter\n"), std::string::npos) << text;
}

}  // namespace
}  // namespace spillfs
