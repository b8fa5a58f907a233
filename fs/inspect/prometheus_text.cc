// The `stats` file of a mount: `spillfs stat`'s JSON in the Prometheus text
// exposition format, one gauge or counter per number, with its help line.
#include <fmt/format.h>

#include <cmath>
#include <string>

#include "spillfs/fs/inspector.h"

namespace spillfs {

using nlohmann::json;

namespace {

struct MetricInfo {
  const char* key;
  const char* help;
  bool counter;
};

constexpr MetricInfo kMetrics[] = {
    {"format_version", "Format version of the volume.", false},
    {"block_size", "Block size of the volume in bytes.", false},
    {"checksums", "1 when data blocks are checksummed.", false},
    {"dedup", "1 when deduplication is on.", false},
    {"mounted", "1 when the volume is mounted.", false},
    {"capacity_bytes", "Size of the data area in bytes.", false},
    {"used_bytes", "Bytes of the data area in use.", false},
    {"free_bytes", "Bytes of the data area free.", false},
    {"logical_bytes", "Sum of the sizes of regular files.", false},
    {"referenced_bytes", "Sum of the lengths of all file extents (shared bytes counted per use).", false},
    {"physical_bytes", "Bytes of the data area mapped by files (shared bytes counted once).", false},
    {"dedup_ratio", "referenced_bytes / physical_bytes.", false},
    {"inodes", "Inodes in the index.", false},
    {"files", "Regular files.", false},
    {"directories", "Directories.", false},
    {"symlinks", "Symbolic links.", false},
    {"special_files", "Device, FIFO and socket nodes.", false},
    {"orphans", "Inodes unlinked while open, not yet reclaimed.", false},
    {"extents", "Extent records in the index.", false},
    {"index_bytes", "Approximate on-disk size of the index.", false},
    {"ram_tier_bytes", "Dirty bytes held in the write-back RAM tier.", false},
    {"ram_tier_capacity_bytes", "Bound of the write-back RAM tier.", false},
    {"ram_tier_hits", "Reads served from the RAM tier since mount.", true},
    {"ram_tier_misses", "Reads that went to the SSD since mount.", true},
    {"ram_tier_stalls", "Writes that waited for room in the RAM tier in vain since mount.", true},
    {"bytes_written_ssd", "Bytes written to the data area since mount.", true},
    {"bytes_read_ssd", "Bytes read from the data area since mount.", true},
    {"bytes_cancelled", "Bytes dropped from the RAM tier before reaching the SSD since mount.", true},
    {"checksum_errors", "Checksum mismatches detected on read since mount.", true},
    {"data_syncs", "fdatasync calls on the data area since mount.", true},
    {"data_sync_seconds", "Seconds spent in fdatasync of the data area since mount.", true},
    {"data_sync_failed", "1 once an fdatasync of the data area has failed: every sync fails until a remount.", false},
    {"bytes_written", "Bytes written by clients since mount.", true},
    {"bytes_read", "Bytes read by clients since mount.", true},
    {"writes", "Write operations since mount.", true},
    {"reads", "Read operations since mount.", true},
    {"queue_depth", "SSD I/Os in flight.", false},
    {"fuse_ring_requests", "FUSE requests answered over io_uring since mount.", true},
    {"read_ahead_window_bytes", "Size of one read-ahead window (0: read-ahead off).", false},
    {"read_ahead_windows", "Read-ahead windows started since mount.", true},
    {"read_ahead_bytes_fetched", "Bytes read from the SSD ahead of sequential readers since mount.", true},
    {"read_ahead_bytes_served", "Bytes of reads answered from read-ahead windows since mount.", true},
    {"read_ahead_waits", "Reads that waited for a read-ahead window still being fetched since mount.", true},
    {"read_ahead_wait_seconds", "Seconds reads waited for read-ahead windows being fetched since mount.", true},
    {"uptime_seconds", "Seconds since mount.", false},
};

const MetricInfo* FindMetric(const std::string& key) {
  for (const auto& m : kMetrics) {
    if (key == m.key) return &m;
  }
  return nullptr;
}

std::string MetricName(const std::string& key) {
  std::string name = "spillfs_";
  for (char c : key) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    name.push_back(ok ? c : '_');
  }
  return name;
}

std::string LabelEscape(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string FormatValue(const json& value) {
  if (value.is_boolean()) return value.get<bool>() ? "1" : "0";
  if (value.is_number_unsigned()) return fmt::format("{}", value.get<uint64_t>());
  if (value.is_number_integer()) return fmt::format("{}", value.get<int64_t>());
  double d = value.get<double>();
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", d);
}

void Emit(const std::string& key, const json& value, std::string* out) {
  if (value.is_object()) {
    for (const auto& [k, v] : value.items()) Emit(key + "_" + k, v, out);
    return;
  }
  if (!value.is_number() && !value.is_boolean()) return;
  std::string name = MetricName(key);
  const MetricInfo* info = FindMetric(key);
  *out += fmt::format("# HELP {} {}\n", name, info != nullptr ? info->help : ("spillfs " + key).c_str());
  *out += fmt::format("# TYPE {} {}\n", name, info != nullptr && info->counter ? "counter" : "gauge");
  *out += fmt::format("{} {}\n", name, FormatValue(value));
}

}  // namespace

std::string PrometheusText(const nlohmann::json& stat) {
  std::string out;
  if (!stat.is_object()) return out;
  if (stat.contains("uuid") && stat["uuid"].is_string()) {
    out += "# HELP spillfs_info Identity of the volume.\n# TYPE spillfs_info gauge\n";
    out += fmt::format("spillfs_info{{uuid=\"{}\"}} 1\n", LabelEscape(stat["uuid"].get<std::string>()));
  }
  for (const auto& [key, value] : stat.items()) Emit(key, value, &out);
  return out;
}

}  // namespace spillfs
