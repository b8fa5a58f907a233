#!/usr/bin/env python3
"""torch.save / torch.load of one tensor into the host filesystem and into a
spillfs mount, timed side by side (run by spillfs-bench, or alone):

    torch_bench.py --host-dir /data/x --mount-dir /mnt/spill --size 1G [--json]

save: torch.save to an open file, then os.fsync (both timed, and reported
apart); then os.sync. load: page cache dropped first (root), then torch.load
(onto the tensor's device). The tensor is CUDA when torch.cuda is available
(--device to choose). Prints a table, or one JSON line with --json.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from sizes import parse_size  # noqa: E402


def drop_caches(enabled):
    os.sync()
    if not enabled:
        return False
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
        return True
    except OSError:
        return False


def sync_device(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def one(directory, tensor, drop):
    path = os.path.join(directory, "torch_bench.pt")
    nbytes = tensor.numel() * tensor.element_size()
    sync_device(tensor.device)
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(tensor, f)
        f.flush()
        t1 = time.perf_counter()
        os.fsync(f.fileno())
    t2 = time.perf_counter()
    dropped = drop_caches(drop)
    t3 = time.perf_counter()
    loaded = torch.load(path, map_location=tensor.device)
    sync_device(tensor.device)
    t4 = time.perf_counter()
    if not torch.equal(loaded, tensor):
        raise SystemExit(f"torch_bench: {path} read back different bytes")
    del loaded
    os.unlink(path)
    return {
        "bytes": nbytes,
        "save_seconds": t1 - t0,
        "fsync_seconds": t2 - t1,
        "save_GBps": nbytes / (t2 - t0) / 1e9,  # save + fsync
        "load_seconds": t4 - t3,
        "load_GBps": nbytes / (t4 - t3) / 1e9,
        "cold": dropped,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host-dir", required=True)
    ap.add_argument("--mount-dir", required=True)
    ap.add_argument("--size", default="1G")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-drop-caches", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    device = torch.device(args.device)
    n = parse_size(args.size) // 4
    tensor = torch.randn(n, dtype=torch.float32, device=device)
    results = {"device": device.type, "torch": torch.__version__}
    for name, directory in (("host", args.host_dir), ("mount", args.mount_dir)):
        results[name] = one(directory, tensor, not args.no_drop_caches)
    results["save_ratio_mount_to_host"] = results["mount"]["save_GBps"] / results["host"]["save_GBps"]
    results["load_ratio_mount_to_host"] = results["mount"]["load_GBps"] / results["host"]["load_GBps"]
    if args.json:
        print(json.dumps(results))
    else:
        for name in ("host", "mount"):
            r = results[name]
            print(f"{name:6} save+fsync {r['save_GBps']:.3f} GB/s (fsync {r['fsync_seconds']:.2f} s)"
                  f"  load {r['load_GBps']:.3f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
