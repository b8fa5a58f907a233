// The `stats` file of a mount: `spillfs stat`'s JSON in the Prometheus text
// exposition format, one gauge or counter per number, with its help line
// (both from kStatKeys, spillfs/common/stat_keys.h).
#include <fmt/format.h>

#include <cmath>
#include <string>

#include "spillfs/inspect/inspector.h"

namespace spillfs {

using nlohmann::json;

namespace {

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
  const StatKey* info = FindStatKey(key);
  *out += fmt::format("# HELP {} {}\n", name, info != nullptr ? info->help : ("spillfs " + key).c_str());
  *out +=
      fmt::format("# TYPE {} {}\n", name, info != nullptr && info->type == StatType::kCounter ? "counter" : "gauge");
  *out += fmt::format("{} {}\n", name, FormatValue(value));
}

}  // namespace

std::string PrometheusText(const nlohmann::json& stat) {
  std::string out;
  if (!stat.is_object()) return out;
  if (stat.contains("uuid") && stat["uuid"].is_string()) {
    out += fmt::format("# HELP spillfs_info {}\n# TYPE spillfs_info gauge\n", FindStatKey("uuid")->help);
    out += fmt::format("spillfs_info{{uuid=\"{}\"}} 1\n", LabelEscape(stat["uuid"].get<std::string>()));
  }
  for (const auto& [key, value] : stat.items()) Emit(key, value, &out);
  return out;
}

}  // namespace spillfs
