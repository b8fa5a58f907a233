#!/usr/bin/env python3
"""spillfs.save(..., background=True) during a training loop: the stall at the call and the steps during the write.

    export LD_LIBRARY_PATH=$PWD/.devrun/devlibs:$LD_LIBRARY_PATH \
        SPILLFS_CLIENT_LIB=$PWD/.devrun/lib/libspillfs_client.so
    python3 tools/bench/background_save_bench.py --dir /root/bgbench --spillfs .devrun/bin/spillfs \
        --json-out $OUT/background_save.json

A training loop of activation_bench.py's decoder (its --size, default h2048:
16 layers, hidden 2048, seq 2048, batch 8; bf16 on CUDA, float32 on the CPU)
with AdamW: forward, backward, optimizer step, each step timed alone (the
device synchronized around it). After --warmup untimed steps, --steps timed
steps of each loop:

* ``none``: no save: the step time;
* ``sync``: ``spillfs.save(model.state_dict(), path)`` after every --every-th
  step: the stall is the save's time;
* ``background``: ``spillfs.save(model.state_dict(), path, background=True)``
  after every --every-th step: the stall is the time until it returns (the
  snapshot: pickle and device -> host copy), and the steps that start while a
  write is in flight are timed apart from the others;

the sync and background loops into a spillfs volume made and mounted under
--dir, and into --dir's filesystem (ext4 on the GPU machine). Per target:
``stall_fraction``: the background stall (median from the second save on:
the first pays for the snapshot's buffer, reported apart) over the sync
save's median (target <= 0.05), and ``step_rise``: the median step during a
write over the no-save loop's median, minus one (target <= 0.10). Each file
is read back with torch.load once its write is done (between steps, untimed)
and checked bit for bit against a clone of the state_dict taken at the call
(before it, untimed): the file holds the values at the call though the
optimizer changed them after. Prints a row per loop; --json-out writes them.
Needs root (mount). CPU smoke run: --device cpu --size tiny --vocab 512
--steps 6 --every 3 --warmup 1.
"""

import argparse
import gc
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import spillfs  # noqa: E402
import save_load_bench  # noqa: E402
from activation_bench import SIZES, build_model  # noqa: E402
from save_load_bench import check_equal  # noqa: E402


def median(values):
    return statistics.median(values) if values else None


def ms(seconds):
    return "   -" if seconds is None else f"{seconds * 1e3:9.2f} ms"


def r4(value):
    return None if value is None else round(value, 4)


class Bench(save_load_bench.Bench):
    """save_load_bench's work directory, volume and sync; a training loop's rows."""

    def __init__(self, args):
        super().__init__(args)
        self.targets = [("host", self.host)] + ([("mount", self.volume.mnt)] if self.volume else [])
        self.model = self.idx = self.tgt = self.opt = None  # made by run (the volume is closed if that fails)
        self.baseline = None  # the no-save loop's median step

    def step(self):
        """One training step, timed with the device synchronized around it."""
        self.sync()
        t0 = time.perf_counter()
        logits = self.model(self.idx)
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), self.tgt.view(-1))
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.sync()
        return time.perf_counter() - t0

    def check(self, path, clone, what):
        """The file against the state at the call; then both gone."""
        check_equal(clone, torch.load(path, map_location=self.device, weights_only=True), what)
        os.unlink(path)

    def loop(self, mode, target=None, directory=None):
        """`args.warmup` + `args.steps` steps, saving in `mode` after every `args.every`-th timed one."""
        a = self.args
        steps, during, stalls, writes = [], [], [], []
        pending = []  # (future, path, clone, the call's time) of background saves not yet checked
        for i in range(a.warmup + a.steps):
            for p in [p for p in pending if p[0].done()]:  # between steps, untimed
                report = p[0].result()
                writes.append(report.seconds.get("total"))
                self.check(p[1], p[2], f"background save {target} {os.path.basename(p[1])}")
                pending.remove(p)
            in_flight = bool(pending)
            dt = self.step()
            k = i - a.warmup  # the timed step's number
            if k < 0:
                continue
            (during if in_flight else steps).append(dt)
            if mode == "none" or (k + 1) % a.every:
                continue
            path = os.path.join(directory, f"step{k + 1}.pt")
            sd = self.model.state_dict()
            if mode == "sync":
                self.sync()
                t0 = time.perf_counter()
                spillfs.save(sd, path)
                stalls.append(time.perf_counter() - t0)
                self.check(path, sd, f"sync save {target} step {k + 1}")
                continue
            clone = {name: t.detach().clone() for name, t in sd.items()}
            self.sync()
            t0 = time.perf_counter()
            future = spillfs.save(sd, path, background=True, max_host_bytes=a.max_host_bytes)
            stalls.append(time.perf_counter() - t0)
            pending.append((future, path, clone, t0))
        for future, path, clone, _ in pending:  # after the loop: waited for, untimed
            writes.append(future.result().seconds.get("total"))
            self.check(path, clone, f"background save {target} {os.path.basename(path)}")
        return steps, during, stalls, writes

    def add_loop(self, mode, target, steps, during, stalls, writes, **extra):
        step = median(steps)
        row = {"mode": mode, "target": target, "steps": len(steps) + len(during), "step_seconds": r4(step),
               "step_seconds_all": [r4(s) for s in steps], "saves": len(stalls),
               "stall_seconds": [r4(s) for s in stalls], **extra}
        if mode == "background":
            row.update(steps_during_write=len(during), step_during_write_seconds=r4(median(during)),
                       step_during_write_all=[r4(s) for s in during],
                       write_seconds=[r4(w) for w in writes])
        self.rows.append(row)
        print(f"{mode:10} {target or '':5} step {ms(step)}"
              + (f"  step during write {ms(median(during))}" if during else "")
              + "".join(f"  {k} {v}" for k, v in extra.items()), flush=True)
        return row

    def run(self):
        a = self.args
        layers, h, heads, seq, batch = SIZES[a.size]
        self.model, self.idx, self.tgt = build_model(a.size, a.vocab, self.device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        params = sum(p.numel() for p in self.model.parameters())
        sd_bytes = sum(t.numel() * t.element_size() for t in self.model.state_dict().values())
        print(f"torch {torch.__version__}, device {self.device}, spillfs {spillfs.__version__}; model {a.size}: "
              f"{layers} layers, hidden {h}, seq {seq}, batch {batch}, {params / 1e9:.3f} B params, state_dict "
              f"{sd_bytes / 2**30:.3f} GiB {next(self.model.parameters()).dtype}; a save every {a.every} steps",
              flush=True)
        steps, _, _, _ = self.loop("none")
        self.baseline = median(steps)
        self.add_loop("none", None, steps, [], [], [])
        for target, directory in self.targets:
            sync = self.loop("sync", target, directory)
            sync_stall = median(sync[2])
            self.add_loop("sync", target, *sync, stall_median=r4(sync_stall),
                          save_GBps=round(sd_bytes / sync_stall / 1e9, 3))
            steps, during, stalls, writes = self.loop("background", target, directory)
            steady = median(stalls[1:]) if len(stalls) > 1 else median(stalls)
            during_step = median(during)
            self.add_loop("background", target, steps, during, stalls, writes,
                          stall_first=r4(stalls[0]) if stalls else None, stall_median=r4(steady),
                          stall_fraction=round(steady / sync_stall, 4),
                          stall_fraction_first=round(stalls[0] / sync_stall, 4),
                          step_rise=round(during_step / self.baseline - 1, 4) if during_step else None,
                          step_rise_vs_same_loop=round(during_step / median(steps) - 1, 4)
                          if during_step and steps else None)
            gc.collect()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, help="directory on the disk to measure (files and the volume go here)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--size", default=None, help=f"activation_bench's model, one of {', '.join(SIZES)} "
                    "(default h2048 on CUDA, tiny on the CPU)")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=40, help="timed steps per loop")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps before each loop")
    ap.add_argument("--every", type=int, default=8, help="a save after every N-th timed step")
    ap.add_argument("--max-host-bytes", type=int, default=None, help="spillfs.save's bound (default its own)")
    ap.add_argument("--spillfs", default=os.path.join(ROOT, "build", "bin", "spillfs"))
    ap.add_argument("--volume-size", default="32G")
    ap.add_argument("--no-mount", action="store_true", help="the host fs only")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    if args.size is None:
        args.size = "h2048" if args.device.startswith("cuda") else "tiny"
    if args.size not in SIZES:
        ap.error(f"--size: one of {', '.join(SIZES)}")
    if args.every < 1 or args.steps < args.every:
        ap.error("--every must be at least 1 and at most --steps")
    bench = Bench(args)
    try:
        bench.run()
    finally:
        bench.close()
    save_load_bench.report(bench, args, model=args.size, baseline_step_seconds=r4(bench.baseline))
    return 0


if __name__ == "__main__":
    sys.exit(main())
