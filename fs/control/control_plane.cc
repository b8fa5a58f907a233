#include "spillfs/control/control_plane.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <xxhash.h>

#include <array>
#include <climits>
#include <exception>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace spillfs {

using control::ErrorReply;
using control::OkReply;
using control::ReplyText;

ControlPlane::ControlPlane(Filesystem* fs) : fs_(fs), started_(std::chrono::steady_clock::now()) {}

ControlPlane::~ControlPlane() {
  for (const std::unique_ptr<Handle>& handle : handles_.TakeAll()) ReleaseHandle(*handle);
}

Entry ControlPlane::MakeEntry(InodeNumber ino) const {
  Entry entry;
  entry.ino = ino;
  entry.generation = 1;
  struct stat& st = entry.attr;
  st.st_ino = ino;
  // The control file is everyone's: what a caller may ask is the dispatcher's
  // to decide, by op (control::kUnprivilegedOps).
  st.st_mode = ino == kDirIno ? (S_IFDIR | 0755) : ino == kControlIno ? (S_IFREG | 0666) : (S_IFREG | 0444);
  st.st_nlink = ino == kDirIno ? 2 : 1;
  st.st_blksize = 4096;
  return entry;
}

std::optional<Entry> ControlPlane::Lookup(InodeNumber parent, std::string_view name) const {
  if (parent == kRootInode && name == kDirName) return MakeEntry(kDirIno);
  if (parent != kDirIno) return std::nullopt;
  if (name == control::kControlName) return MakeEntry(kControlIno);
  if (name == control::kStatsName) return MakeEntry(kStatsIno);
  if (name == ".") return MakeEntry(kDirIno);
  return std::nullopt;
}

Result<Entry> ControlPlane::GetAttr(InodeNumber ino) const {
  if (!Owns(ino)) return Status::NotFound();
  return MakeEntry(ino);
}

Result<std::vector<DirEntry>> ControlPlane::ReadDir(InodeNumber ino) const {
  if (ino != kDirIno) return Status::Error(ENOTDIR, "not a directory");
  return std::vector<DirEntry>{{".", kDirIno, S_IFDIR},
                               {"..", kRootInode, S_IFDIR},
                               {control::kControlName, kControlIno, S_IFREG},
                               {control::kStatsName, kStatsIno, S_IFREG}};
}

Result<ControlPlane::Handle*> ControlPlane::Open(InodeNumber ino, int flags, uint32_t opener_uid) {
  if (ino == kDirIno) return Status::Error(EISDIR, "is a directory");
  if (ino == kStatsIno && (flags & O_ACCMODE) != O_RDONLY) return Status::Error(EACCES, "stats is read-only");
  auto handle = std::make_unique<Handle>();
  handle->ino = ino;
  handle->opener_uid = opener_uid;
  return handles_.Add(std::move(handle));
}

Result<size_t> ControlPlane::Write(Handle* handle, uint64_t offset, std::string_view data,
                                   const RequestCaller& caller) {
  if (handle->ino != kControlIno) return Status::Error(EBADF, "not writable");
  if (offset > control::kMaxRequestBytes || data.size() > control::kMaxRequestBytes - offset) {
    return Status::Error(EFBIG, "control request too large");
  }
  MutexLock lock(&handle->mu);
  // A request starts with its write at offset 0 (or the handle's first):
  // its caller is that writer's.
  if (offset == 0 || !handle->caller) {
    if (handle->caller && handle->caller->uid != caller.uid) handle->memory.reset();  // another user's mapping
    handle->caller = caller;
    handle->mixed = false;
    handle->writer = CallerThread::Identify(caller.pid);
  } else if (caller.uid != handle->caller->uid || caller.pid != handle->caller->pid) {
    handle->mixed = true;
  }
  if (handle->request.size() < offset + data.size()) handle->request.resize(offset + data.size());
  handle->request.replace(offset, data.size(), data);
  handle->reply.reset();  // a new request gets a new answer
  return data.size();
}

namespace {

// JSON numbers arrive as any type; converting a float or a negative number
// to an unsigned integer is undefined, so every field is checked first.
Result<uint64_t> UnsignedField(const nlohmann::json& request, const char* key, std::optional<uint64_t> fallback) {
  if (!request.contains(key)) {
    if (fallback) return *fallback;
    return Status::Error(EINVAL, fmt::format("request lacks \"{}\"", key));
  }
  const nlohmann::json& value = request[key];
  if (!value.is_number_unsigned()) {
    return Status::Error(EINVAL, fmt::format("\"{}\" must be a non-negative integer", key));
  }
  return value.get<uint64_t>();
}

Result<std::vector<uint32_t>> ChecksumsField(const nlohmann::json& request) {
  std::vector<uint32_t> out;
  if (!request.contains("block_checksums")) return out;
  const nlohmann::json& value = request["block_checksums"];
  if (!value.is_array()) return Status::Error(EINVAL, "\"block_checksums\" must be an array");
  out.reserve(value.size());
  for (const nlohmann::json& sum : value) {
    if (!sum.is_number_unsigned() || sum.get<uint64_t>() > UINT32_MAX) {
      return Status::Error(EINVAL, "\"block_checksums\" holds a value that is not a 32-bit checksum");
    }
    out.push_back(static_cast<uint32_t>(sum.get<uint64_t>()));
  }
  return out;
}

// A flat array of unsigned 64-bit numbers ("hashes": low, high, ...; "units":
// offset, low, high, ...), whose length is a multiple of `group`.
Result<std::vector<uint64_t>> NumbersField(const nlohmann::json& request, const char* key, size_t group) {
  std::vector<uint64_t> out;
  if (!request.contains(key)) return out;
  const nlohmann::json& value = request[key];
  if (!value.is_array() || value.size() % group != 0) {
    return Status::Error(EINVAL, fmt::format("\"{}\" must be an array of {}-tuples of numbers", key, group));
  }
  out.reserve(value.size());
  for (const nlohmann::json& v : value) {
    if (!v.is_number_unsigned())
      return Status::Error(EINVAL, fmt::format("\"{}\" holds a value that is not a u64", key));
    out.push_back(v.get<uint64_t>());
  }
  return out;
}

// The 16 bytes of an XXH3-128 hash given as (low, high), as Dedup::Hash lays them out.
std::string HashBytes(uint64_t low, uint64_t high) {
  XXH128_hash_t h{low, high};
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
}

// "units": [file_offset, low, high, ...] as DirectUnits (their order and
// offsets are Filesystem's to check).
Result<std::vector<DirectUnit>> TupleUnits(const nlohmann::json& request) {
  auto numbers = NumbersField(request, "units", 3);
  if (!numbers.ok()) return numbers.status();
  std::vector<DirectUnit> units;
  units.reserve(numbers->size() / 3);
  for (size_t i = 0; i < numbers->size(); i += 3) {
    units.push_back(DirectUnit{(*numbers)[i], HashBytes((*numbers)[i + 1], (*numbers)[i + 2])});
  }
  return units;
}

// The value of each byte as a lowercase hex digit, or -1.
constexpr std::array<int8_t, 256> kHexValue = [] {
  std::array<int8_t, 256> v{};
  v.fill(-1);
  for (int d = 0; d < 10; ++d) v['0' + d] = static_cast<int8_t>(d);
  for (int d = 0; d < 6; ++d) v['a' + d] = static_cast<int8_t>(10 + d);
  return v;
}();

// The compact unit list: "unit_runs": [offset, count, ...] (runs of `count`
// consecutive dedup units from `offset`; offsets multiples of the unit, runs
// sorted and disjoint) with "unit_hashes": 32 lowercase hex digits a unit,
// the 16 bytes of its XXH3-128 as HashBytes lays them out, units in the
// order of the runs. A save's units are a few hundred runs, so the request
// carries a few hundred numbers, not three per unit. The message of a
// refusal names the run or the unit.
Result<std::vector<DirectUnit>> CompactUnits(const nlohmann::json& request) {
  if (!request.contains("unit_runs") || !request.contains("unit_hashes")) {
    return Status::Error(EINVAL, fmt::format(R"("unit_runs" and "unit_hashes" go together: the request lacks "{}")",
                                             request.contains("unit_runs") ? "unit_hashes" : "unit_runs"));
  }
  auto runs = NumbersField(request, "unit_runs", 2);
  if (!runs.ok()) return runs.status();
  const nlohmann::json& hashes = request["unit_hashes"];
  if (!hashes.is_string()) return Status::Error(EINVAL, R"("unit_hashes" must be a string of hex digits)");
  const std::string& hex = hashes.get_ref<const std::string&>();
  const uint64_t unit = Filesystem::dedup_unit();
  uint64_t total = 0, end = 0;
  for (size_t r = 0; r < runs->size(); r += 2) {
    const uint64_t offset = (*runs)[r], count = (*runs)[r + 1], k = r / 2;
    if (offset % unit != 0) {
      return Status::Error(EINVAL, fmt::format("unit run {} at file offset {} is not at a multiple of the dedup unit "
                                               "({} bytes)",
                                               k, offset, unit));
    }
    if (count == 0) return Status::Error(EINVAL, fmt::format("unit run {} at file offset {} has no units", k, offset));
    if (r > 0 && offset < end) {
      return Status::Error(EINVAL, fmt::format("unit runs must be sorted by file offset without overlap: run {} at {} "
                                               "starts before run {} ends at {}",
                                               k, offset, k - 1, end));
    }
    if (count > (UINT64_MAX - offset) / unit) {
      return Status::Error(EFBIG, fmt::format("unit run {} at file offset {} of {} units is past the largest file "
                                              "offset",
                                              k, offset, count));
    }
    end = offset + count * unit;
    total += count;  // runs are disjoint within 2^64 bytes: no overflow
  }
  if (hex.size() % 32 != 0 || hex.size() / 32 != total) {
    return Status::Error(EINVAL, fmt::format(R"("unit_hashes" holds {} hex digits; the unit runs hold {} units, )"
                                             "32 digits each",
                                             hex.size(), total));
  }
  std::vector<DirectUnit> units;
  units.reserve(total);
  const char* digits = hex.data();
  char bytes[16];
  for (size_t r = 0; r < runs->size(); r += 2) {
    for (uint64_t i = 0, offset = (*runs)[r]; i < (*runs)[r + 1]; ++i, offset += unit, digits += 32) {
      for (int b = 0; b < 16; ++b) {
        const int hi = kHexValue[static_cast<uint8_t>(digits[2 * b])];
        const int lo = kHexValue[static_cast<uint8_t>(digits[2 * b + 1])];
        if ((hi | lo) < 0) {
          const size_t at = 2 * b + (hi < 0 ? 0 : 1);
          const auto c = static_cast<uint8_t>(digits[at]);
          return Status::Error(EINVAL, fmt::format(R"("unit_hashes": unit {} (file offset {}) has {} at digit {} of )"
                                                   "its hash, not a lowercase hex digit",
                                                   units.size(), offset,
                                                   c >= 0x20 && c < 0x7f ? fmt::format("'{}'", static_cast<char>(c))
                                                                         : fmt::format("byte 0x{:02x}", c),
                                                   at));
        }
        bytes[b] = static_cast<char>(hi << 4 | lo);
      }
      units.push_back(DirectUnit{offset, std::string(bytes, sizeof(bytes))});
    }
  }
  return units;
}

// Whether the request gives its units in the compact form (CompactUnits).
bool HasCompactUnits(const nlohmann::json& request) {
  return request.contains("unit_runs") || request.contains("unit_hashes");
}

// The units of a dedup or commit request: "units" or the compact form
// (CompactUnits), not both; none where neither is given.
Result<std::vector<DirectUnit>> UnitsField(const nlohmann::json& request, const char* op) {
  if (!HasCompactUnits(request)) return TupleUnits(request);
  if (request.contains("units")) {
    return Status::Error(EINVAL, fmt::format(R"({} takes "units" or "unit_runs" with "unit_hashes", not both)", op));
  }
  return CompactUnits(request);
}

// The layout reply, written directly: a big file's layout holds one checksum
// per block (262,144 a GiB), and building it as a json document and then
// serialising it took ~17 ms a GiB, ~4% of a direct read of the file.
std::string LayoutReply(const DirectLayout& layout, const Superblock& sb, const std::string& data_path) {
  std::string out = fmt::format(R"({{"ok":true,"result":{{"ino":{},"size":{},"block_size":{},"data_path":{},)"
                                R"("checksums":{},"extents":[)",
                                layout.ino, layout.size, sb.block_size, nlohmann::json(data_path).dump(),
                                sb.checksums ? "true" : "false");
  auto back = std::back_inserter(out);
  bool first = true;
  for (const auto& [offset, e] : layout.extents) {
    fmt::format_to(back,
                   R"({}{{"file_offset":{},"physical_offset":{},"length":{},"unwritten":{},)"
                   R"("block_checksums":[{}]}})",
                   first ? "" : ",", offset, e.physical, e.length, e.unwritten() ? "true" : "false",
                   fmt::join(e.block_checksums, ","));
    first = false;
  }
  out += "]}}";
  return out;
}

// ---- memory I/O fields ----

// A descriptor number of the caller's: EBADF for a number no descriptor can
// have (negative, or past INT_MAX), as write(2) gives for one.
Result<int> DescriptorField(const nlohmann::json& request, const char* key) {
  if (!request.contains(key)) return Status::Error(EINVAL, fmt::format("request lacks \"{}\"", key));
  const nlohmann::json& value = request[key];
  if (!value.is_number_integer()) return Status::Error(EINVAL, fmt::format("\"{}\" must be an integer", key));
  const bool valid = value.is_number_unsigned() ? value.get<uint64_t>() <= INT_MAX
                                                : value.get<int64_t>() >= 0 && value.get<int64_t>() <= INT_MAX;
  if (!valid) return Status::Error(EBADF, fmt::format("\"{}\" {} is not a descriptor number", key, value.dump()));
  return static_cast<int>(value.get<int64_t>());
}

// "pieces": [memory offset, file offset, length, ...], at most
// control::kMaxMemoryPieces (E2BIG: counted before any is read). Their
// rules are Filesystem's (MemoryWrite, MemoryRead).
Result<std::vector<Filesystem::MemoryPiece>> PiecesField(const nlohmann::json& request) {
  if (!request.contains("pieces")) return Status::Error(EINVAL, "request lacks \"pieces\"");
  const nlohmann::json& value = request["pieces"];
  if (!value.is_array() || value.size() % 3 != 0) {
    return Status::Error(EINVAL, "\"pieces\" must be an array of triples: memory offset, file offset, length");
  }
  if (value.size() / 3 > control::kMaxMemoryPieces) {
    return Status::Error(
        E2BIG, fmt::format("{} pieces: a request takes at most {}", value.size() / 3, control::kMaxMemoryPieces));
  }
  std::vector<Filesystem::MemoryPiece> pieces(value.size() / 3);
  for (size_t i = 0; i < value.size(); ++i) {
    if (!value[i].is_number_unsigned()) {
      return Status::Error(EINVAL, fmt::format("\"pieces\" holds a value that is not a u64 (piece {})", i / 3));
    }
    const uint64_t v = value[i].get<uint64_t>();
    Filesystem::MemoryPiece& piece = pieces[i / 3];
    (i % 3 == 0 ? piece.memory : i % 3 == 1 ? piece.file : piece.length) = v;
  }
  return pieces;
}

Result<bool> BoolField(const nlohmann::json& request, const char* key, bool fallback) {
  if (!request.contains(key)) return fallback;
  if (!request[key].is_boolean()) return Status::Error(EINVAL, fmt::format("\"{}\" must be true or false", key));
  return request[key].get<bool>();
}

}  // namespace

std::string ControlPlane::AnswerMemory(Handle& handle, const nlohmann::json& request) {
  const std::string op = request[control::key::kOp].get<std::string>();
  const bool write = op == control::op::kMemWrite;
  auto fail = [](const Status& s) { return ReplyText(ErrorReply(s)); };
  // The request's own fields first: nothing of the caller's is looked at
  // for a malformed request.
  auto fd = DescriptorField(request, "fd");
  auto memfd = DescriptorField(request, "memfd");
  auto pieces = PiecesField(request);
  auto size = write ? UnsignedField(request, "size", std::nullopt) : Result<uint64_t>(uint64_t{0});
  auto dedup = write ? BoolField(request, "dedup", false) : Result<bool>(false);
  for (const Status& s : {fd.status(), memfd.status(), pieces.status(), size.status(), dedup.status()}) {
    if (!s.ok()) return fail(s);
  }
  if (mount_device_.empty()) {
    return fail(Status::Error(ENOTSUP, "memory I/O is off: the daemon did not find its mount in its mountinfo"));
  }
  if (!handle.writer.ok()) return fail(handle.writer.status());
  auto process = CallerProcess::Open(*handle.writer);  // for this request only
  if (!process.ok()) return fail(process.status());
  const CallerProcess& caller = *process;
  auto ino =
      caller.FileOnMount(*fd, write ? CallerProcess::Access::kWrite : CallerProcess::Access::kRead, mount_device_);
  if (!ino.ok()) return fail(ino.status());
  if (Owns(*ino)) {
    return fail(Status::Error(EINVAL, fmt::format("fd {} is a file of the control plane ({}), not a regular file of "
                                                  "the volume",
                                                  *fd, kDirName)));
  }
  if (write) {
    // The caller's file size limit, which the kernel applies to a write
    // through the mount (a sandbox's bound on what it may write).
    auto limit = caller.FileSizeLimit();
    if (!limit.ok()) return fail(limit.status());
    for (const Filesystem::MemoryPiece& p : *pieces) {
      if (*limit && (p.length > **limit || p.file > **limit - p.length)) {
        return fail(Status::Error(EFBIG, fmt::format("a piece (file offset {}, length {}) ends past the caller's "
                                                     "file size limit (RLIMIT_FSIZE: {} bytes)",
                                                     p.file, p.length, **limit)));
      }
    }
  }
  auto opened = caller.OpenMemory(*memfd);
  if (!opened.ok()) return fail(opened.status());
  if (opened->size() > control::kMaxSharedMemoryBytes) {  // mapped whole and kept: the daemon's address space
    return fail(Status::Error(EINVAL, fmt::format("memfd {} holds {} bytes: memory I/O maps at most {}", *memfd,
                                                  opened->size(), control::kMaxSharedMemoryBytes)));
  }
  // After the look-ups: the descriptors just looked at were the caller's.
  if (Status same = caller.CheckCredentials(); !same.ok()) return fail(same);
  if (!handle.memory || !handle.memory->SameAs(*opened)) {
    DropMemory(handle);  // the old mapping goes first
    if (Status mapped = opened->Map(); !mapped.ok()) return fail(mapped);
    handle.memory = std::move(*opened);
    mappings_kept_.fetch_add(1, std::memory_order_relaxed);
  }
  const CallerMemory& memory = *handle.memory;
  std::string reply;
  if (!write) {
    auto file_size =
        memory.writable()
            ? fs_->MemoryRead(*ino, memory.data(), memory.size(), *pieces)
            : Result<uint64_t>(Status::Error(
                  EINVAL, fmt::format("memfd {} is sealed against writing: mem_read cannot fill it", *memfd)));
    reply = file_size.ok() ? ReplyText(OkReply({{"ino", *ino}, {"size", *file_size}})) : fail(file_size.status());
  } else {
    // Set-id bits may go even where the write fails later: the kernel's
    // cached mode must go too (by Read, once no lock is held).
    handle.invalidate = *ino;
    auto written = fs_->MemoryWrite(*ino, memory.data(), memory.size(), *pieces, *size, *dedup,
                                    /*privileged=*/handle.caller && handle.caller->uid == 0 && handle.opener_uid == 0);
    reply =
        written.ok()
            ? ReplyText(OkReply(
                  {{"ino", *ino}, {"written_bytes", written->written_bytes}, {"mapped_bytes", written->mapped_bytes}}))
            : fail(written.status());
  }
  if (mappings_kept_.load(std::memory_order_relaxed) > kMaxKeptMappings) DropMemory(handle);
  return reply;
}

void ControlPlane::DropMemory(Handle& handle) {
  if (!handle.memory) return;
  handle.memory.reset();
  mappings_kept_.fetch_sub(1, std::memory_order_relaxed);
}

std::string ControlPlane::AnswerDirect(Handle& handle, const nlohmann::json& request, const Inspector& inspector) {
  using nlohmann::json;
  const std::string op = request[control::key::kOp].get<std::string>();
  auto fail = [](const Status& s) { return ReplyText(ErrorReply(s)); };
  const Superblock& sb = fs_->volume().superblock();
  std::string data_path = fs_->volume().store().path();
  try {
    if (op == control::op::kReserve) {
      auto length = UnsignedField(request, "length", std::nullopt);
      if (!length.ok()) return fail(length.status());
      auto space = fs_->DirectReserve(*length);
      if (!space.ok()) return fail(space.status());
      json extents = json::array();
      for (const PhysicalExtent& e : *space) extents.push_back({{"physical_offset", e.offset}, {"length", e.length}});
      handle.reserved.insert(handle.reserved.end(), space->begin(), space->end());
      return ReplyText(OkReply({{"extents", extents}, {"data_path", data_path}, {"block_size", sb.block_size}}));
    }
    auto ino = inspector.ResolvePath(request.at("path").get<std::string>());
    if (!ino.ok()) return fail(ino.status());
    if (op == control::op::kLayout) {
      if (!handle.pin) handle.pin = fs_->PinBlocks();  // before the lookup: no block of it can be reused
      auto layout = fs_->GetDirectLayout(*ino);
      if (!layout.ok()) return fail(layout.status());
      return LayoutReply(*layout, sb, data_path);
    }
    if (op == control::op::kDedup) {
      // {"op":"dedup","path":P,"file_offset":N,"hashes":[low0,high0,low1,high1,...]}: the XXH3-128 of
      // consecutive dedup units from N; or {"op":"dedup","path":P,"units":[offset0,low0,high0,...]}:
      // units anywhere in the file, sorted by offset (a whole checkpoint in one request: one flush,
      // one batch); or the same units as "unit_runs" with "unit_hashes" (CompactUnits). Reply:
      // "needed" (1: the client must write the unit; 0: mapped by reference), in the order given,
      // "unit_bytes", "mapped_bytes"; for the compact form "needed" is a string of '1' and '0'.
      Result<std::vector<bool>> mapped = std::vector<bool>();
      const bool compact = HasCompactUnits(request);
      if (compact || request.contains("units")) {
        if (request.contains("hashes") || request.contains("file_offset")) {
          return fail(Status::Error(EINVAL, compact
                                                ? R"(dedup takes "unit_runs" with "unit_hashes" or "file_offset" )"
                                                  R"(with "hashes", not both)"
                                                : R"(dedup takes "units" or "file_offset" with "hashes", not both)"));
        }
        auto units = UnitsField(request, "dedup");
        if (!units.ok()) return fail(units.status());
        mapped = fs_->DirectDedup(*ino, *units);
      } else {
        auto file_offset = UnsignedField(request, "file_offset", std::nullopt);
        if (!file_offset.ok()) return fail(file_offset.status());
        auto numbers = NumbersField(request, "hashes", 2);
        if (!numbers.ok()) return fail(numbers.status());
        std::vector<std::string> hashes;
        hashes.reserve(numbers->size() / 2);
        for (size_t i = 0; i < numbers->size(); i += 2) hashes.push_back(HashBytes((*numbers)[i], (*numbers)[i + 1]));
        mapped = fs_->DirectDedup(*ino, *file_offset, hashes);
      }
      if (!mapped.ok()) return fail(mapped.status());
      std::string needed;
      needed.reserve(mapped->size() * 2);
      uint64_t mapped_bytes = 0;
      for (size_t i = 0; i < mapped->size(); ++i) {
        if (i > 0 && !compact) needed.push_back(',');
        needed.push_back((*mapped)[i] ? '0' : '1');
        if ((*mapped)[i]) mapped_bytes += Filesystem::dedup_unit();
      }
      if (mapped_bytes > 0) handle.invalidate = *ino;  // by Read, once no lock is held
      return fmt::format(R"({{"ok":true,"result":{{"ino":{},"unit_bytes":{},"mapped_bytes":{},"needed":{}{}{}}}}})",
                         *ino, Filesystem::dedup_unit(), mapped_bytes, compact ? '"' : '[', needed,
                         compact ? '"' : ']');
    }
    // Optional "ranges": [file_offset, length, ...]: the reserved space goes back to back over these
    // file ranges (sorted, disjoint) instead of from one "file_offset" (Filesystem::DirectCommit).
    auto range_numbers = NumbersField(request, "ranges", 2);
    if (!range_numbers.ok()) return fail(range_numbers.status());
    const bool ranged = request.contains("ranges");
    if (ranged && request.contains("file_offset")) {
      return fail(Status::Error(EINVAL, "commit takes \"ranges\" or \"file_offset\", not both"));
    }
    auto length_field = UnsignedField(request, "length", std::nullopt);
    auto file_offset = ranged ? Result<uint64_t>(uint64_t{0}) : UnsignedField(request, "file_offset", std::nullopt);
    auto size = UnsignedField(request, "size", uint64_t{0});
    auto checksums = ChecksumsField(request);
    // Optional "units": [file_offset, low, high, ...], or "unit_runs" with "unit_hashes"
    // (CompactUnits): whole dedup units of the range and the XXH3-128 of the bytes written there,
    // which may become blobs (Filesystem::DirectCommit).
    auto units = UnitsField(request, "commit");
    for (const Status& s :
         {length_field.status(), file_offset.status(), size.status(), checksums.status(), units.status()}) {
      if (!s.ok()) return fail(s);
    }
    uint64_t length = *length_field;
    uint64_t reserved = 0;
    for (const PhysicalExtent& e : handle.reserved) reserved += e.length;
    if (length != reserved) {
      return fail(Status::Error(EINVAL, fmt::format("commit length {} != reserved {}", length, reserved)));
    }
    Filesystem::FileRanges ranges;
    if (ranged) {
      ranges.reserve(range_numbers->size() / 2);
      for (size_t i = 0; i < range_numbers->size(); i += 2) {
        const uint64_t start = (*range_numbers)[i], n = (*range_numbers)[i + 1];
        if (start + n < start) return fail(Status::Error(EFBIG, "a commit range is past the largest file offset"));
        ranges.emplace_back(start, start + n);
      }
    }
    Status committed = ranged ? fs_->DirectCommit(*ino, ranges, handle.reserved, *checksums, *size, *units)
                              : fs_->DirectCommit(*ino, *file_offset, handle.reserved, *checksums, *size, *units);
    if (!committed.ok()) return fail(committed);
    handle.reserved.clear();
    handle.invalidate = *ino;  // by Read, once no lock is held
    return ReplyText(OkReply({{"ino", *ino}}));
  } catch (const json::exception& e) {
    return fail(Status::Error(EINVAL, std::string("malformed request: ") + e.what()));
  }
}

namespace {

// Where the dispatcher sends each op.
enum class Route {
  kQuery,    // Inspector
  kListing,  // Inspector, once the RAM tier is flushed (listings show extents)
  kDirect,   // Filesystem, through the handle (the lease)
  kMemory,   // Filesystem's memory I/O, on the caller's descriptors
};
struct OpRoute {
  const char* op;
  Route route;
};
constexpr OpRoute kRoutes[] = {
    {control::op::kStat, Route::kQuery},      {control::op::kVolume, Route::kQuery},
    {control::op::kLs, Route::kListing},      {control::op::kDu, Route::kListing},
    {control::op::kLayout, Route::kDirect},   {control::op::kReserve, Route::kDirect},
    {control::op::kCommit, Route::kDirect},   {control::op::kDedup, Route::kDirect},
    {control::op::kMemWrite, Route::kMemory}, {control::op::kMemRead, Route::kMemory},
};

// Why an op is root's, for the refusal of a caller that is not root: each
// op that is not in control::kUnprivilegedOps.
constexpr std::pair<const char*, const char*> kRootOnly[] = {
    {control::op::kLayout, "it hands out the data area"},
    {control::op::kReserve, "it hands out the data area"},
    {control::op::kCommit, "it maps blocks with the checksums and hashes the caller vouches for"},
    {control::op::kDedup, "it maps blobs by the hashes the caller vouches for"},
    {control::op::kLs, "it lists names and extents regardless of permissions"},
    {control::op::kDu, "it walks trees regardless of permissions"},
};

bool Unprivileged(const std::string& op) {
  for (const char* allowed : control::kUnprivilegedOps) {
    if (op == allowed) return true;
  }
  return false;
}

// EACCES for `op` from a caller that is not root.
Status RootOnly(const std::string& op) {
  for (const auto& [name, why] : kRootOnly) {
    if (op == name) return Status::Error(EACCES, fmt::format("op '{}' is root's: {}", op, why));
  }
  return Status::Error(EACCES, fmt::format("op '{}' is not one a caller other than root may send (those are {})", op,
                                           fmt::join(control::kUnprivilegedOps, ", ")));
}

// kQuery for an op that is none of them: AnswerQuery refuses it as unknown.
Route RouteOf(const std::string& op) {
  for (const OpRoute& r : kRoutes) {
    if (op == r.op) return r.route;
  }
  return Route::kQuery;
}

// Where the compact unit list's hex digits lie in `text` (CompactUnits): the
// value of a top-level "unit_hashes" key spelled as the client library writes
// it ("unit_hashes":"<lowercase hex digits>", right after '{' or ','), or
// nothing. A checkpoint's are a third of a megabyte, which the JSON lexer
// took 2.9 ms to read on the GPU host, most of a dedup request's handling.
std::optional<std::string_view> CuttableUnitHashes(std::string_view text) {
  static constexpr std::string_view kKey = R"("unit_hashes":")";
  const size_t at = text.find(kKey);
  if (at == std::string_view::npos || at == 0 || (text[at - 1] != '{' && text[at - 1] != ',')) return std::nullopt;
  size_t end = at + kKey.size();
  while (end < text.size() && kHexValue[static_cast<uint8_t>(text[end])] >= 0) ++end;
  if (end == text.size() || text[end] != '"') return std::nullopt;
  // At the top level of the object: not inside a string, one brace deep.
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < at; ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  if (in_string || depth != 1) return std::nullopt;
  return text.substr(at + kKey.size(), end - at - kKey.size());
}

// The request as an object with a string op, or why not. Compact unit hashes
// spelled as CuttableUnitHashes finds them are cut out of the text before it
// is parsed and put back into the object as the string they are.
Result<nlohmann::json> ParseRequest(std::string_view text) {
  const std::optional<std::string_view> hex = CuttableUnitHashes(text);
  std::string rest;
  if (hex) {
    rest.reserve(text.size() - hex->size());
    rest.append(text.data(), hex->data()).append(hex->data() + hex->size(), text.data() + text.size());
  }
  nlohmann::json request =
      nlohmann::json::parse(hex ? std::string_view(rest) : text, nullptr, /*allow_exceptions=*/false);
  if (hex && request.is_object()) {
    auto it = request.find("unit_hashes");
    if (it != request.end() && it->is_string() && it->get_ref<const std::string&>().empty()) *it = std::string(*hex);
  }
  if (request.is_discarded() || !request.is_object()) return Status::Invalid("the request is not a JSON object");
  if (!request.contains(control::key::kOp) || !request[control::key::kOp].is_string()) {
    return Status::Invalid("the request has no \"op\"");
  }
  return request;
}

// The inspection ops; any other op is unknown.
nlohmann::json AnswerQuery(const Inspector& inspector, const nlohmann::json& request, const RuntimeStats& runtime) {
  using nlohmann::json;
  const std::string op = request[control::key::kOp].get<std::string>();
  auto flag = [&](const char* name) { return request.value(name, false); };
  Result<json> result = Status::Invalid(fmt::format("unknown op '{}'", op));
  if (op == control::op::kStat) {
    result = inspector.Stat(runtime);
  } else if (op == control::op::kVolume) {
    result = inspector.Volume();
  } else if (op == control::op::kLs) {
    if (!request.contains("paths") || !request["paths"].is_array()) {
      result = Status::Invalid("ls needs \"paths\": a list of paths");
    } else {
      auto paths = request["paths"].get<std::vector<std::string>>();
      result = inspector.Ls(
          paths, Inspector::LsOptions{
                     .long_format = flag("long"), .extents = flag("extents"), .directory = flag("directory")});
    }
  } else if (op == control::op::kDu) {
    if (!request.contains("path") || !request["path"].is_string()) {
      result = Status::Invalid("du needs \"path\"");
    } else {
      result = inspector.Du(request["path"].get<std::string>());
    }
  }
  if (result.ok() && (op == control::op::kStat || op == control::op::kVolume)) {
    (*result)[control::kProtocolVersionKey] = control::kProtocolVersion;
  }
  return result.ok() ? OkReply(std::move(result).value()) : ErrorReply(result.status());
}

// Runs `answer`; a request must never stop the daemon, so what it throws
// becomes a refusal.
template <typename Fn>
std::string Guarded(Fn&& answer) {
  try {
    return answer();
  } catch (const nlohmann::json::exception& e) {
    return ReplyText(ErrorReply(Status::Invalid(fmt::format("bad request: {}", e.what()))));
  } catch (const std::exception& e) {
    return ReplyText(ErrorReply(Status::IOError(e.what())));
  }
}

}  // namespace

std::string ControlPlane::AnswerInspection(const Inspector& inspector, std::string_view text,
                                           const RuntimeStats& runtime) {
  return Guarded([&] {
    auto request = ParseRequest(text);
    if (!request.ok()) return ReplyText(ErrorReply(request.status()));
    return ReplyText(AnswerQuery(inspector, *request, runtime));
  });
}

std::string ControlPlane::Answer(Handle& handle) {
  Volume& volume = fs_->volume();
  Inspector inspector(volume.index(), volume.superblock());
  if (handle.ino == kStatsIno) {
    MutexLock lock(&mu_);
    auto stat = inspector.Stat(Runtime());
    return stat.ok() ? PrometheusText(*stat) : fmt::format("# error: {}\n", stat.status().ToString());
  }
  return Guarded([&] {
    handle.mu.AssertHeld();  // run here, in Answer, which holds it
    if (handle.mixed) {
      return ReplyText(ErrorReply(Status::Error(EPERM,
                                                "the request was written by more than one caller (uid or "
                                                "thread): write each request whole, from one thread")));
    }
    auto request = ParseRequest(handle.request);
    if (!request.ok()) return ReplyText(ErrorReply(request.status()));
    const std::string op = (*request)[control::key::kOp].get<std::string>();
    const bool root = handle.caller && handle.caller->uid == 0 && handle.opener_uid == 0;
    if (!root && !Unprivileged(op)) return ReplyText(ErrorReply(RootOnly(op)));
    if (handle.caller && handle.caller->uid != handle.opener_uid && RouteOf(op) == Route::kMemory) {
      return ReplyText(ErrorReply(Status::Error(
          EPERM, fmt::format("the control handle was opened by uid {} but this request was written by uid {}: "
                             "memory I/O acts for the handle's opener only",
                             handle.opener_uid, handle.caller->uid))));
    }
    switch (RouteOf(op)) {
      case Route::kDirect:
        // Unlocked: Filesystem is safe for concurrent use (as FUSE's threads
        // use it), and a client's dedup request runs while its own writes
        // reserve and commit on other channels.
        return AnswerDirect(handle, *request, inspector);
      case Route::kMemory:
        return AnswerMemory(handle, *request);  // unlocked, as the direct path
      case Route::kListing:
        if (Status flushed = fs_->FlushAll(); !flushed.ok()) return ReplyText(ErrorReply(flushed));
        break;
      case Route::kQuery:
        break;
    }
    MutexLock lock(&mu_);
    nlohmann::json reply = AnswerQuery(inspector, *request, Runtime());
    // What a client checks before it chooses memory I/O (a volume opened by
    // the tools, AnswerInspection, has no mount and says nothing).
    if (op == control::op::kVolume && reply[control::key::kOk] == true) {
      reply[control::key::kResult]["memory_io"] = !mount_device_.empty();
    }
    return ReplyText(reply);
  });
}

ControlPlane::ReplyBytes ControlPlane::Read(Handle* handle, uint64_t offset, size_t size) {
  std::shared_ptr<const std::string> reply;
  std::optional<InodeNumber> invalidate;
  {
    MutexLock lock(&handle->mu);
    if (!handle->reply) handle->reply = std::make_shared<const std::string>(Answer(*handle));
    reply = handle->reply;
    invalidate = std::exchange(handle->invalidate, std::nullopt);
  }
  // Before the reply goes out, so the client finds the kernel's cache of the
  // file dropped; with no lock held, as the kernel may have to write dirty
  // pages back through other FUSE threads first (--writeback-cache).
  if (invalidate && invalidate_) invalidate_(*invalidate);
  if (offset >= reply->size()) return {std::move(reply), {}};
  std::string_view bytes = std::string_view(*reply).substr(offset, size);
  return {std::move(reply), bytes};
}

void ControlPlane::ReleaseHandle(Handle& handle) {
  MutexLock lock(&handle.mu);  // uncontended: the handle is out of the table, no other thread has it
  if (!handle.reserved.empty()) fs_->DirectUnreserve(handle.reserved);
  DropMemory(handle);
}

void ControlPlane::Release(Handle* handle) {
  std::unique_ptr<Handle> owned = handles_.Take(handle);
  if (owned) ReleaseHandle(*owned);
}

RuntimeStats ControlPlane::Runtime() const {
  RuntimeStats r;
  r.mounted = true;
  r.has_free_bytes = true;
  r.free_bytes = fs_->free_bytes();
  RamTier::Stats tier = fs_->ram_tier_stats();
  r.ram_tier_bytes = tier.dirty_bytes;
  r.ram_tier_capacity_bytes = tier.capacity_bytes;
  const FsCounters& c = fs_->counters();
  r.ram_tier_hits = c.ram_tier_hits.load();
  r.ram_tier_misses = c.ram_tier_misses.load();
  // Memory I/O's bytes are in both the store's count and the direct one.
  // Loaded first: each is counted in the direct count before it (so never
  // more than it), and in the store's before both.
  const uint64_t memory_written = c.bytes_written_memory.load();
  r.bytes_written_direct = c.bytes_written_direct.load();
  r.bytes_written_ssd = fs_->volume().store().bytes_written() + r.bytes_written_direct - memory_written;
  r.bytes_deduplicated = c.bytes_deduplicated.load();
  r.bytes_read_ssd = fs_->volume().store().bytes_read();
  r.bytes_cancelled = tier.cancelled_bytes;
  r.ram_tier_stalls = tier.room_wait_timeouts;
  r.data_syncs = fs_->volume().store().syncs();
  r.data_sync_seconds = static_cast<double>(fs_->volume().store().sync_ns()) / 1e9;
  if (Status failed = fs_->volume().store().sync_error(); !failed.ok()) r.data_sync_error = failed.ToString();
  r.checksum_errors = c.checksum_errors.load();
  r.bytes_written = c.bytes_written.load();
  r.bytes_read = c.bytes_read.load();
  r.writes = c.writes.load();
  r.reads = c.reads.load();
  const ReadAhead::Stats ahead = fs_->read_ahead_stats();
  r.read_ahead_window_bytes = ahead.window_bytes;
  r.read_ahead_windows = ahead.windows_started;
  r.read_ahead_bytes_fetched = ahead.bytes_fetched;
  r.read_ahead_bytes_served = ahead.bytes_served;
  r.read_ahead_waits = ahead.waits;
  r.read_ahead_wait_seconds = static_cast<double>(ahead.wait_ns) / 1e9;
  if (fuse_ring_requests_ != nullptr) r.fuse_ring_requests = fuse_ring_requests_->load(std::memory_order_relaxed);
  r.uptime_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  return r;
}

}  // namespace spillfs
