#include "spillfs/kvindex/coding.h"

namespace spillfs::coding {
namespace {

// `value` as sizeof(T) bytes, the most significant first.
template <typename T>
void PutFixedBE(std::string* dst, T value) {
  char buf[sizeof(T)];
  for (int i = sizeof(T) - 1; i >= 0; --i) {
    buf[i] = static_cast<char>(value & 0xff);
    value >>= 8;
  }
  dst->append(buf, sizeof(buf));
}

template <typename T>
T DecodeFixedBE(const char* src) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value = static_cast<T>((value << 8) | static_cast<uint8_t>(src[i]));
  return value;
}

}  // namespace

void PutFixed64BE(std::string* dst, uint64_t value) { PutFixedBE(dst, value); }
void PutFixed32BE(std::string* dst, uint32_t value) { PutFixedBE(dst, value); }
uint64_t DecodeFixed64BE(const char* src) { return DecodeFixedBE<uint64_t>(src); }
uint32_t DecodeFixed32BE(const char* src) { return DecodeFixedBE<uint32_t>(src); }

void PutVarint64(std::string* dst, uint64_t value) {
  while (value >= 0x80) {
    dst->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  dst->push_back(static_cast<char>(value));
}

void PutVarsigned64(std::string* dst, int64_t value) {
  PutVarint64(dst, (static_cast<uint64_t>(value) << 1) ^ static_cast<uint64_t>(value >> 63));
}

void PutLengthPrefixed(std::string* dst, std::string_view value) {
  PutVarint64(dst, value.size());
  dst->append(value);
}

bool Reader::GetU8(uint8_t* value) {
  if (input_.empty()) return false;
  *value = static_cast<uint8_t>(input_[0]);
  input_.remove_prefix(1);
  return true;
}

bool Reader::GetVarint64(uint64_t* value) {
  uint64_t result = 0;
  for (int shift = 0; shift <= 63 && !input_.empty(); shift += 7) {
    uint64_t byte = static_cast<uint8_t>(input_[0]);
    input_.remove_prefix(1);
    if (shift == 63 && byte > 1) break;  // would overflow 64 bits
    result |= (byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) {
      *value = result;
      return true;
    }
  }
  input_ = {};
  return false;
}

bool Reader::GetVarint32(uint32_t* value) {
  uint64_t wide = 0;
  if (!GetVarint64(&wide) || wide > UINT32_MAX) {
    input_ = {};
    return false;
  }
  *value = static_cast<uint32_t>(wide);
  return true;
}

bool Reader::GetVarsigned64(int64_t* value) {
  uint64_t zigzag = 0;
  if (!GetVarint64(&zigzag)) return false;
  *value = static_cast<int64_t>((zigzag >> 1) ^ (~(zigzag & 1) + 1));
  return true;
}

bool Reader::GetBytes(size_t n, std::string_view* value) {
  if (input_.size() < n) {
    input_ = {};
    return false;
  }
  *value = input_.substr(0, n);
  input_.remove_prefix(n);
  return true;
}

bool Reader::GetLengthPrefixed(std::string_view* value) {
  uint64_t n = 0;
  return GetVarint64(&n) && GetBytes(n, value);
}

bool Reader::GetFixed64BE(uint64_t* value) {
  std::string_view bytes;
  if (!GetBytes(8, &bytes)) return false;
  *value = DecodeFixed64BE(bytes.data());
  return true;
}

}  // namespace spillfs::coding
