// Shared helpers of the libFuzzer targets (tests/fuzz): a property check that
// aborts (so libFuzzer records a crash with the input), a small real volume
// in a temporary directory holding a fixed tree, and the properties of every
// control reply.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "spillfs/core/filesystem.h"
#include "spillfs/store/volume.h"

// A broken property is a crash: libFuzzer keeps the input that caused it.
#define FUZZ_CHECK(cond, what)                                                                                         \
  do {                                                                                                                 \
    if (!(cond)) {                                                                                                     \
      std::fprintf(stderr, "%s:%d: property failed: %s (%s)\n", __FILE__, __LINE__, #cond, std::string(what).c_str()); \
      std::abort();                                                                                                    \
    }                                                                                                                  \
  } while (0)

namespace spillfs::fuzz {

// A volume of `size` bytes made in a fresh directory under /tmp (or
// $TMPDIR), removed again by the destructor.
class TempVolume {
 public:
  explicit TempVolume(uint64_t size);
  ~TempVolume();
  TempVolume(const TempVolume&) = delete;
  TempVolume& operator=(const TempVolume&) = delete;

  const std::string& dir() const { return dir_; }

  // Fills the volume through `fs` with the fixed tree:
  //   /a.txt (10000 bytes, also /d/hard), /empty, /d/, /d/b.bin (12288
  //   bytes), /d/sub/c, /d/link -> b.bin, /d/loop -> loop, /abs -> /etc,
  //   /sparse (4 KiB at 1 MiB), /prealloc (fallocated 8 KiB), /eph/
  //   (ephemeral) with /eph/t, /fifo, and /deep/1/2/.../8/leaf.
  // Aborts on any error: the fuzzer is useless without it.
  static void BuildTree(Filesystem* fs);

 private:
  std::string root_;
  std::string dir_;
};

// Opens the volume in `dir` read-write as a Filesystem (aborts on failure).
std::unique_ptr<Filesystem> OpenFilesystem(const std::string& dir, uint64_t ram_tier_bytes);

// What every reply of the control interface is, whatever the request: a JSON
// object with a boolean "ok"; a refusal carries a positive "errno" and an
// "error" message. Aborts otherwise; returns the parsed reply.
nlohmann::json CheckControlReply(const std::string& reply);

}  // namespace spillfs::fuzz
