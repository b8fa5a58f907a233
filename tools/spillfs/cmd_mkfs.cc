// spillfs mkfs VOLUME --size SIZE [--device PATH] [--force]
#include <fmt/format.h>

#include "commands.h"
#include "sizes.h"
#include "spillfs/store/volume.h"

namespace spillfs::cli {
namespace {

struct MkfsArgs {
  std::string volume;
  std::string size;
  std::string device;
  bool force = false;
  bool no_checksums = false;
  bool no_dedup = false;
};

int RunMkfs(const MkfsArgs& args) {
  Volume::CreateOptions options;
  if (!args.size.empty()) {
    auto size = ParseSize(args.size);
    if (!size.ok()) return Fail("mkfs", size.status().message());
    options.size = *size;
  } else if (args.device.empty()) {
    return Fail("mkfs", "--size is required for an image-file volume");
  }
  options.device = args.device;
  options.force = args.force;
  options.checksums = !args.no_checksums;
  options.dedup = !args.no_dedup;
  auto sb = Volume::Create(args.volume, options);
  if (!sb.ok()) return Fail("mkfs", sb.status().message());
  std::string data = sb->backing == BackingKind::kBlockDevice ? sb->device_path : Volume::ImagePath(args.volume);
  fmt::print("spillfs: made volume {} ({}, uuid {}) with data in {}\n", args.volume, HumanBytes(sb->data_size),
             sb->UuidString(), data);
  return 0;
}

}  // namespace

void RegisterMkfs(CLI::App& app, int* exit_code) {
  auto [cmd, args] = AddCommand<MkfsArgs>(
      app, "mkfs", "Make a new volume: an index and a data area (image file or device)", exit_code, RunMkfs);
  cmd->add_option("VOLUME", args->volume, "Directory to hold the volume (created if missing)")->required();
  cmd->add_option("--size", args->size, "Size of the data area, e.g. 64G (default with --device: the whole device)");
  cmd->add_option("--device", args->device, "Block device to hold the data instead of VOLUME/data.img");
  cmd->add_flag("--force", args->force, "Replace an existing, unmounted volume");
  cmd->add_flag("--no-checksums", args->no_checksums, "Do not checksum data blocks");
  cmd->add_flag("--no-dedup", args->no_dedup, "Turn off deduplication for this volume");
}

}  // namespace spillfs::cli
