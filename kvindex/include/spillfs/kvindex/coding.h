// Byte encodings shared by keys and records.
//
// Keys use fixed-width big-endian integers so that RocksDB's bytewise order is
// numeric order: all records of one inode sit together and a prefix scan walks
// a directory or an extent map in order. Records use little-endian varints
// behind a one-byte format version, so fields can be appended later.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace spillfs::coding {

void PutFixed64BE(std::string* dst, uint64_t value);
void PutFixed32BE(std::string* dst, uint32_t value);
// Reads 8 big-endian bytes at `src`; the caller guarantees they exist.
uint64_t DecodeFixed64BE(const char* src);
uint32_t DecodeFixed32BE(const char* src);

void PutVarint64(std::string* dst, uint64_t value);
void PutVarsigned64(std::string* dst, int64_t value);  // zig-zag
void PutLengthPrefixed(std::string* dst, std::string_view value);

// Sequential reader over an encoded record. Every Get* returns false (and
// leaves the reader failed) instead of reading past the end, so decoding
// untrusted bytes can never crash.
class Reader {
 public:
  explicit Reader(std::string_view input) : input_(input) {}

  bool GetU8(uint8_t* value);
  bool GetVarint64(uint64_t* value);
  bool GetVarint32(uint32_t* value);  // fails when the value exceeds 32 bits
  bool GetVarsigned64(int64_t* value);
  bool GetLengthPrefixed(std::string_view* value);
  bool GetFixed64BE(uint64_t* value);
  bool GetBytes(size_t n, std::string_view* value);

  bool empty() const { return input_.empty(); }
  std::string_view remaining() const { return input_; }

 private:
  std::string_view input_;
};

}  // namespace spillfs::coding
