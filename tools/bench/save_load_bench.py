#!/usr/bin/env python3
"""spillfs.save / spillfs.load against torch.save / torch.load and the raw disk, in one run.

    python3 tools/bench/save_load_bench.py --dir /root/slbench --json-out $OUT/save_load.json

On the filesystem that holds --dir (ext4 on the GPU machine), and on a spillfs
volume made there and mounted by this script (build/bin/spillfs, or --spillfs):

* raw: O_DIRECT 1 MiB pwrite / pread from --qd threads (Python releases the
  GIL, so this is io_uring-like QD --qd), fdatasync included: the limit;
* torch.save + fsync and torch.load, into ext4 and into the mount; again with
  torch's pinned device-to-host copies
  (torch.utils.serialization.config.save.use_pinned_memory_for_d2h, where
  that exists);
* spillfs.save (fsync and rename included) and spillfs.load, into ext4 and
  into the mount, with the library's segment I/O and with the Python I/O;

for a --size CUDA tensor (1 GiB float32) and a model-sized state_dict (bf16,
a few GiB in a few hundred tensors of mixed sizes, shaped like a 1B-parameter
transformer), then the second spillfs.save of that state_dict after 1% of its
bytes changed (whole tensors, as a fine-tune with frozen weights changes
them), into the mount (dedup) and into ext4, with the SSD bytes the volume
wrote (spillfs stat). Every load starts cold (page cache dropped; the mount
remounted). Every save+load pair is checked bit for bit, and files of each
writer are checked with the other reader. Prints a table; --json-out writes
the rows with their ratios to raw. Needs root (mount, drop_caches).
"""

import argparse
import faulthandler
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import spillfs  # noqa: E402
from spillfs import _native  # noqa: E402
from sizes import parse_size  # noqa: E402
from volume import Volume  # noqa: E402

MIB = 1 << 20


def torch_save_config():
    """torch.save's settings (torch.utils.serialization.config.save), or None
    where torch has none (torch 1.13). Imported by name, not looked up as an
    attribute of torch.utils: nothing need have imported it yet."""
    try:
        import torch.utils.serialization.config as config
    except ImportError:
        return None
    return getattr(config, "save", None)


class Bench:
    def __init__(self, args):
        self.args = args
        self.device = torch.device(args.device)
        self.rows = []
        self.raw = {}
        os.makedirs(args.dir, exist_ok=True)
        self.work = tempfile.mkdtemp(prefix="save_load_bench.", dir=args.dir)
        self.host = os.path.join(self.work, "host")
        os.makedirs(self.host)
        self.volume = Volume(args.spillfs, self.work, args.volume_size) if not args.no_mount else None

    # -- plumbing --

    def sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def cold(self, directory):
        """Page cache dropped; the mount remounted (its RAM tier empty)."""
        os.sync()
        if self.volume is not None and directory.startswith(self.volume.mnt):
            self.volume.umount()
            self.volume.mount()
        if not self.args.no_drop_caches:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3")

    def watch(self):
        """(Re)arms the stall dump: every thread's stack on stderr when no row
        comes for --stall-seconds (a device run's output then says where)."""
        if self.args.stall_seconds > 0:
            faulthandler.dump_traceback_later(self.args.stall_seconds, repeat=True)

    def add(self, obj, target, op, method, nbytes, seconds, **extra):
        gbps = nbytes / seconds / 1e9
        raw = self.raw.get((obj, "write" if op.startswith("save") else "read"))
        row = {"object": obj, "target": target, "op": op, "method": method, "bytes": nbytes,
               "seconds": round(seconds, 4), "GBps": round(gbps, 3),
               "ratio_to_raw": round(gbps / raw, 3) if raw else None, **extra}
        self.rows.append(row)
        self.watch()
        print(f"{obj:10} {target:6} {op:12} {method:34} {gbps:7.3f} GB/s  "
              f"{'' if row['ratio_to_raw'] is None else '%.2f x raw' % row['ratio_to_raw']}  "
              f"{json.dumps(extra) if extra else ''}", flush=True)

    # -- raw --

    def raw_io(self, name, nbytes):
        """O_DIRECT 1 MiB requests from qd threads, fdatasync'ed; cold read."""
        import mmap
        path = os.path.join(self.host, "raw.bin")
        chunk, qd = MIB, self.args.qd
        n = (nbytes + chunk - 1) // chunk
        buf = mmap.mmap(-1, chunk)
        buf.write(os.urandom(chunk))

        def run(write):
            fd = os.open(path, (os.O_RDWR | os.O_CREAT | os.O_TRUNC if write else os.O_RDONLY) | os.O_DIRECT, 0o644)
            nxt = iter(range(n))
            lock = threading.Lock()

            def worker():
                local = mmap.mmap(-1, chunk)
                local.write(bytes(buf))
                while True:
                    with lock:
                        i = next(nxt, None)
                    if i is None:
                        return
                    (os.pwritev if write else os.preadv)(fd, [local], i * chunk)

            threads = [threading.Thread(target=worker) for _ in range(qd)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if write:
                os.fdatasync(fd)
            seconds = time.perf_counter() - t0
            os.close(fd)
            return seconds

        ws = run(True)
        self.cold(self.host)
        rs = run(False)
        os.unlink(path)
        size = n * chunk
        self.raw[(name, "write")] = size / ws / 1e9
        self.raw[(name, "read")] = size / rs / 1e9
        self.add(name, "host", "save", f"raw O_DIRECT 1M x{qd} +fdatasync", size, ws)
        self.add(name, "host", "load", f"raw O_DIRECT 1M x{qd}", size, rs)

    # -- the peers --

    def torch_save(self, obj, path, pinned=False):
        config = torch_save_config()
        old = config.use_pinned_memory_for_d2h if pinned else None
        if pinned:
            config.use_pinned_memory_for_d2h = True
        try:
            with open(path, "wb") as f:
                torch.save(obj, f)
                f.flush()
                os.fsync(f.fileno())
        finally:
            if pinned:
                config.use_pinned_memory_for_d2h = old

    def one(self, name, obj, nbytes, target, directory, method):
        path = os.path.join(directory, f"{name}.pt")
        self.sync()
        t0 = time.perf_counter()
        extra_save = {}
        if method.startswith("torch.save"):
            self.torch_save(obj, path, pinned="pinned" in method)
        else:
            backend = "posix" if "posix" in method else "auto"
            crc32 = True if "crc32=True" in method else None
            r = spillfs.save(obj, path, backend=backend, crc32=crc32, dedup=False)
            extra_save = {"backend": r.backend, "crc32_skipped": r.crc32_skipped,
                          "stages": {k: round(v, 3) for k, v in r.seconds.items()}}
        save_s = time.perf_counter() - t0
        self.add(name, target, "save+fsync", method, nbytes, save_s, **extra_save)
        self.cold(directory)
        t0 = time.perf_counter()
        extra_load = {}
        if method.startswith("torch.save"):
            back = torch.load(path, map_location=self.device)
        else:
            report = spillfs.IOReport()
            back = spillfs.load(path, map_location=self.device, backend="posix" if "posix" in method else "auto",
                                report=report)
            extra_load = {"backend": report.backend,
                          "stages": {k: round(v, 3) for k, v in report.seconds.items()}}
        self.sync()
        load_s = time.perf_counter() - t0
        self.add(name, target, "load", method.replace("torch.save", "torch.load").replace(" pinned d2h", ""),
                 nbytes, load_s, **extra_load)
        check_equal(obj, back, f"{method} {target} {name}")
        del back
        if method == "spillfs" and not self.args.skip_cross_checks:  # torch reads our file
            check_equal(obj, torch.load(path, map_location=self.device), f"torch.load of spillfs.save {target}")
        if method == "torch.save" and not self.args.skip_cross_checks:  # we read torch's
            check_equal(obj, spillfs.load(path, map_location=self.device), f"spillfs.load of torch.save {target}")
        os.unlink(path)

    def two_saves(self, sd, changed, target, save):
        """`save(1)`, then, with the `changed` tensors of `sd` plus one, `save(2)` (the
        caller sets them back), each timed from a synchronized device; `spillfs stat` of
        the mount around them. A dict: each save's result (`r1`, `r2`) and seconds
        (`first`, `second`); the stats (`before`, `mid`, `after`: None off the mount),
        and `ssd`: the SSD fields of the row (none off the mount)."""
        stat = self.volume.stat if target == "mount" else (lambda: None)
        out = {"before": stat()}
        self.sync()
        t0 = time.perf_counter()
        out["r1"] = save(1)
        out["first"] = time.perf_counter() - t0
        out["mid"] = stat()
        for c in changed:
            sd[c].add_(1)
        self.sync()
        t0 = time.perf_counter()
        out["r2"] = save(2)
        out["second"] = time.perf_counter() - t0
        out["after"] = stat()
        before, mid, after = out["before"], out["mid"], out["after"]
        out["ssd"] = {} if after is None else {
            "ssd_bytes_first": mid["bytes_written_ssd"] - before["bytes_written_ssd"],
            "ssd_bytes_second": after["bytes_written_ssd"] - mid["bytes_written_ssd"],
            "physical_bytes_added_second": after["physical_bytes"] - mid["physical_bytes"]}
        return out

    def execute(self):
        """run() with the stall dump armed; the volume closed and the work directory removed whatever happens."""
        try:
            self.watch()
            self.run()
        finally:
            faulthandler.cancel_dump_traceback_later()
            self.close()

    def dedup_second_save(self, sd, nbytes):
        changed, changed_bytes = one_percent_changed(sd, nbytes)
        targets = [("host", self.host)] + ([("mount", self.volume.mnt)] if self.volume else [])
        for target, directory in targets:
            two = self.two_saves(sd, changed, target,
                                 lambda i: spillfs.save(sd, os.path.join(directory, f"step{i}.pt")))
            r1, first, r2, second, mid, after = (two[k] for k in ("r1", "first", "r2", "second", "mid", "after"))
            extra = {"changed_bytes": changed_bytes, "changed_tensors": len(changed),
                     "bytes_written": r2.bytes_written, "bytes_shared": r2.bytes_shared, "dedup": r2.dedup,
                     "first_save_seconds": round(first, 3), "speedup_vs_first": round(first / second, 2),
                     "stages": {k: round(v, 4) for k, v in r2.seconds.items()},
                     "dedup_requests": getattr(r2, "dedup_requests", None),
                     "units_changed_in_place": getattr(r2, "units_changed_in_place", None),
                     "io_stats": {k: round(v, 4) if isinstance(v, float) else v
                                  for k, v in (getattr(r2, "io_stats", None) or {}).items()}}
            extra.update(two["ssd"])
            if after is not None:
                extra["data_syncs_second"] = after.get("data_syncs", 0) - mid.get("data_syncs", 0)
                extra["data_sync_seconds_second"] = round(
                    after.get("data_sync_seconds", 0) - mid.get("data_sync_seconds", 0), 4)
            self.add("state_dict", target, "save 2 (1%)", "spillfs dedup", nbytes, second, **extra)
            check_equal(sd, torch.load(os.path.join(directory, "step2.pt"), map_location=self.device),
                        f"dedup'd save {target}")
            for c in changed:
                sd[c].sub_(1)
            os.unlink(os.path.join(directory, "step1.pt"))
            os.unlink(os.path.join(directory, "step2.pt"))
            del r1

    def run(self):
        a = self.args
        dev = self.device
        tensor = torch.randn(parse_size(a.size) // 4, dtype=torch.float32, device=dev)
        sd = model_state_dict(a.layers, a.hidden, a.intermediate, a.vocab, dev)
        sd_bytes = sum(t.numel() * t.element_size() for t in sd.values())
        print(f"torch {torch.__version__}, device {dev}, spillfs {spillfs.__version__}, native segment I/O: "
              f"{_native.segment_io() is not None} ({_native.library_path()}); state_dict: {len(sd)} tensors, "
              f"{sd_bytes / 2**30:.2f} GiB bf16", flush=True)
        pinned_d2h = dev.type == "cuda" and hasattr(torch_save_config(), "use_pinned_memory_for_d2h")
        methods = ["torch.save"] + (["torch.save pinned d2h"] if pinned_d2h else []) + ["spillfs", "spillfs posix"]
        if a.methods:  # a short run: these writers only
            methods = [m for m in methods if m in a.methods.split(",")]
        targets = [("host", self.host)] + ([("mount", self.volume.mnt)] if self.volume else [])
        parts = set(a.parts.split(","))
        for name, obj, nbytes in (("tensor", tensor, tensor.numel() * 4), ("state_dict", sd, sd_bytes)):
            if name not in parts:
                continue
            self.raw_io(name, nbytes)
            for target, directory in targets:
                for method in methods + (["spillfs crc32=True"] if name == "tensor" and dev.type == "cuda" else []):
                    self.one(name, obj, nbytes, target, directory, method)
        if "dedup" in parts:
            self.dedup_second_save(sd, sd_bytes)

    def close(self):
        if self.volume is not None:
            if not self.volume.close():
                print(f"left {self.work}: {self.volume.mnt} is still mounted", file=sys.stderr)
                return
        subprocess.run(["rm", "-rf", self.work])


def model_state_dict(layers, hidden, intermediate, vocab, device):
    """A transformer's state_dict in bf16: embeddings, per layer q/k/v/o,
    gate/up/down and two norms, a final norm and the output head."""
    g = torch.Generator(device=device).manual_seed(0)

    def w(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=torch.float32).to(torch.bfloat16)

    sd = {"embed_tokens.weight": w(vocab, hidden)}
    for i in range(layers):
        p = f"layers.{i}."
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            sd[p + f"self_attn.{n}.weight"] = w(hidden, hidden)
        sd[p + "mlp.gate_proj.weight"] = w(intermediate, hidden)
        sd[p + "mlp.up_proj.weight"] = w(intermediate, hidden)
        sd[p + "mlp.down_proj.weight"] = w(hidden, intermediate)
        sd[p + "input_layernorm.weight"] = w(hidden)
        sd[p + "post_attention_layernorm.weight"] = w(hidden)
        sd[p + "self_attn.rotary_emb.inv_freq"] = w(hidden // 32)
    sd["norm.weight"] = w(hidden)
    sd["lm_head.weight"] = w(vocab, hidden)
    return sd


def check_equal(a, b, what):
    if isinstance(a, torch.Tensor):
        if not (a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b.to(a.device))):
            raise SystemExit(f"save_load_bench: {what}: read back different tensors")
        return
    if set(a) != set(b):
        raise SystemExit(f"save_load_bench: {what}: other keys")
    for k in a:
        check_equal(a[k], b[k], f"{what} [{k}]")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, help="directory on the disk to measure (files and the volume go here)")
    ap.add_argument("--size", default="1G", help="the tensor's size")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=5632)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--qd", type=int, default=16, help="threads of the raw O_DIRECT figures")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--spillfs", default=os.path.join(ROOT, "build", "bin", "spillfs"))
    ap.add_argument("--volume-size", default="48G")
    ap.add_argument("--no-mount", action="store_true", help="ext4 only")
    ap.add_argument("--no-drop-caches", action="store_true")
    ap.add_argument("--skip-cross-checks", action="store_true")
    ap.add_argument("--parts", default="tensor,state_dict,dedup",
                    help="what to run, comma-separated: tensor, state_dict, dedup (the second save of the state_dict)")
    ap.add_argument("--methods", help="only these writers, comma-separated (torch.save, torch.save pinned d2h, "
                    "spillfs, spillfs posix); default all")
    ap.add_argument("--json-out")
    ap.add_argument("--stall-seconds", type=float, default=90,
                    help="dump every thread's stack when no row comes for this long (0: never)")
    args = ap.parse_args()
    unknown = set(args.parts.split(",")) - {"tensor", "state_dict", "dedup"}
    if unknown:
        ap.error(f"--parts: unknown {', '.join(sorted(unknown))} (tensor, state_dict, dedup)")
    bench = Bench(args)
    bench.execute()
    report(bench, args, raw_GBps=figures(bench.raw))
    return 0


def one_percent_changed(sd, nbytes):
    """The names of the tensors a second save changes, the small ones first, until they hold 1% of
    `nbytes`; and their bytes."""
    changed, want = [], nbytes // 100
    for k in sorted(sd, key=lambda k: (sd[k].numel(), k)):
        if sum(sd[c].numel() * sd[c].element_size() for c in changed) >= want:
            break
        changed.append(k)
    return changed, sum(sd[c].numel() * sd[c].element_size() for c in changed)


def figures(by_key):
    """{(object, op): GB/s} as JSON's {"object op": GB/s}."""
    return {f"{k[0]} {k[1]}": round(v, 3) for k, v in by_key.items()}


def report(bench, args, **extra):
    """Prints the run as JSON (versions, device, `extra`, the arguments and the rows) and writes
    it to ``args.json_out`` when given."""
    result = {"torch": torch.__version__, "device": str(bench.device),
              "gpu": torch.cuda.get_device_name(bench.device) if bench.device.type == "cuda" else None,
              "native_segment_io": _native.segment_io() is not None, "spillfs": spillfs.__version__,
              **extra, "args": vars(args), "rows": bench.rows}
    text = json.dumps(result, indent=1)
    print(text)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    sys.exit(main())
