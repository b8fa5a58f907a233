// spillfs-faulty: the spillfs command with its test seams filled in, for the
// mounted tests that inject faults (test-only; built with the tests, never
// installed). Same sources as spillfs (tools/spillfs); only this main
// differs, and only it reads the environment:
//   SPILLFS_POWERCUT_JOURNAL=PATH        the data area journals its pre-images
//                                        to PATH (spillfs/testing/powercut.h)
//   SPILLFS_POWERCUT_INDEX_JOURNAL=PATH  the index journals what is durable
//   SPILLFS_FAULTY_RAM_TIER_SLABS=N      the RAM tier runs out of memory after
//                                        N slabs (spillfs/testing/memory.h)
// Unset, it behaves as spillfs.
#include <cstdlib>
#include <string>

#include "commands.h"
#include "spillfs/testing/memory.h"
#include "spillfs/testing/powercut.h"

namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

}  // namespace

int main(int argc, char** argv) {
  spillfs::cli::DaemonHooks hooks;
  hooks.volume =
      spillfs::powercut::Wrappers(Env(spillfs::powercut::kDataJournalEnv), Env(spillfs::powercut::kIndexJournalEnv));
  if (std::string slabs = Env(spillfs::memory::kRamTierSlabsEnv); !slabs.empty()) {
    hooks.ram_tier_slab_fault = spillfs::memory::FailSlabsAfter(std::strtoull(slabs.c_str(), nullptr, 10));
  }
  return spillfs::cli::Main(argc, argv, hooks);
}
