#!/usr/bin/env python3
"""spillfs.safetensors against the safetensors library, into the host fs and into a spillfs mount.

    python3 tools/bench/safetensors_bench.py --dir /root/stbench --spillfs .devrun/bin/spillfs \
        --json-out $OUT/safetensors.json

For save_load_bench.py's model-sized state_dict (bf16, ~2.5 GiB in a few
hundred tensors, on --device: CUDA where there is one), into the filesystem
of --dir (ext4 on the GPU machine) and into a spillfs volume made there:

* ``safetensors.torch.save_file`` + fsync of the file, and
  ``safetensors.torch.load_file(device=...)`` (cold), where the library is
  installed (rows skipped, and said so, where it is not);
* ``spillfs.safetensors.save_file`` (fsync and rename included) and
  ``load_file(device=...)``, with the library's segment I/O and with the
  Python I/O (``backend="posix"``);
* the second ``spillfs.safetensors.save_file`` after 1% of the bytes changed
  (whole tensors, the small ones first, as save_load_bench's dedup part),
  into the mount (dedup) and into the host fs: bytes written, shared, and the
  SSD bytes the volume wrote (``spillfs stat``).

Every load starts cold (page cache dropped; the mount remounted). Every
save+load pair is checked bit for bit, and each writer's file with the other
reader. Prints a row per figure; --json-out writes them. Needs root.
"""

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import spillfs  # noqa: E402
import spillfs.safetensors as st  # noqa: E402
import save_load_bench  # noqa: E402
from save_load_bench import check_equal, model_state_dict  # noqa: E402
from spillfs import _native  # noqa: E402

try:
    import safetensors.torch as library
except ImportError:  # the GPU machine may lack it: our rows only
    library = None


class Bench(save_load_bench.Bench):
    """save_load_bench's work directory, volume, sync and cold start; rows of its own."""

    def __init__(self, args):
        super().__init__(args)
        self.targets = [("host", self.host)] + ([("mount", self.volume.mnt)] if self.volume else [])

    def add(self, target, op, method, nbytes, seconds, **extra):
        row = {"target": target, "op": op, "method": method, "bytes": nbytes, "seconds": round(seconds, 4),
               "GBps": round(nbytes / seconds / 1e9, 3), **extra}
        self.rows.append(row)
        print(f"{target:6} {op:14} {method:32} {row['GBps']:7.3f} GB/s  {json.dumps(extra) if extra else ''}",
              flush=True)

    def save(self, method, sd, path):
        """Saves with `method`; the extra fields of its row."""
        if method == "safetensors":
            library.save_file(sd, path)
            fd = os.open(path, os.O_RDONLY)  # the library does not fsync: the figure includes it, as ours
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            return {}
        r = st.save_file(sd, path, backend="posix" if "posix" in method else "auto", dedup=False)
        return {"backend": r.backend, "io_path": r.io_path, "stages": {k: round(v, 3) for k, v in r.seconds.items()}}

    def load(self, method, path):
        if method == "safetensors":
            return library.load_file(path, device=str(self.device))
        return st.load_file(path, device=str(self.device), backend="posix" if "posix" in method else "auto")

    def pair(self, sd, nbytes, target, directory, method):
        path = os.path.join(directory, f"{method.replace(' ', '_')}.safetensors")
        self.sync()
        t0 = time.perf_counter()
        extra = self.save(method, sd, path)
        self.add(target, "save+fsync", method, nbytes, time.perf_counter() - t0, **extra)
        self.cold(directory)
        t0 = time.perf_counter()
        back = self.load(method, path)
        self.sync()
        self.add(target, "load", method, nbytes, time.perf_counter() - t0)
        check_equal(sd, back, f"{method} {target}")
        del back
        if library is not None and not self.args.skip_cross_checks:  # each reads the other's file
            other = "spillfs" if method == "safetensors" else "safetensors"
            check_equal(sd, self.load(other, path), f"{other} reading the file of {method} ({target})")
        os.unlink(path)

    def second_save(self, sd, nbytes):
        changed, changed_bytes = save_load_bench.one_percent_changed(sd, nbytes)
        for target, directory in self.targets:
            two = self.two_saves(sd, changed, target,
                                 lambda i: st.save_file(sd, os.path.join(directory, f"step{i}.safetensors")))
            r2, first, second = two["r2"], two["first"], two["second"]
            extra = {"changed_bytes": changed_bytes, "changed_tensors": len(changed),
                     "bytes_written": r2.bytes_written, "bytes_shared": r2.bytes_shared, "dedup": r2.dedup,
                     "file_bytes": r2.file_bytes, "first_save_seconds": round(first, 3),
                     "stages": {k: round(v, 4) for k, v in r2.seconds.items()},
                     "dedup_requests": r2.dedup_requests, "units_changed_in_place": r2.units_changed_in_place,
                     **two["ssd"]}
            self.add(target, "save 2 (1%)", "spillfs dedup", nbytes, second, **extra)
            check_equal(sd, st.load_file(os.path.join(directory, "step2.safetensors"), device=str(self.device)),
                        f"second save {target}")
            if library is not None:
                check_equal(sd, library.load_file(os.path.join(directory, "step2.safetensors")),
                            f"the library reading the second save {target}")
            for c in changed:
                sd[c].sub_(1)
            for name in ("step1.safetensors", "step2.safetensors"):
                os.unlink(os.path.join(directory, name))

    def run(self):
        a = self.args
        sd = model_state_dict(a.layers, a.hidden, a.intermediate, a.vocab, self.device)
        nbytes = sum(t.numel() * t.element_size() for t in sd.values())
        print(f"torch {torch.__version__}, device {self.device}, spillfs {spillfs.__version__}, native segment "
              f"I/O: {_native.segment_io() is not None}; safetensors: "
              f"{'not installed' if library is None else __import__('safetensors').__version__}; state_dict: "
              f"{len(sd)} tensors, {nbytes / 2**30:.2f} GiB bf16", flush=True)
        methods = (["safetensors"] if library is not None else []) + ["spillfs", "spillfs posix"]
        if a.methods:
            methods = [m for m in methods if m in a.methods.split(",")]
        parts = set(a.parts.split(","))
        if "pairs" in parts:
            for target, directory in self.targets:
                for method in methods:
                    self.pair(sd, nbytes, target, directory, method)
        if "dedup" in parts:
            self.second_save(sd, nbytes)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, help="directory on the disk to measure (files and the volume go here)")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=5632)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--spillfs", default=os.path.join(ROOT, "build", "bin", "spillfs"))
    ap.add_argument("--volume-size", default="32G")
    ap.add_argument("--no-mount", action="store_true", help="the host fs only")
    ap.add_argument("--no-drop-caches", action="store_true")
    ap.add_argument("--skip-cross-checks", action="store_true")
    ap.add_argument("--parts", default="pairs,dedup", help="pairs (save+load per writer), dedup (the second save)")
    ap.add_argument("--methods", help="only these, comma-separated: safetensors, spillfs, spillfs posix")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    bench = Bench(args)
    try:
        bench.run()
    finally:
        bench.close()
    save_load_bench.report(bench, args,
                           safetensors=None if library is None else __import__("safetensors").__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
