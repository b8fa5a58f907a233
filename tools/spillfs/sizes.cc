#include "sizes.h"

#include <fmt/format.h>

#include <cctype>

namespace spillfs::cli {

Result<uint64_t> ParseSize(const std::string& text) {
  size_t i = 0;
  uint64_t value = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    uint64_t digit = static_cast<uint64_t>(text[i] - '0');
    if (value > (UINT64_MAX - digit) / 10) return Status::Invalid(fmt::format("size '{}' is too large", text));
    value = value * 10 + digit;
    ++i;
  }
  if (i == 0) return Status::Invalid(fmt::format("'{}' is not a size (try 512M, 4G, 1T)", text));
  std::string suffix = text.substr(i);
  for (auto& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  int shift = 0;
  if (!suffix.empty()) {
    const std::string units = "KMGTP";
    size_t unit = units.find(suffix[0]);
    std::string rest = suffix.substr(1);
    if (unit == std::string::npos || !(rest.empty() || rest == "B" || rest == "IB")) {
      return Status::Invalid(fmt::format("'{}' has an unknown unit (use K, M, G, T or P)", text));
    }
    shift = 10 * static_cast<int>(unit + 1);
  }
  if (shift > 0 && value > (UINT64_MAX >> shift)) return Status::Invalid(fmt::format("size '{}' is too large", text));
  return value << shift;
}

std::string HumanBytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 5) {
    value /= 1024;
    ++unit;
  }
  if (unit == 0) return fmt::format("{} B", bytes);
  return fmt::format("{:.1f} {}", value, units[unit]);
}

}  // namespace spillfs::cli
