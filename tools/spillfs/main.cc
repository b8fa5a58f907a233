// spillfs: make, mount and inspect spillfs volumes. Installed also as
// mount.fuse.spillfs (a symlink), the helper of `mount -t fuse.spillfs`.
#include "commands.h"

int main(int argc, char** argv) {
  if (argc > 0 && spillfs::cli::IsMountHelperName(argv[0])) return spillfs::cli::MountHelperMain(argc, argv);
  return spillfs::cli::Main(argc, argv);
}
