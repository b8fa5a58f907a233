// libFuzzer target: the whole control file of a mount, ControlPlane::Write +
// Read on a Filesystem opened read-write on a small real volume made at
// start-up in a temporary directory. This exercises the JSON parsing of every
// op: the Inspector ones (stat, ls, du) and the direct-path ones (layout,
// reserve, commit), which change the volume.
//
// An input is up to four requests separated by NUL bytes, sent in turn on one
// handle of .spillfs/control (so a reserve can be followed by a commit), each
// written at offset 0 and padded with blanks to the length of the previous
// one, as a client reusing a handle must do; the reply is read back in
// pieces. Every handle is released, which returns reserved space.
//
// Properties: every reply is a JSON object with a boolean "ok" (a refusal
// with a positive errno and a message); reads by offset reassemble the
// reply; the Filesystem's free space never grows past the data area and is
// back where it was after a handle that committed nothing is released; after
// a successful commit the volume passes fsck (fsck::Checker on the live,
// quiescent index); no crash, leak or sanitizer report.
//
// SPILLFS_FUZZ_VERBOSE=1 prints every request and reply (to replay a case).
#include <fcntl.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "spillfs/control/control_plane.h"
#include "spillfs/inspect/fsck.h"

namespace {

using namespace spillfs;

struct World {
  fuzz::TempVolume temp{64 << 20};
  std::unique_ptr<Filesystem> fs;
  std::unique_ptr<ControlPlane> control;

  World() {
    fs = fuzz::OpenFilesystem(temp.dir(), 4 << 20);
    fuzz::TempVolume::BuildTree(fs.get());
    control = std::make_unique<ControlPlane>(fs.get());
  }
  ~World() {
    control.reset();
    fs.reset();
  }
};

World* world = nullptr;
bool verbose = false;

// fsck of the live volume: nothing runs between inputs, so its index is
// quiescent once the RAM tier is flushed.
void CheckVolume(const std::string& after) {
  Status flushed = world->fs->FlushAll();
  FUZZ_CHECK(flushed.ok(), flushed.ToString());
  fsck::Checker checker(world->fs->volume(), fsck::Checker::Options{});
  auto report = checker.Run();
  FUZZ_CHECK(report.ok(), "fsck could not run: " + report.status().ToString());
  std::string problems;
  for (const fsck::Problem& p : report->problems) {
    problems += std::string("\n  ") + fsck::ProblemKindName(p.kind) + ": " + p.message;
  }
  FUZZ_CHECK(report->clean(), "fsck after " + after + ":" + problems);
}

std::vector<std::string_view> Split(std::string_view input) {
  std::vector<std::string_view> pieces;
  while (pieces.size() < 3) {
    size_t nul = input.find('\0');
    if (nul == std::string_view::npos) break;
    pieces.push_back(input.substr(0, nul));
    input.remove_prefix(nul + 1);
  }
  pieces.push_back(input);
  return pieces;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  static World instance;
  world = &instance;
  verbose = getenv("SPILLFS_FUZZ_VERBOSE") != nullptr;
  CheckVolume("the fixed tree");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ControlPlane& control = *world->control;
  const uint64_t capacity = world->fs->volume().superblock().data_size;
  const uint64_t free_before = world->fs->free_bytes();
  auto opened = control.Open(ControlPlane::kControlIno, O_RDWR, /*opener_uid=*/0);
  FUZZ_CHECK(opened.ok(), opened.status().ToString());
  ControlPlane::Handle* handle = *opened;
  bool committed = false;
  size_t previous = 0;
  for (std::string_view piece : Split(std::string_view(reinterpret_cast<const char*>(data), size))) {
    std::string request(piece);
    if (request.size() < previous) request.resize(previous, ' ');
    previous = request.size();
    auto written = control.Write(handle, 0, request, ControlPlane::RequestCaller{});  // root's, as the tools'
    FUZZ_CHECK(written.ok() && *written == request.size(), "control write");
    // Read in pieces of an odd size, as the kernel may.
    std::string reply;
    for (;;) {
      std::string_view chunk = control.Read(handle, reply.size(), 1000).bytes;
      if (chunk.empty()) break;
      reply.append(chunk);
    }
    FUZZ_CHECK(std::string(control.Read(handle, 0, reply.size() + 1).bytes) == reply, "reply changes between reads");
    if (verbose) fprintf(stderr, "request: %s\nreply: %s\n", request.c_str(), reply.c_str());
    nlohmann::json json = fuzz::CheckControlReply(reply);
    if (json["ok"].get<bool>() && request.find("commit") != std::string::npos) committed = true;
    FUZZ_CHECK(world->fs->free_bytes() <= capacity, "free space exceeds the data area");
  }
  control.Release(handle);
  if (committed) CheckVolume("a commit");
  if (!committed) {
    FUZZ_CHECK(world->fs->free_bytes() == free_before,
               "free space changed by requests that committed nothing: " + std::to_string(free_before) + " -> " +
                   std::to_string(world->fs->free_bytes()));
  }
  return 0;
}
