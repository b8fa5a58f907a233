// Unit tests for kvindex/coding.h and the key layout of kvindex/keys.h:
// varint, zig-zag and big-endian round trips at the edge values, a Reader that
// refuses truncated and overlong input, and big-endian keys whose bytewise
// order is numeric order.
#include "spillfs/kvindex/coding.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "spillfs/kvindex/keys.h"
#include "support/random_bytes.h"

namespace spillfs {
namespace {

using coding::Reader;

// Edge values for unsigned 64-bit fields: 0, every power of two, one below
// and one above it, and the extremes.
std::vector<uint64_t> UnsignedEdges() {
  std::vector<uint64_t> values = {
      0, 1, 127, 128, 255, 256, 16383, 16384, UINT32_MAX, uint64_t{UINT32_MAX} + 1, UINT64_MAX - 1, UINT64_MAX};
  for (int bit = 0; bit < 64; ++bit) {
    uint64_t p = uint64_t{1} << bit;
    values.push_back(p);
    values.push_back(p - 1);
    values.push_back(p + 1);
  }
  return values;
}

std::vector<int64_t> SignedEdges() {
  std::vector<int64_t> values = {
      0, 1, -1, 2, -2, 63, -64, 64, -65, INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, INT64_MAX - 1, INT64_MIN + 1};
  for (int bit = 0; bit < 63; ++bit) {
    int64_t p = int64_t{1} << bit;
    values.push_back(p);
    values.push_back(-p);
    values.push_back(p - 1);
    values.push_back(-p - 1);
  }
  return values;
}

// Bytes needed by a LEB128 varint of `value`.
size_t VarintLength(uint64_t value) {
  size_t n = 1;
  while (value >= 0x80) {
    value >>= 7;
    ++n;
  }
  return n;
}

std::string Bytes(std::initializer_list<int> bytes) {
  std::string out;
  for (int b : bytes) out.push_back(static_cast<char>(b));
  return out;
}

TEST(CodingTest, VarintRoundTripsEdgeValues) {
  for (uint64_t value : UnsignedEdges()) {
    std::string encoded;
    coding::PutVarint64(&encoded, value);
    EXPECT_EQ(encoded.size(), VarintLength(value)) << value;
    Reader reader(encoded);
    uint64_t decoded = 0;
    ASSERT_TRUE(reader.GetVarint64(&decoded)) << value;
    EXPECT_EQ(decoded, value);
    EXPECT_TRUE(reader.empty()) << value;
  }
}

TEST(CodingTest, VarintKnownEncodings) {
  std::string out;
  coding::PutVarint64(&out, 0);
  EXPECT_EQ(out, Bytes({0x00}));
  out.clear();
  coding::PutVarint64(&out, 127);
  EXPECT_EQ(out, Bytes({0x7f}));
  out.clear();
  coding::PutVarint64(&out, 128);
  EXPECT_EQ(out, Bytes({0x80, 0x01}));
  out.clear();
  coding::PutVarint64(&out, 300);
  EXPECT_EQ(out, Bytes({0xac, 0x02}));
  out.clear();
  coding::PutVarint64(&out, UINT64_MAX);
  EXPECT_EQ(out, Bytes({0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}));
}

TEST(CodingTest, ManyVarintsBackToBack) {
  std::vector<uint64_t> values = UnsignedEdges();
  std::string encoded;
  for (uint64_t v : values) coding::PutVarint64(&encoded, v);
  Reader reader(encoded);
  for (uint64_t v : values) {
    uint64_t decoded = 0;
    ASSERT_TRUE(reader.GetVarint64(&decoded));
    EXPECT_EQ(decoded, v);
  }
  EXPECT_TRUE(reader.empty());
  uint64_t extra = 0;
  EXPECT_FALSE(reader.GetVarint64(&extra));
}

TEST(CodingTest, Varint32AcceptsUint32MaxAndRefusesWider) {
  for (uint64_t value : UnsignedEdges()) {
    std::string encoded;
    coding::PutVarint64(&encoded, value);
    encoded.push_back('\x2a');  // a trailing byte the failed reader must not hand out
    Reader reader(encoded);
    uint32_t decoded = 0;
    if (value <= UINT32_MAX) {
      ASSERT_TRUE(reader.GetVarint32(&decoded)) << value;
      EXPECT_EQ(decoded, value);
      uint8_t tail = 0;
      ASSERT_TRUE(reader.GetU8(&tail));
      EXPECT_EQ(tail, 0x2a);
    } else {
      EXPECT_FALSE(reader.GetVarint32(&decoded)) << value;
      // The reader is failed: nothing more can be read.
      uint8_t tail = 0;
      EXPECT_FALSE(reader.GetU8(&tail)) << value;
      EXPECT_TRUE(reader.empty());
    }
  }
}

TEST(CodingTest, ZigZagRoundTripsEdgeValues) {
  for (int64_t value : SignedEdges()) {
    std::string encoded;
    coding::PutVarsigned64(&encoded, value);
    Reader reader(encoded);
    int64_t decoded = 0;
    ASSERT_TRUE(reader.GetVarsigned64(&decoded)) << value;
    EXPECT_EQ(decoded, value);
    EXPECT_TRUE(reader.empty());
  }
}

TEST(CodingTest, ZigZagMapsSmallMagnitudesToShortEncodings) {
  // zigzag(0)=0, zigzag(-1)=1, zigzag(1)=2, zigzag(-2)=3, ...
  const std::pair<int64_t, uint64_t> cases[] = {{0, 0},
                                                {-1, 1},
                                                {1, 2},
                                                {-2, 3},
                                                {2, 4},
                                                {-64, 127},
                                                {63, 126},
                                                {INT64_MAX, UINT64_MAX - 1},
                                                {INT64_MIN, UINT64_MAX}};
  for (auto [value, zigzag] : cases) {
    std::string signed_encoding, unsigned_encoding;
    coding::PutVarsigned64(&signed_encoding, value);
    coding::PutVarint64(&unsigned_encoding, zigzag);
    EXPECT_EQ(signed_encoding, unsigned_encoding) << value;
  }
  std::string minus_one;
  coding::PutVarsigned64(&minus_one, -1);
  EXPECT_EQ(minus_one.size(), 1u);
}

TEST(CodingTest, FixedBigEndianLayoutAndRoundTrip) {
  std::string out;
  coding::PutFixed64BE(&out, 0x0102030405060708ull);
  EXPECT_EQ(out, Bytes({1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(coding::DecodeFixed64BE(out.data()), 0x0102030405060708ull);
  out.clear();
  coding::PutFixed32BE(&out, 0xa1b2c3d4u);
  EXPECT_EQ(out, Bytes({0xa1, 0xb2, 0xc3, 0xd4}));
  EXPECT_EQ(coding::DecodeFixed32BE(out.data()), 0xa1b2c3d4u);

  for (uint64_t value : UnsignedEdges()) {
    std::string e64;
    coding::PutFixed64BE(&e64, value);
    ASSERT_EQ(e64.size(), 8u);
    EXPECT_EQ(coding::DecodeFixed64BE(e64.data()), value);
    Reader reader(e64);
    uint64_t decoded = 0;
    ASSERT_TRUE(reader.GetFixed64BE(&decoded));
    EXPECT_EQ(decoded, value);
    EXPECT_TRUE(reader.empty());

    uint32_t narrow = static_cast<uint32_t>(value);
    std::string e32;
    coding::PutFixed32BE(&e32, narrow);
    ASSERT_EQ(e32.size(), 4u);
    EXPECT_EQ(coding::DecodeFixed32BE(e32.data()), narrow);
  }
}

TEST(CodingTest, LengthPrefixedRoundTrip) {
  std::string binary("a\0b\xff", 4);
  const std::string values[] = {"", "x", binary, std::string(127, 'q'), std::string(128, 'r'), std::string(70000, 's')};
  std::string encoded;
  for (const auto& v : values) coding::PutLengthPrefixed(&encoded, v);
  Reader reader(encoded);
  for (const auto& v : values) {
    std::string_view decoded;
    ASSERT_TRUE(reader.GetLengthPrefixed(&decoded));
    EXPECT_EQ(decoded, v);
  }
  EXPECT_TRUE(reader.empty());
}

// Every proper prefix of each value's encoding (by PUT) is refused by GET,
// which then leaves the reader empty.
template <typename T, typename Get>
void ExpectEveryTruncationRefused(const std::vector<T>& values, void (*put)(std::string*, T), Get get) {
  for (T value : values) {
    std::string encoded;
    put(&encoded, value);
    for (size_t len = 0; len < encoded.size(); ++len) {
      Reader reader(std::string_view(encoded).substr(0, len));
      T decoded = 0;
      EXPECT_FALSE(get(reader, &decoded)) << value << " cut to " << len;
      EXPECT_TRUE(reader.empty());
    }
  }
}

TEST(CodingTest, ReaderRefusesEveryTruncatedVarint) {
  ExpectEveryTruncationRefused(UnsignedEdges(), coding::PutVarint64,
                               [](Reader& r, uint64_t* v) { return r.GetVarint64(v); });
  ExpectEveryTruncationRefused(SignedEdges(), coding::PutVarsigned64,
                               [](Reader& r, int64_t* v) { return r.GetVarsigned64(v); });
}

TEST(CodingTest, ReaderRefusesOverlongVarints) {
  uint64_t decoded = 0;
  // Ten bytes whose last carries more than the one bit left of 64.
  for (int last = 0x02; last <= 0x7f; ++last) {
    std::string s(9, '\xff');
    s.push_back(static_cast<char>(last));
    Reader reader(s);
    EXPECT_FALSE(reader.GetVarint64(&decoded)) << "last byte " << last;
    EXPECT_TRUE(reader.empty());
  }
  // The largest legal ten-byte varint is accepted.
  {
    std::string s(9, '\xff');
    s.push_back('\x01');
    Reader reader(s);
    ASSERT_TRUE(reader.GetVarint64(&decoded));
    EXPECT_EQ(decoded, UINT64_MAX);
  }
  // Eleven or more bytes: a continuation bit on the tenth byte.
  for (size_t n : {11u, 12u, 20u, 64u}) {
    std::string s(n - 1, '\x80');
    s.push_back('\x00');
    Reader reader(s);
    EXPECT_FALSE(reader.GetVarint64(&decoded)) << n << " bytes";
    EXPECT_TRUE(reader.empty());
  }
  // A continuation bit on the last byte of the input.
  {
    std::string s(5, '\x80');
    Reader reader(s);
    EXPECT_FALSE(reader.GetVarint64(&decoded));
  }
  // Overlong signed values too.
  {
    std::string s(10, '\xff');
    s.push_back('\x01');
    Reader reader(s);
    int64_t value = 0;
    EXPECT_FALSE(reader.GetVarsigned64(&value));
  }
}

TEST(CodingTest, ReaderRefusesShortFixedAndBytes) {
  for (size_t len = 0; len < 8; ++len) {
    std::string s(len, '\x11');
    Reader reader(s);
    uint64_t v = 0;
    EXPECT_FALSE(reader.GetFixed64BE(&v)) << len;
    EXPECT_TRUE(reader.empty());
  }
  {
    Reader reader("abc");
    std::string_view out;
    EXPECT_FALSE(reader.GetBytes(4, &out));
    EXPECT_TRUE(reader.empty());
    EXPECT_FALSE(reader.GetBytes(1, &out));
  }
  {
    Reader reader("abcd");
    std::string_view out;
    ASSERT_TRUE(reader.GetBytes(4, &out));
    EXPECT_EQ(out, "abcd");
    EXPECT_TRUE(reader.empty());
  }
  {
    Reader reader("");
    uint8_t b = 0;
    EXPECT_FALSE(reader.GetU8(&b));
  }
  // A length prefix promising more bytes than there are.
  for (uint64_t claimed : {uint64_t{4}, uint64_t{1000}, uint64_t{1} << 40, UINT64_MAX}) {
    std::string s;
    coding::PutVarint64(&s, claimed);
    s += "abc";
    Reader reader(s);
    std::string_view out;
    EXPECT_FALSE(reader.GetLengthPrefixed(&out)) << claimed;
    EXPECT_TRUE(reader.empty());
  }
  // GetBytes with a huge count must not wrap around.
  {
    Reader reader("abc");
    std::string_view out;
    EXPECT_FALSE(reader.GetBytes(std::numeric_limits<size_t>::max(), &out));
  }
}

// A record-like sequence of mixed fields: every strict prefix fails somewhere
// in the sequence of reads, and the full input reads back exactly.
TEST(CodingTest, MixedSequenceEveryTruncationFails) {
  std::string encoded;
  encoded.push_back('\x07');
  coding::PutVarint64(&encoded, 1ull << 35);
  coding::PutVarsigned64(&encoded, -123456789);
  coding::PutLengthPrefixed(&encoded, "hello\0world");
  coding::PutFixed64BE(&encoded, 0xdeadbeefcafef00dull);
  coding::PutVarint64(&encoded, 7);

  auto read_all = [](std::string_view input, bool* complete) {
    Reader r(input);
    uint8_t u8;
    uint64_t v64, f64, last;
    int64_t s64;
    std::string_view bytes;
    *complete = r.GetU8(&u8) && r.GetVarint64(&v64) && r.GetVarsigned64(&s64) && r.GetLengthPrefixed(&bytes) &&
                r.GetFixed64BE(&f64) && r.GetVarint64(&last);
    return *complete && u8 == 7 && v64 == (1ull << 35) && s64 == -123456789 && bytes == "hello" &&
           f64 == 0xdeadbeefcafef00dull && last == 7 && r.empty();
  };
  bool complete = false;
  EXPECT_TRUE(read_all(encoded, &complete));
  for (size_t len = 0; len < encoded.size(); ++len) {
    read_all(std::string_view(encoded).substr(0, len), &complete);
    EXPECT_FALSE(complete) << "prefix of " << len << " bytes decoded";
  }
}

TEST(CodingTest, RandomBytesNeverCrashTheReader) {
  std::mt19937_64 rng(20240601);
  int successes = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string s = testing::RandomGarbage(rng, 24);
    Reader r(s);
    size_t before = r.remaining().size();
    uint64_t v;
    int64_t sv;
    uint32_t v32;
    std::string_view bytes;
    switch (rng() % 5) {
      case 0:
        if (r.GetVarint64(&v)) {
          ++successes;
          std::string again;
          coding::PutVarint64(&again, v);
          EXPECT_LE(again.size(), before - r.remaining().size());
        }
        break;
      case 1:
        successes += r.GetVarsigned64(&sv);
        break;
      case 2:
        successes += r.GetVarint32(&v32);
        break;
      case 3:
        successes += r.GetLengthPrefixed(&bytes);
        break;
      default:
        successes += r.GetFixed64BE(&v);
        break;
    }
    EXPECT_LE(r.remaining().size(), before);
  }
  EXPECT_GT(successes, 0);
}

// ---- key order ----

TEST(CodingTest, BigEndianKeyOrderIsNumericOrder) {
  std::vector<uint64_t> values = UnsignedEdges();
  std::mt19937_64 rng(42);
  for (int i = 0; i < 2000; ++i) values.push_back(rng() >> (rng() % 64));
  for (size_t i = 0; i < values.size(); ++i) {
    uint64_t a = values[i];
    uint64_t b = values[(i * 7919 + 13) % values.size()];
    std::string ka, kb;
    coding::PutFixed64BE(&ka, a);
    coding::PutFixed64BE(&kb, b);
    EXPECT_EQ(a < b, ka < kb) << a << " vs " << b;
    EXPECT_EQ(a == b, ka == kb);
    std::string ja = keys::Ino(a), jb = keys::Ino(b);
    EXPECT_EQ(a < b, ja < jb);
  }
  // Sorting the encodings sorts the numbers.
  std::vector<std::string> encoded;
  for (uint64_t v : values) encoded.push_back(keys::Ino(v));
  std::sort(encoded.begin(), encoded.end());
  std::vector<uint64_t> sorted = values;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) EXPECT_EQ(keys::DecodeIno(encoded[i]), sorted[i]);
}

TEST(CodingTest, ExtentKeysOrderByInodeThenOffset) {
  std::mt19937_64 rng(7);
  std::vector<std::pair<uint64_t, uint64_t>> pairs = {
      {0, 0}, {1, 0}, {1, 1}, {1, UINT64_MAX}, {2, 0}, {UINT64_MAX, 0}, {UINT64_MAX, UINT64_MAX}};
  for (int i = 0; i < 500; ++i) pairs.emplace_back(rng() % 5, rng() >> (rng() % 64));
  for (const auto& a : pairs) {
    for (size_t j = 0; j < pairs.size(); j += 7) {
      const auto& b = pairs[j];
      std::string ka = keys::Extent(a.first, a.second), kb = keys::Extent(b.first, b.second);
      ASSERT_EQ(ka.size(), 16u);
      EXPECT_EQ(a < b, ka < kb);
    }
    std::string k = keys::Extent(a.first, a.second);
    EXPECT_EQ(keys::DecodeIno(k), a.first);
    EXPECT_EQ(keys::ExtentOffset(k), a.second);
  }
}

TEST(CodingTest, DirentKeysOfOneDirectorySortTogether) {
  const std::string names[] = {"", "a", "b", std::string("\0", 1), "\xff", "zzz", std::string(255, '\xff')};
  for (uint64_t parent : {uint64_t{1}, uint64_t{255}, uint64_t{256}, UINT64_MAX - 1}) {
    for (const auto& name : names) {
      std::string key = keys::Dirent(parent, name);
      EXPECT_EQ(keys::DecodeIno(key), parent);
      EXPECT_EQ(keys::DirentName(key), name);
      // Every entry of `parent` sits at or after its prefix and before the next directory's.
      EXPECT_GE(key, keys::Ino(parent));
      EXPECT_LT(key, keys::Ino(parent + 1));
      EXPECT_GT(key, keys::Dirent(parent - 1, std::string(300, '\xff')));
    }
  }
  EXPECT_EQ(keys::Xattr(9, "user.x"), keys::Dirent(9, "user.x"));
  EXPECT_EQ(keys::Free(12345), keys::Ino(12345));
}

}  // namespace
}  // namespace spillfs
