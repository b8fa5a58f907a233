"""Second saves in a row: the bench's transformer state_dict saved into a
fresh spillfs volume, then, step after step, 1% of its bytes changed (the
smallest tensors first, whole tensors, as save_load_bench's dedup part) and
saved again with dedup, the previous step's file removed. Prints each
step's time against the first save's, its stages, the units written
without asking (changed in place) and the native dedup call's time.

    python3 tools/bench/dedup_steps.py --dir /root/dprobe --spillfs build/bin/spillfs --steps 7
"""

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import spillfs  # noqa: E402
from spillfs import _io  # noqa: E402
from save_load_bench import model_state_dict  # noqa: E402
from volume import Volume  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, help="where the volume goes")
    ap.add_argument("--spillfs", required=True, help="the spillfs binary")
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--volume-size", default="48G")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=24)
    args = ap.parse_args()
    device = torch.device(args.device)

    def now():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter()

    calls = []
    native_dedup = _io.NativeFile.dedup_units

    def timed(self, offsets, hashes):
        t0 = time.perf_counter()
        try:
            return native_dedup(self, offsets, hashes)
        finally:
            calls.append(time.perf_counter() - t0)
    _io.NativeFile.dedup_units = timed

    vol = Volume(args.spillfs, args.dir, args.volume_size)
    try:
        sd = model_state_dict(args.layers, 2048, 5632, 32000, device)
        nbytes = sum(t.numel() * t.element_size() for t in sd.values())
        changed, want = [], nbytes // 100
        for k in sorted(sd, key=lambda k: (sd[k].numel(), k)):
            if sum(sd[c].numel() * sd[c].element_size() for c in changed) >= want:
                break
            changed.append(k)
        t0 = now()
        spillfs.save(sd, os.path.join(vol.mnt, "step0.pt"))
        first = now() - t0
        for step in range(1, args.steps + 1):
            for c in changed:
                sd[c].add_(1)
            calls.clear()
            t0 = now()
            r = spillfs.save(sd, os.path.join(vol.mnt, f"step{step}.pt"))
            t = now() - t0
            print(f"step {step}: {1e3 * t:.1f} ms (first {1e3 * first:.0f} ms, {first / t:.1f}x); stages "
                  + json.dumps({k: round(1e3 * v, 1) for k, v in r.seconds.items()})
                  + f"; written unasked {r.units_changed_in_place} units; native dedup call {1e3 * sum(calls):.1f} ms",
                  flush=True)
            os.unlink(os.path.join(vol.mnt, f"step{step - 1}.pt"))
    finally:
        vol.umount(check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
