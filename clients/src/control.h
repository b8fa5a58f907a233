// The client's handle of MOUNTPOINT/.spillfs/control: the request loop of
// spillfs/common/control_protocol.h (control::Channel) behind the library's
// error convention (0 or -errno, the message for spill_last_error()).
//
// One ControlChannel is one open handle of the control file. The daemon ties
// leases to the handle: blocks returned by "layout" are not reused and space
// from "reserve" stays reserved while it is open, so a channel's lifetime is
// the lease's.
#pragma once

#include <charconv>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "spillfs/common/control_protocol.h"

namespace spillfs::client {

inline constexpr uint64_t kHashUnit = 256 << 10;  // the volume's dedup unit

// Appends the units of a dedup or commit request in the compact form,
//   ,"unit_runs":[offset,count,...],"unit_hashes":"<32 hex digits a unit>"
// for `n` units at offset_of(i) (multiples of kHashUnit, increasing), whose
// XXH3-128 (low, high) is at hash_of(i): runs of consecutive units, and the
// 16 bytes of each hash as the daemon lays them out (low then high, in
// memory order), two digits a byte. No allocation a unit.
template <typename OffsetOf, typename HashOf>
void AppendUnitList(std::string* text, size_t n, OffsetOf offset_of, HashOf hash_of) {
  char num[24];  // a u64 has up to 20 digits
  auto append = [&](uint64_t v) {
    auto [end, ec] = std::to_chars(num, num + sizeof(num), v);
    text->append(num, end);
  };
  auto run_end = [&](size_t i) {  // the end of the run from unit i
    size_t j = i + 1;
    while (j < n && offset_of(j) == offset_of(i) + (j - i) * kHashUnit) ++j;
    return j;
  };
  size_t runs = 0;
  for (size_t i = 0; i < n; i = run_end(i)) ++runs;
  text->reserve(text->size() + 42 * runs + 32 * n + 32);  // one allocation for all
  *text += R"(,"unit_runs":[)";
  for (size_t i = 0; i < n;) {
    const size_t j = run_end(i);
    if (i > 0) text->push_back(',');
    append(offset_of(i));
    text->push_back(',');
    append(j - i);
    i = j;
  }
  *text += R"(],"unit_hashes":")";
  static constexpr char kHex[] = "0123456789abcdef";
  size_t at = text->size();
  text->resize(at + 32 * n);
  char* out = text->data() + at;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t* hash = hash_of(i);
    unsigned char bytes[16];
    std::memcpy(bytes, hash, 16);
    for (unsigned char b : bytes) {
      *out++ = kHex[b >> 4];
      *out++ = kHex[b & 15];
    }
  }
  text->push_back('"');
}

class ControlChannel {
 public:
  // Opens `control_path` O_RDWR. Returns 0 or -errno (message set).
  static int Open(const std::string& control_path, std::unique_ptr<ControlChannel>* out);
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  // Sends one request and stores the reply's "result" in *result. Returns 0,
  // or -errno with the daemon's message (or what went wrong on the way).
  // Requests on one channel are serialized.
  int Request(const nlohmann::json& request, nlohmann::json* result);
  // The same, leaving the reply text unparsed (for replies worth a faster
  // parser than a DOM). ParseReply() turns such a text into the result.
  int RequestText(const nlohmann::json& request, std::string* reply);
  // The same with the request already serialized (`op` names it in messages).
  int RequestText(std::string text, const std::string& op, std::string* reply);
  int ParseReply(const std::string& op, const std::string& reply, nlohmann::json* result) const;

 private:
  explicit ControlChannel(control::Channel channel) : channel_(std::move(channel)) {}
  control::Channel channel_;
  std::mutex mu_;
};

}  // namespace spillfs::client
