#include "fuzz_util.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>

#include "spillfs/kvindex/records.h"

namespace spillfs::fuzz {
namespace {

void Must(const Status& s, const std::string& what) { FUZZ_CHECK(s.ok(), what + ": " + s.ToString()); }

std::string Pattern(size_t n, uint8_t seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(seed + i * 7 + i / 4096);
  return s;
}

}  // namespace

TempVolume::TempVolume(uint64_t size) {
  const char* tmp = getenv("TMPDIR");
  std::string tmpl = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/spillfs-fuzz-XXXXXX";
  FUZZ_CHECK(mkdtemp(tmpl.data()) != nullptr, "mkdtemp " + tmpl);
  root_ = tmpl;
  dir_ = root_ + "/vol";
  Volume::CreateOptions options;
  options.size = size;
  auto sb = Volume::Create(dir_, options);
  Must(sb.status(), "mkfs " + dir_);
}

TempVolume::~TempVolume() {
  std::error_code ec;
  std::filesystem::remove_all(root_, ec);
}

std::unique_ptr<Filesystem> OpenFilesystem(const std::string& dir, uint64_t ram_tier_bytes) {
  auto volume = Volume::Open(dir, {});
  Must(volume.status(), "open " + dir);
  FilesystemOptions options;
  options.ram_tier_bytes = ram_tier_bytes;
  auto fs = Filesystem::Open(std::move(volume).value(), options);
  Must(fs.status(), "filesystem on " + dir);
  return std::move(fs).value();
}

void TempVolume::BuildTree(Filesystem* fs) {
  Caller caller{0, 0};
  auto file = [&](InodeNumber parent, const char* name, const std::string& data) {
    auto e = fs->MakeNode(parent, name, S_IFREG | 0644, 0, caller);
    Must(e.status(), name);
    if (!data.empty()) {
      auto n = fs->Write(e->ino, 0, data.data(), data.size());
      Must(n.status(), name);
    }
    return e->ino;
  };
  auto dir = [&](InodeNumber parent, const char* name) {
    auto e = fs->MakeDir(parent, name, 0755, caller);
    Must(e.status(), name);
    return e->ino;
  };
  InodeNumber a = file(kRootInode, "a.txt", Pattern(10000, 1));
  file(kRootInode, "empty", "");
  InodeNumber d = dir(kRootInode, "d");
  file(d, "b.bin", Pattern(12288, 2));
  InodeNumber sub = dir(d, "sub");
  file(sub, "c", "x");
  Must(fs->Link(a, d, "hard").status(), "link");
  Must(fs->Symlink(d, "link", "b.bin", caller).status(), "symlink");
  Must(fs->Symlink(d, "loop", "loop", caller).status(), "symlink");
  Must(fs->Symlink(kRootInode, "abs", "/etc", caller).status(), "symlink");
  Must(fs->Symlink(kRootInode, "up", "d/../d/sub", caller).status(), "symlink");
  InodeNumber sparse = file(kRootInode, "sparse", "");
  std::string s = Pattern(4096, 3);
  Must(fs->Write(sparse, 1 << 20, s.data(), s.size()).status(), "sparse");
  InodeNumber pre = file(kRootInode, "prealloc", "");
  Must(fs->Fallocate(pre, 0, 0, 8192), "fallocate");
  InodeNumber eph = dir(kRootInode, "eph");
  Must(fs->SetXattr(eph, kEphemeralXattr, "1", 0), "ephemeral");
  file(eph, "t", Pattern(5000, 4));
  Must(fs->MakeNode(kRootInode, "fifo", S_IFIFO | 0644, 0, caller).status(), "mkfifo");
  InodeNumber deep = dir(kRootInode, "deep");
  for (char level = '1'; level <= '8'; ++level) deep = dir(deep, std::string(1, level).c_str());
  file(deep, "leaf", Pattern(100, 5));
  Must(fs->FlushAll(), "flush");
}

nlohmann::json CheckControlReply(const std::string& reply) {
  auto json = nlohmann::json::parse(reply, nullptr, /*allow_exceptions=*/false);
  FUZZ_CHECK(json.is_object(), "reply is not a JSON object: " + reply.substr(0, 200));
  FUZZ_CHECK(json.contains("ok") && json["ok"].is_boolean(), "reply without \"ok\": " + reply.substr(0, 200));
  if (!json["ok"].get<bool>()) {
    FUZZ_CHECK(json.contains("errno") && json["errno"].is_number_integer() && json["errno"].get<int>() > 0,
               "refusal without errno: " + reply.substr(0, 200));
    FUZZ_CHECK(json.contains("error") && json["error"].is_string(), "refusal without error: " + reply.substr(0, 200));
  }
  return json;
}

}  // namespace spillfs::fuzz
