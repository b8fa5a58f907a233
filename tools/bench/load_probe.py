"""The bench's state_dict (bf16, 243 tensors) saved into a fresh spillfs
volume, the volume unmounted and mounted again, then loaded to CUDA twice:
each step's seconds, the load's stages and I/O stats. A thread dump every
40 s while it runs (save_load_bench.py's load from the mount has stalled on
the GPU machine; this is that sequence alone).

    python3 tools/bench/load_probe.py --dir /root/lprobe --spillfs .devrun/bin/spillfs
"""

import argparse
import faulthandler
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spillfs  # noqa: E402
from save_load_bench import model_state_dict  # noqa: E402
from volume import Volume  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--spillfs", required=True)
    args = ap.parse_args()
    faulthandler.dump_traceback_later(40, repeat=True, file=sys.stdout)
    vol = Volume(args.spillfs, args.dir, "48G")

    def now():
        torch.cuda.synchronize()
        return time.perf_counter()
    try:
        sd = model_state_dict(24, 2048, 5632, 32000, torch.device("cuda"))
        a = now()
        spillfs.save(sd, vol.mnt + "/sd.pt", dedup=False)
        print(f"save {now() - a:.2f} s", flush=True)
        a = now()
        os.sync()
        print(f"sync {now() - a:.2f} s", flush=True)
        a = now()
        vol.umount()
        print(f"umount {now() - a:.2f} s", flush=True)
        a = now()
        vol.mount()
        print(f"mount {now() - a:.2f} s", flush=True)
        for _ in range(2):
            r = spillfs.IOReport()
            a = now()
            back = spillfs.load(vol.mnt + "/sd.pt", map_location="cuda", report=r)
            print(f"load {now() - a:.2f} s {r.seconds} {r.io_stats}", flush=True)
            del back
    finally:
        faulthandler.cancel_dump_traceback_later()
        vol.umount(check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
