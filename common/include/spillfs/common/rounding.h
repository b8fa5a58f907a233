// Rounding to a unit (a block, a window, a dedup unit).
#pragma once

#include <cstdint>

namespace spillfs {

inline constexpr uint64_t RoundDown(uint64_t value, uint64_t unit) { return value / unit * unit; }
inline constexpr uint64_t RoundUp(uint64_t value, uint64_t unit) { return (value + unit - 1) / unit * unit; }
inline constexpr uint64_t DivideRoundingUp(uint64_t value, uint64_t unit) { return (value + unit - 1) / unit; }

}  // namespace spillfs
