#include "spillfs/kvindex/keys.h"

#include "spillfs/kvindex/coding.h"

namespace spillfs::keys {

std::string Ino(uint64_t ino) {
  std::string key;
  coding::PutFixed64BE(&key, ino);
  return key;
}

std::string Dirent(uint64_t parent, std::string_view name) {
  std::string key = Ino(parent);
  key.append(name);
  return key;
}

std::string Extent(uint64_t ino, uint64_t file_offset) {
  std::string key = Ino(ino);
  coding::PutFixed64BE(&key, file_offset);
  return key;
}

std::string Free(uint64_t physical) { return Ino(physical); }

std::string Xattr(uint64_t ino, std::string_view name) { return Dirent(ino, name); }

std::string BlobByHash(std::string_view hash) {
  std::string key = "h";
  key.append(hash);
  return key;
}

std::string BlobByPhysical(uint64_t physical) {
  std::string key = "p";
  coding::PutFixed64BE(&key, physical);
  return key;
}

std::string BlobContent(uint64_t physical) {
  std::string key = "d";
  coding::PutFixed64BE(&key, physical);
  return key;
}

uint64_t DecodeIno(std::string_view key) { return coding::DecodeFixed64BE(key.data()); }

std::string_view DirentName(std::string_view key) { return key.substr(8); }

uint64_t ExtentOffset(std::string_view key) { return coding::DecodeFixed64BE(key.data() + 8); }

}  // namespace spillfs::keys
