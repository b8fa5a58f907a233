// Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/):
// valid encodings of every record kind and key, and valid control requests.
// Built with the fuzzers (SPILLFS_FUZZ); run as
//   build-fuzz/bin/make_fuzz_corpus tests/fuzz/corpus
// The files are committed; run it again after a format change.
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "spillfs/kvindex/coding.h"
#include "spillfs/kvindex/keys.h"
#include "spillfs/kvindex/records.h"

namespace {

using namespace spillfs;

void Write(const std::string& dir, const std::string& name, const std::string& bytes) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
}

void Records(const std::string& dir) {
  InodeRecord file;
  file.mode = S_IFREG | 0644;
  file.nlink = 1;
  file.size = 10000;
  file.atime_ns = file.mtime_ns = file.ctime_ns = file.btime_ns = 1733140000123456789;
  file.generation = 7;
  file.allocated_bytes = 12288;
  Write(dir, "inode-file", file.Encode());
  InodeRecord link = file;
  link.mode = S_IFLNK | 0777;
  link.symlink_target = "../some/where";
  link.atime_ns = -5;
  Write(dir, "inode-symlink", link.Encode());
  InodeRecord root;
  root.mode = S_IFDIR | 0755;
  root.nlink = 3;
  root.flags = kInodeEphemeral;
  root.parent = kRootInode;
  root.uid = root.gid = 1000;
  Write(dir, "inode-dir", root.Encode());
  Write(dir, "dirent", DirentRecord{42, S_IFREG}.Encode());
  ExtentRecord extent;
  extent.physical = 1 << 20;
  extent.length = 3 * 4096;
  extent.block_checksums = {0xdeadbeef, 1, 0xffffffff};
  Write(dir, "extent", extent.Encode());
  ExtentRecord unwritten;
  unwritten.physical = 1 << 30;
  unwritten.length = 8192;
  unwritten.flags = kExtentUnwritten;
  unwritten.blob_id = 1 << 20;
  Write(dir, "extent-unwritten", unwritten.Encode());
  BlobRecord blob;
  blob.hash = std::string(16, '\x5a');
  blob.length = 65536;
  blob.refs = 3;
  Write(dir, "blob", blob.Encode());
  Superblock sb;
  sb.uuid = "0123456789abcdef";
  sb.data_offset = 1 << 20;
  sb.data_size = 1ull << 30;
  sb.created_ns = 1733140000000000000;
  Write(dir, "superblock", sb.Encode());
  Superblock small = sb;
  small.block_size = 512;
  small.backing = BackingKind::kBlockDevice;
  small.device_path = "/dev/nvme1n1";
  small.checksums = false;
  Write(dir, "superblock-block-512", small.EncodeBlock());
  Write(dir, "superblock-block-4096", sb.EncodeBlock().substr(0, 256));
  Write(dir, "key-dirent", keys::Dirent(kRootInode, "a.txt"));
  Write(dir, "key-extent", keys::Extent(9, 1 << 20));
}

void Coding(const std::string& dir) {
  // FuzzedDataProvider reads integers from the end and bytes from the front.
  std::string program = "\x01\x09\x03\x04\x0c\x05\x06\x00";
  std::string values;
  coding::PutVarint64(&values, 300);
  coding::PutVarsigned64(&values, -2);
  coding::PutLengthPrefixed(&values, "name");
  coding::PutFixed64BE(&values, 0x0102030405060708ull);
  Write(dir, "program", std::string(1, static_cast<char>(program.size())) + program + values + std::string(24, '\x7f'));
  Write(dir, "varints", std::string("\x04\x01\x01\x01\x01\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01\x80\x00", 17));
}

void Control(const std::string& dir, bool direct) {
  std::vector<std::pair<std::string, std::string>> requests = {
      {"stat", R"({"op":"stat"})"},
      {"ls", R"({"op":"ls","paths":["/","/d"],"long":true,"extents":true})"},
      {"ls-dir", R"({"op":"ls","paths":["/d/sub/../link","/abs"],"directory":true})"},
      {"du", R"({"op":"du","path":"/d"})"},
      {"du-root", R"({"op":"du","path":"//"})"},
      {"bad", R"({"op":"ls","paths":"/"})"},
  };
  if (direct) {
    requests.push_back({"layout", R"({"op":"layout","path":"/a.txt"})"});
    requests.push_back({"layout-sparse", R"({"op":"layout","path":"/sparse"})"});
    requests.push_back({"reserve", R"({"op":"reserve","length":8192})"});
    requests.push_back({"reserve-commit", std::string(R"({"op":"reserve","length":8192})") + '\0' +
                                              R"({"op":"commit","path":"/empty","file_offset":0,"length":8192,)" +
                                              R"("block_checksums":[1,2],"size":5000})"});
    // The dedup op's unit lists, in the "units" form and the compact one.
    requests.push_back({"dedup-units", R"({"op":"dedup","path":"/empty","units":[0,1,2,262144,3,4]})"});
    requests.push_back({"dedup-unit-runs", R"({"op":"dedup","path":"/empty","unit_runs":[0,2,524288,1],)"
                                           R"("unit_hashes":"000102030405060708090a0b0c0d0e0f)"
                                           R"(101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f"})"});
    requests.push_back({"layout-after-commit", std::string(R"({"op":"layout","path":"/d/b.bin"})") + '\0' +
                                                   R"({"op":"layout","path":"/d/hard"})"});
  }
  for (const auto& [name, text] : requests) Write(dir, name, text);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  std::string out = argv[1];
  Records(out + "/records_fuzzer");
  Coding(out + "/coding_fuzzer");
  Control(out + "/inspector_control_fuzzer", false);
  Control(out + "/control_plane_fuzzer", true);
  return 0;
}
