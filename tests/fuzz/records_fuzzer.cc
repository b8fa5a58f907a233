// libFuzzer target: every record decoder of the index, and the key splitters,
// on arbitrary bytes (what a damaged or hostile index could hold).
//
// Properties: no decoder crashes or reads out of bounds (ASan), no undefined
// behaviour (UBSan); a record that decodes survives Encode -> Decode
// unchanged; a superblock block that decodes survives EncodeBlock ->
// DecodeBlock when its body fits its block; keys rebuilt from their parts are
// the same bytes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_util.h"
#include "spillfs/kvindex/keys.h"
#include "spillfs/kvindex/records.h"

namespace {

using namespace spillfs;

template <typename Record>
void RoundTrip(std::string_view input, const char* what) {
  auto decoded = Record::Decode(input);
  if (!decoded.ok()) {
    FUZZ_CHECK(!decoded.status().message().empty(), std::string(what) + ": refusal without a message");
    return;
  }
  std::string encoded = decoded->Encode();
  auto again = Record::Decode(encoded);
  FUZZ_CHECK(again.ok(), std::string(what) + ": re-encoded record refused: " + again.status().ToString());
  FUZZ_CHECK(*again == *decoded, std::string(what) + ": round trip changed the record");
  FUZZ_CHECK(again->Encode() == encoded, std::string(what) + ": encoding is not stable");
}

void Superblocks(std::string_view input) {
  RoundTrip<Superblock>(input, "superblock");
  auto block = Superblock::DecodeBlock(input);
  if (!block.ok()) return;
  std::string uuid = block->UuidString();
  FUZZ_CHECK(uuid.size() == 36, "uuid string of a decoded superblock");
  // EncodeBlock pads to the block size; only sizes a volume can have.
  if (block->block_size <= (1u << 20) && block->Encode().size() + 8 <= block->block_size) {
    std::string encoded = block->EncodeBlock();
    FUZZ_CHECK(encoded.size() == block->block_size, "EncodeBlock size");
    auto again = Superblock::DecodeBlock(encoded);
    FUZZ_CHECK(again.ok() && *again == *block, "superblock block round trip");
  }
}

void Keys(std::string_view input) {
  if (input.size() < 8) return;
  uint64_t ino = keys::DecodeIno(input);
  FUZZ_CHECK(keys::Ino(ino) == input.substr(0, 8), "inode key round trip");
  FUZZ_CHECK(keys::Dirent(ino, keys::DirentName(input)) == input, "dirent key round trip");
  FUZZ_CHECK(keys::Xattr(ino, keys::DirentName(input)) == input, "xattr key round trip");
  if (input.size() == 16) {
    FUZZ_CHECK(keys::Extent(ino, keys::ExtentOffset(input)) == input, "extent key round trip");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  RoundTrip<InodeRecord>(input, "inode");
  RoundTrip<DirentRecord>(input, "dirent");
  RoundTrip<ExtentRecord>(input, "extent");
  RoundTrip<BlobRecord>(input, "blob");
  Superblocks(input);
  Keys(input);
  // The same bytes behind each version byte, so every decoder gets past its
  // version check on every input.
  if (size > 0 && size < 4096) {
    std::string v1 = std::string(1, '\x01') + std::string(input.substr(1));
    RoundTrip<InodeRecord>(v1, "inode");
    RoundTrip<DirentRecord>(v1, "dirent");
    RoundTrip<ExtentRecord>(v1, "extent");
    RoundTrip<BlobRecord>(v1, "blob");
    RoundTrip<Superblock>(v1, "superblock");
  }
  return 0;
}
