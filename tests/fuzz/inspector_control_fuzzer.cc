// libFuzzer target: ControlPlane::AnswerInspection, the request parser and
// the dispatch of the inspection ops of the control interface
// (MOUNTPOINT/.spillfs/control) to Inspector, over a small real volume made
// once at start-up in a temporary directory and opened read-only, as
// `spillfs stat / ls / du` open an unmounted volume.
//
// Properties: every request, however malformed, gets a reply that is a JSON
// object with a boolean "ok"; a refusal carries a positive "errno" and an
// "error" message; no crash, leak or sanitizer report.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "spillfs/control/control_plane.h"
#include "fuzz_util.h"
#include "spillfs/inspect/inspector.h"

namespace {

using namespace spillfs;

struct World {
  fuzz::TempVolume temp{32 << 20};
  std::unique_ptr<Volume> volume;
  std::unique_ptr<Inspector> inspector;

  World() {
    {
      auto fs = fuzz::OpenFilesystem(temp.dir(), 0);
      fuzz::TempVolume::BuildTree(fs.get());
    }
    auto opened = Volume::Open(temp.dir(), Volume::OpenOptions{.read_only = true});
    FUZZ_CHECK(opened.ok(), opened.status().ToString());
    volume = std::move(opened).value();
    inspector = std::make_unique<Inspector>(volume->index(), volume->superblock());
  }
  ~World() {
    inspector.reset();
    volume.reset();
  }
};

World* world = nullptr;

// An inspection that succeeds says what it found.
void CheckReply(const std::string& reply) {
  nlohmann::json json = fuzz::CheckControlReply(reply);
  if (json["ok"].get<bool>()) FUZZ_CHECK(json.contains("result"), "success without result: " + reply.substr(0, 200));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  static World instance;  // destroyed at exit: the volume's directory goes with it
  world = &instance;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view request(reinterpret_cast<const char*>(data), size);
  RuntimeStats runtime;
  runtime.mounted = size % 2 == 1;
  runtime.has_free_bytes = size % 3 == 1;
  runtime.free_bytes = size;
  CheckReply(ControlPlane::AnswerInspection(*world->inspector, request, runtime));
  return 0;
}
