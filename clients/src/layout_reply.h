// A fast reader of the daemon's "layout" reply. A 1 GiB file has 262144
// block checksums; a DOM parser spends ~80 ms on them, this reader a few.
// It reads any valid JSON (unknown keys are skipped) but builds only what the
// client uses; anything else (an error reply, an odd shape) makes it return
// false so the caller falls back to the general parser.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace spillfs::client {

struct LayoutExtent {
  uint64_t file_offset = 0;
  uint64_t physical_offset = 0;
  uint64_t length = 0;
  bool unwritten = false;
  std::vector<uint32_t> block_checksums;
  bool has_file_offset = false, has_physical_offset = false, has_length = false;
};

struct LayoutReply {
  uint64_t ino = 0;
  uint64_t size = 0;
  uint64_t block_size = 0;
  std::string data_path;
  bool checksums = false;
  std::vector<LayoutExtent> extents;
  bool has_size = false, has_block_size = false, has_data_path = false, has_extents = false;
};

// True when `text` is {"ok":true,"result":{...layout...}} and was read whole.
bool ParseLayoutReply(std::string_view text, LayoutReply* out);

}  // namespace spillfs::client
