// libFuzzer target: coding::Reader driven by a fuzzed program over fuzzed
// bytes, and Put* -> Reader round trips of fuzzed values.
//
// Properties: a Get* never reads past its input (ASan) and, when it fails,
// leaves the reader failed (empty); a success consumes exactly the bytes it
// decoded (the remaining view moves forward by that much, staying inside the
// input); canonical encodings of the decoded values decode to the same
// values; every value written with Put* is read back unchanged.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "spillfs/kvindex/coding.h"

namespace {

using namespace spillfs;

uint64_t Canonical64(uint64_t value) {
  std::string bytes;
  coding::PutVarint64(&bytes, value);
  coding::Reader reader(bytes);
  uint64_t back = 0;
  FUZZ_CHECK(reader.GetVarint64(&back) && reader.empty(), "canonical varint decode");
  return back;
}

void RunProgram(const std::vector<uint8_t>& program, const std::string& bytes) {
  coding::Reader reader(bytes);
  const char* begin = bytes.data();
  const char* end = bytes.data() + bytes.size();
  for (uint8_t op : program) {
    std::string_view before = reader.remaining();
    bool ok = false;
    switch (op % 8) {
      case 0: {
        uint8_t v = 0;
        ok = reader.GetU8(&v);
        if (ok) FUZZ_CHECK(v == static_cast<uint8_t>(before[0]), "GetU8 value");
        break;
      }
      case 1: {
        uint64_t v = 0;
        ok = reader.GetVarint64(&v);
        if (ok) FUZZ_CHECK(Canonical64(v) == v, "varint64");
        break;
      }
      case 2: {
        uint32_t v = 0;
        ok = reader.GetVarint32(&v);
        break;
      }
      case 3: {
        int64_t v = 0;
        ok = reader.GetVarsigned64(&v);
        if (ok) {
          std::string again;
          coding::PutVarsigned64(&again, v);
          coding::Reader r(again);
          int64_t back = 0;
          FUZZ_CHECK(r.GetVarsigned64(&back) && back == v && r.empty(), "zig-zag round trip");
        }
        break;
      }
      case 4: {
        std::string_view v;
        ok = reader.GetLengthPrefixed(&v);
        if (ok) {
          FUZZ_CHECK(v.data() >= begin && v.data() + v.size() <= end, "length-prefixed view inside input");
          FUZZ_CHECK(reader.remaining().data() == v.data() + v.size(), "length-prefixed consumption");
        }
        break;
      }
      case 5: {
        uint64_t v = 0;
        ok = reader.GetFixed64BE(&v);
        if (ok) FUZZ_CHECK(v == coding::DecodeFixed64BE(before.data()), "fixed64");
        break;
      }
      case 6: {
        std::string_view v;
        size_t n = op / 8;  // 0..31
        ok = reader.GetBytes(n, &v);
        if (ok) FUZZ_CHECK(v == before.substr(0, n), "GetBytes value");
        break;
      }
      default: {
        std::string_view v;
        ok = reader.GetBytes(SIZE_MAX - op, &v);  // absurd length: must fail cleanly
        FUZZ_CHECK(!ok || before.size() >= SIZE_MAX - op, "huge GetBytes");
        break;
      }
    }
    std::string_view after = reader.remaining();
    if (!ok) {
      FUZZ_CHECK(reader.empty(), "a failed Get leaves the reader failed");
      return;
    }
    FUZZ_CHECK(after.data() >= before.data() && after.data() + after.size() == end, "reader moved outside input");
    FUZZ_CHECK(after.size() < before.size() || (op % 8 == 6 && op / 8 == 0), "a successful Get consumed nothing");
  }
}

void RoundTrips(FuzzedDataProvider* fdp) {
  uint64_t u = fdp->ConsumeIntegral<uint64_t>();
  uint32_t u32 = fdp->ConsumeIntegral<uint32_t>();
  int64_t s = fdp->ConsumeIntegral<int64_t>();
  std::string blob = fdp->ConsumeRandomLengthString(64);
  std::string out;
  coding::PutVarint64(&out, u);
  coding::PutVarint64(&out, u32);
  coding::PutVarsigned64(&out, s);
  coding::PutLengthPrefixed(&out, blob);
  coding::PutFixed64BE(&out, u);
  coding::PutFixed32BE(&out, u32);
  coding::Reader reader(out);
  uint64_t u_back = 0, f_back = 0;
  uint32_t u32_back = 0;
  int64_t s_back = 0;
  std::string_view blob_back, fixed32;
  FUZZ_CHECK(reader.GetVarint64(&u_back) && u_back == u, "varint64 round trip");
  FUZZ_CHECK(reader.GetVarint32(&u32_back) && u32_back == u32, "varint32 round trip");
  FUZZ_CHECK(reader.GetVarsigned64(&s_back) && s_back == s, "varsigned round trip");
  FUZZ_CHECK(reader.GetLengthPrefixed(&blob_back) && blob_back == blob, "length-prefixed round trip");
  FUZZ_CHECK(reader.GetFixed64BE(&f_back) && f_back == u, "fixed64 round trip");
  FUZZ_CHECK(reader.GetBytes(4, &fixed32) && coding::DecodeFixed32BE(fixed32.data()) == u32, "fixed32 round trip");
  FUZZ_CHECK(reader.empty(), "round trip left bytes");
  // A value above 32 bits is refused by GetVarint32.
  if (u > UINT32_MAX) {
    std::string wide;
    coding::PutVarint64(&wide, u);
    coding::Reader r(wide);
    uint32_t narrow = 0;
    FUZZ_CHECK(!r.GetVarint32(&narrow) && r.empty(), "GetVarint32 of a 64-bit value");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider fdp(data, size);
  std::vector<uint8_t> program = fdp.ConsumeBytes<uint8_t>(fdp.ConsumeIntegralInRange<size_t>(0, 32));
  RoundTrips(&fdp);
  RunProgram(program, fdp.ConsumeRemainingBytesAsString());
  return 0;
}
