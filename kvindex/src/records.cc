#include "spillfs/kvindex/records.h"

#include <fmt/format.h>

#include <algorithm>

#include "spillfs/kvindex/coding.h"

namespace spillfs {
namespace {

constexpr uint8_t kInodeVersion = 1;
constexpr uint8_t kDirentVersion = 1;
constexpr uint8_t kExtentVersion = 1;
constexpr uint8_t kSuperblockVersion = 1;
constexpr uint8_t kBlobVersion = 1;       // a blob of one unit, whole
constexpr uint8_t kSplitBlobVersion = 2;  // the head of a blob of several units
constexpr uint8_t kBlobContentVersion = 1;

Status Truncated(const char* what) { return Status::Corruption(fmt::format("{} record truncated", what)); }

Status CheckVersion(coding::Reader* reader, uint8_t expected, const char* what) {
  uint8_t version = 0;
  if (!reader->GetU8(&version)) return Truncated(what);
  if (version != expected) {
    return Status::Corruption(fmt::format("{} record has unknown version {}", what, version));
  }
  return Status::OK();
}

}  // namespace

std::string InodeRecord::Encode() const {
  std::string out;
  out.push_back(static_cast<char>(kInodeVersion));
  coding::PutVarint64(&out, mode);
  coding::PutVarint64(&out, uid);
  coding::PutVarint64(&out, gid);
  coding::PutVarint64(&out, nlink);
  coding::PutVarint64(&out, size);
  coding::PutVarsigned64(&out, atime_ns);
  coding::PutVarsigned64(&out, mtime_ns);
  coding::PutVarsigned64(&out, ctime_ns);
  coding::PutVarsigned64(&out, btime_ns);
  coding::PutVarint64(&out, generation);
  coding::PutVarint64(&out, flags);
  coding::PutVarint64(&out, rdev);
  coding::PutLengthPrefixed(&out, symlink_target);
  coding::PutVarint64(&out, allocated_bytes);
  coding::PutVarint64(&out, parent);
  return out;
}

Result<InodeRecord> InodeRecord::Decode(std::string_view bytes) {
  coding::Reader reader(bytes);
  SPILLFS_RETURN_IF_ERROR(CheckVersion(&reader, kInodeVersion, "inode"));
  InodeRecord r;
  std::string_view target;
  if (!reader.GetVarint32(&r.mode) || !reader.GetVarint32(&r.uid) || !reader.GetVarint32(&r.gid) ||
      !reader.GetVarint32(&r.nlink) || !reader.GetVarint64(&r.size) || !reader.GetVarsigned64(&r.atime_ns) ||
      !reader.GetVarsigned64(&r.mtime_ns) || !reader.GetVarsigned64(&r.ctime_ns) ||
      !reader.GetVarsigned64(&r.btime_ns) || !reader.GetVarint64(&r.generation) || !reader.GetVarint32(&r.flags) ||
      !reader.GetVarint64(&r.rdev) || !reader.GetLengthPrefixed(&target) || !reader.GetVarint64(&r.allocated_bytes) ||
      !reader.GetVarint64(&r.parent)) {
    return Truncated("inode");
  }
  r.symlink_target.assign(target);
  return r;
}

std::string DirentRecord::Encode() const {
  std::string out;
  out.push_back(static_cast<char>(kDirentVersion));
  coding::PutVarint64(&out, ino);
  coding::PutVarint64(&out, type);
  return out;
}

Result<DirentRecord> DirentRecord::Decode(std::string_view bytes) {
  coding::Reader reader(bytes);
  SPILLFS_RETURN_IF_ERROR(CheckVersion(&reader, kDirentVersion, "dirent"));
  DirentRecord r;
  if (!reader.GetVarint64(&r.ino) || !reader.GetVarint32(&r.type)) return Truncated("dirent");
  return r;
}

std::string ExtentRecord::Encode() const {
  std::string out;
  out.reserve(1 + 5 * 10 + 4 * block_checksums.size());
  out.push_back(static_cast<char>(kExtentVersion));
  coding::PutVarint64(&out, physical);
  coding::PutVarint64(&out, length);
  coding::PutVarint64(&out, flags);
  coding::PutVarint64(&out, blob_id);
  coding::PutVarint64(&out, block_checksums.size());
  AppendChecksums(&out, block_checksums);
  return out;
}

void AppendChecksums(std::string* out, const std::vector<uint32_t>& block_checksums) {
  out->reserve(out->size() + 4 * block_checksums.size());
  for (uint32_t sum : block_checksums) coding::PutFixed32BE(out, sum);
}

std::string EncodeExtent(uint64_t physical, uint64_t length, uint32_t flags, uint64_t blob_id,
                         std::string_view checksums) {
  std::string out;
  out.reserve(1 + 5 * 10 + checksums.size());
  out.push_back(static_cast<char>(kExtentVersion));
  coding::PutVarint64(&out, physical);
  coding::PutVarint64(&out, length);
  coding::PutVarint64(&out, flags);
  coding::PutVarint64(&out, blob_id);
  coding::PutVarint64(&out, checksums.size() / 4);
  out.append(checksums);
  return out;
}

Result<ExtentView> ExtentView::Parse(std::string_view bytes) {
  coding::Reader reader(bytes);
  SPILLFS_RETURN_IF_ERROR(CheckVersion(&reader, kExtentVersion, "extent"));
  ExtentView v;
  if (!reader.GetVarint64(&v.physical) || !reader.GetVarint64(&v.length) || !reader.GetVarint32(&v.flags) ||
      !reader.GetVarint64(&v.blob_id) || !reader.GetVarint64(&v.checksum_count) || v.checksum_count > bytes.size() ||
      !reader.GetBytes(v.checksum_count * 4, &v.checksums)) {
    return Truncated("extent");
  }
  return v;
}

namespace {

// The fields of `view` for its bytes [skip, skip + length), no checksums.
ExtentRecord ExtentFields(const ExtentView& view, uint64_t skip, uint64_t length) {
  ExtentRecord r;
  r.physical = view.physical + skip;
  r.length = length;
  r.flags = view.flags;
  r.blob_id = view.blob_id;
  return r;
}

// Decodes checksums [first, first + count) of `view` into r->block_checksums.
void DecodeChecksums(const ExtentView& view, uint64_t first, uint64_t count, ExtentRecord* r) {
  r->block_checksums.reserve(count);
  for (uint64_t i = first; i < first + count; ++i) {
    r->block_checksums.push_back(coding::DecodeFixed32BE(view.checksums.data() + 4 * i));
  }
}

}  // namespace

ExtentRecord ExtentView::Slice(uint64_t skip, uint64_t slice_length, uint64_t block_size) const {
  ExtentRecord r = ExtentFields(*this, skip, slice_length);
  const uint64_t first = skip / block_size;
  const uint64_t count = slice_length / block_size;
  if (checksum_count > 0 && first + count <= checksum_count) DecodeChecksums(*this, first, count, &r);
  return r;
}

ExtentRecord ExtentView::Record() const {
  ExtentRecord r = ExtentFields(*this, 0, length);
  DecodeChecksums(*this, 0, checksum_count, &r);
  return r;
}

Result<ExtentRecord> ExtentRecord::Decode(std::string_view bytes) {
  SPILLFS_ASSIGN_OR_RETURN(ExtentView view, ExtentView::Parse(bytes));
  return view.Record();
}

namespace {

void PutChecksums(std::string* out, const std::vector<uint32_t>& block_checksums) {
  std::string sums;
  AppendChecksums(&sums, block_checksums);
  coding::PutLengthPrefixed(out, sums);
}

Status GetChecksums(coding::Reader* reader, std::vector<uint32_t>* block_checksums) {
  std::string_view sums;
  if (!reader->GetLengthPrefixed(&sums) || sums.empty() || sums.size() % 4 != 0) {
    return Status::Corruption("blob checksums malformed");
  }
  block_checksums->reserve(sums.size() / 4);
  for (size_t i = 0; i < sums.size(); i += 4) block_checksums->push_back(coding::DecodeFixed32BE(sums.data() + i));
  return Status::OK();
}

}  // namespace

std::string BlobRecord::Encode() const {
  std::string out;
  if (split()) {
    out.push_back(static_cast<char>(kSplitBlobVersion));
    coding::PutVarint64(&out, std::max(units(), head_units));
    coding::PutVarint64(&out, length);
    coding::PutVarint64(&out, refs);
    return out;
  }
  out.push_back(static_cast<char>(kBlobVersion));
  coding::PutLengthPrefixed(&out, hash);
  coding::PutVarint64(&out, length);
  coding::PutVarint64(&out, refs);
  if (!block_checksums.empty()) PutChecksums(&out, block_checksums);
  return out;
}

std::string BlobRecord::EncodeContent() const {
  std::string out;
  out.reserve(1 + 10 + hash.size() + 10 + block_checksums.size() * 4);
  out.push_back(static_cast<char>(kBlobContentVersion));
  coding::PutLengthPrefixed(&out, hash);
  PutChecksums(&out, block_checksums);  // always, empty or not: a cut record never decodes
  return out;
}

Result<BlobRecord> BlobRecord::Decode(std::string_view bytes) {
  coding::Reader reader(bytes);
  uint8_t version = 0;
  if (!reader.GetU8(&version)) return Truncated("blob");
  BlobRecord r;
  if (version == kSplitBlobVersion) {
    if (!reader.GetVarint64(&r.head_units) || !reader.GetVarint64(&r.length) || !reader.GetVarint64(&r.refs)) {
      return Truncated("blob");
    }
    if (r.head_units < 2 || !reader.empty()) return Status::Corruption("blob head malformed");
    return r;
  }
  if (version != kBlobVersion) return Status::Corruption(fmt::format("blob record has unknown version {}", version));
  std::string_view hash;
  if (!reader.GetLengthPrefixed(&hash) || !reader.GetVarint64(&r.length) || !reader.GetVarint64(&r.refs)) {
    return Truncated("blob");
  }
  if (hash.size() != kHashBytes) return Status::Corruption("blob hash is not 16 bytes");
  r.hash.assign(hash);
  if (!reader.empty()) {
    SPILLFS_RETURN_IF_ERROR(GetChecksums(&reader, &r.block_checksums));
    if (!reader.empty()) return Status::Corruption("blob checksums malformed");
  }
  return r;
}

Result<BlobContentView> BlobContentView::Parse(std::string_view bytes) {
  coding::Reader reader(bytes);
  SPILLFS_RETURN_IF_ERROR(CheckVersion(&reader, kBlobContentVersion, "blob content"));
  BlobContentView view;
  if (!reader.GetLengthPrefixed(&view.hashes) || !reader.GetLengthPrefixed(&view.checksums)) {
    return Truncated("blob content");
  }
  if (view.hashes.empty() || view.hashes.size() % BlobRecord::kHashBytes != 0 || view.checksums.size() % 4 != 0 ||
      !reader.empty()) {
    return Status::Corruption("blob content malformed");
  }
  return view;
}

Status BlobRecord::DecodeContent(std::string_view bytes) {
  SPILLFS_ASSIGN_OR_RETURN(BlobContentView view, BlobContentView::Parse(bytes));
  return SetContent(view, /*with_checksums=*/true);
}

Status BlobRecord::SetContent(const BlobContentView& view, bool with_checksums) {
  if (view.hashes.size() != head_units * kHashBytes) {
    return Status::Corruption(
        fmt::format("blob content holds {} bytes of hashes, its head {} units", view.hashes.size(), head_units));
  }
  hash.assign(view.hashes);
  block_checksums.clear();
  if (!with_checksums) return Status::OK();
  block_checksums.reserve(view.checksums.size() / 4);
  for (size_t i = 0; i < view.checksums.size(); i += 4) {
    block_checksums.push_back(coding::DecodeFixed32BE(view.checksums.data() + i));
  }
  return Status::OK();
}

std::string BlobUnitRef::Encode() const {
  std::string out;
  coding::PutFixed64BE(&out, blob);
  if (unit != 0) coding::PutFixed64BE(&out, unit);
  return out;
}

Result<BlobUnitRef> BlobUnitRef::Decode(std::string_view bytes) {
  if (bytes.size() != 8 && bytes.size() != 16) {
    return Status::Corruption(fmt::format("blob hash record is {} bytes, not 8 or 16", bytes.size()));
  }
  BlobUnitRef ref;
  ref.blob = coding::DecodeFixed64BE(bytes.data());
  if (bytes.size() == 16) {
    ref.unit = coding::DecodeFixed64BE(bytes.data() + 8);
    if (ref.unit == 0) return Status::Corruption("blob hash record names unit 0 in 16 bytes");
  }
  return ref;
}

std::string Superblock::Encode() const {
  std::string out;
  out.push_back(static_cast<char>(kSuperblockVersion));
  coding::PutVarint64(&out, format_version);
  coding::PutLengthPrefixed(&out, uuid);
  coding::PutVarint64(&out, block_size);
  coding::PutVarint64(&out, data_offset);
  coding::PutVarint64(&out, data_size);
  out.push_back(static_cast<char>(backing));
  coding::PutLengthPrefixed(&out, device_path);
  coding::PutVarsigned64(&out, created_ns);
  out.push_back(checksums ? 1 : 0);
  out.push_back(dedup ? 1 : 0);
  return out;
}

Result<Superblock> Superblock::Decode(std::string_view bytes) {
  coding::Reader reader(bytes);
  SPILLFS_RETURN_IF_ERROR(CheckVersion(&reader, kSuperblockVersion, "superblock"));
  Superblock sb;
  std::string_view uuid, device;
  uint8_t backing = 0, checksums = 0, dedup = 0;
  if (!reader.GetVarint32(&sb.format_version) || !reader.GetLengthPrefixed(&uuid) ||
      !reader.GetVarint32(&sb.block_size) || !reader.GetVarint64(&sb.data_offset) ||
      !reader.GetVarint64(&sb.data_size) || !reader.GetU8(&backing) || !reader.GetLengthPrefixed(&device) ||
      !reader.GetVarsigned64(&sb.created_ns) || !reader.GetU8(&checksums) || !reader.GetU8(&dedup)) {
    return Truncated("superblock");
  }
  if (sb.format_version != kFormatVersion) {
    return Status::Corruption(fmt::format("volume format version {} is not supported (this build reads {})",
                                          sb.format_version, kFormatVersion));
  }
  if (uuid.size() != 16) return Status::Corruption("superblock uuid is not 16 bytes");
  if (backing != static_cast<uint8_t>(BackingKind::kImageFile) &&
      backing != static_cast<uint8_t>(BackingKind::kBlockDevice)) {
    return Status::Corruption(fmt::format("superblock names unknown backing kind {}", backing));
  }
  if (sb.block_size < 512 || (sb.block_size & (sb.block_size - 1)) != 0 || sb.data_offset % sb.block_size != 0 ||
      sb.data_size < sb.data_offset) {
    return Status::Corruption("superblock geometry is inconsistent");
  }
  sb.uuid.assign(uuid);
  sb.device_path.assign(device);
  sb.backing = static_cast<BackingKind>(backing);
  sb.checksums = checksums != 0;
  sb.dedup = dedup != 0;
  return sb;
}

std::string Superblock::EncodeBlock() const {
  std::string body = Encode();
  std::string out;
  coding::PutFixed32BE(&out, kSuperblockMagic);
  coding::PutFixed32BE(&out, static_cast<uint32_t>(body.size()));
  out += body;
  out.resize(block_size, '\0');
  return out;
}

Result<Superblock> Superblock::DecodeBlock(std::string_view block) {
  if (block.size() < 8 || coding::DecodeFixed32BE(block.data()) != kSuperblockMagic) {
    return Status::Corruption("no spillfs superblock at the start of the data area");
  }
  uint32_t length = coding::DecodeFixed32BE(block.data() + 4);
  if (length > block.size() - 8) return Status::Corruption("superblock length is out of range");
  return Decode(block.substr(8, length));
}

std::string Superblock::UuidString() const {
  std::string out;
  for (size_t i = 0; i < uuid.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out.push_back('-');
    out += fmt::format("{:02x}", static_cast<uint8_t>(uuid[i]));
  }
  return out;
}

}  // namespace spillfs
