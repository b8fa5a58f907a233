#!/usr/bin/env python3
"""torch.distributed.checkpoint with spillfs.dcp's SpillWriter/SpillReader against DCP's FileSystemWriter/Reader.

    export LD_LIBRARY_PATH=$PWD/.devrun/devlibs:$LD_LIBRARY_PATH \
        SPILLFS_CLIENT_LIB=$PWD/.devrun/lib/libspillfs_client.so
    python3 tools/bench/dcp_bench.py --dir /root/dcpbench --spillfs .devrun/bin/spillfs --json-out $OUT/dcp.json

(smoke run on a CPU machine, about 30 s: --layers 2 --hidden 512 --intermediate
1024 --vocab 4000 --llama-layers 2 --llama-hidden 256 --llama-intermediate 512
--llama-vocab 4000 --llama-heads 4 --llama-kv-heads 2 --volume-size 4G)

One process, world size 1 (a process group of one: ``cpu:gloo,cuda:nccl`` on
CUDA, ``gloo`` on the CPU; --no-pg: DCP's path without a process group), for
save_load_bench.py's model-sized state_dict (bf16, ~2.5 GiB in a few hundred
tensors, on --device: CUDA where there is one) and, where ``transformers`` is
importable, a LlamaForCausalLM built from a config (no download; TinyLlama's
shape by default, bf16, on --device), into the filesystem of --dir (ext4 on
the GPU machine) and into a spillfs volume made and mounted there:

* raw: save_load_bench's O_DIRECT write (fdatasync'ed) and cold read of as
  many bytes on --dir's filesystem: the limit, each row's ``ratio_to_raw``;
* ``dcp.save`` with ``FileSystemWriter`` (``sync_files=True``: every file
  fsync'ed) and with ``SpillWriter`` (its defaults: dedup on, every file
  fsync'ed), and ``dcp.load`` into fresh tensors on --device with the
  matching reader, cold (page cache dropped; the mount remounted); each
  row's ``ratio_to_stock`` is against FileSystemWriter / FileSystemReader
  into --dir's filesystem; each checkpoint read again by the other reader;
* the second ``SpillWriter`` save after 1% of the bytes changed (whole
  tensors, the small ones first, as save_load_bench's dedup part) into a new
  directory beside the first, into the mount (dedup) and into --dir's
  filesystem: seconds, x faster than the first, bytes written and shared,
  and the SSD bytes the volume wrote (``spillfs stat --json``);
* ``dcp.async_save`` with each writer: the time until it returns (DCP stages
  the state_dict to CPU memory first) against the time until its future is
  done.

Every save+load is checked bit for bit. Prints a row per figure; --json-out
writes them. Needs root (mount, drop_caches).
"""

import argparse
import gc
import os
import shutil
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "clients", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter  # noqa: E402

import spillfs  # noqa: E402
import save_load_bench  # noqa: E402
from save_load_bench import check_equal, model_state_dict  # noqa: E402
from spillfs.dcp import SpillReader, SpillWriter  # noqa: E402

STOCK = "FileSystemWriter"
WRITERS = {STOCK: (FileSystemWriter, FileSystemReader), "SpillWriter": (SpillWriter, SpillReader)}


def blank(sd):
    """Tensors shaped as `sd`'s, on the same devices, for dcp.load to fill."""
    return {k: torch.empty_like(v) for k, v in sd.items()}


def llama_state_dict(args, device):
    """A LlamaForCausalLM of the --llama-* shape built from a config (random weights,
    bf16, on `device`): its state_dict, or None without transformers."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except Exception as e:  # noqa: B902 - not installed, or not importable with this torch
        print(f"llama: transformers cannot be imported ({type(e).__name__}: {e}), skipped", flush=True)
        return None
    config = LlamaConfig(vocab_size=args.llama_vocab, hidden_size=args.llama_hidden,
                         intermediate_size=args.llama_intermediate, num_hidden_layers=args.llama_layers,
                         num_attention_heads=args.llama_heads, num_key_value_heads=args.llama_kv_heads,
                         tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    return {k: v.detach() for k, v in model.state_dict().items()}


class Bench(save_load_bench.Bench):
    """save_load_bench's work directory, volume, raw figures, sync and cold start; DCP's rows."""

    def __init__(self, args):
        super().__init__(args)
        self.targets = [("host", self.host)] + ([("mount", self.volume.mnt)] if self.volume else [])
        self.stock = {}  # (object, "save"/"load") -> GB/s of the stock writer/reader into the host fs
        self.save_seconds = {}  # (object, target, writer) -> the synchronous save's seconds
        self.pg = None
        if not args.no_pg and not dist.is_initialized():
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            self.pg = "cpu:gloo,cuda:nccl" if self.device.type == "cuda" else "gloo"
            dist.init_process_group(self.pg, init_method="file://" + os.path.join(self.work, "rendezvous"),
                                    rank=0, world_size=1)

    def close(self):
        if self.pg is not None and dist.is_initialized():
            dist.destroy_process_group()
        super().close()

    def add(self, obj, target, op, method, nbytes, seconds, **extra):
        kind = "save" if op.startswith("save") else "load"
        gbps = nbytes / seconds / 1e9
        if target == "host" and method in (STOCK, "FileSystemReader") and op in ("save+fsync", "load"):
            self.stock[(obj, kind)] = gbps
        stock = self.stock.get((obj, kind))
        if stock and not method.startswith("raw"):
            extra = {"ratio_to_stock": round(gbps / stock, 3), **extra}
        super().add(obj, target, op, method, nbytes, seconds, **extra)

    def save(self, writer, sd, path):
        """dcp.save of `sd` into the directory `path` with the writer named `writer`;
        the extra fields of its row (SpillWriter's report)."""
        w = WRITERS[writer][0](path, thread_count=self.args.thread_count)
        dcp.save(sd, storage_writer=w)
        if not isinstance(w, SpillWriter):
            return {}
        r = w.report
        return {"backend": r.backend, "io_path": r.io_path, "bytes_written": r.bytes_written,
                "bytes_shared": r.bytes_shared, "stages": {k: round(v, 3) for k, v in r.seconds.items()}}

    def load(self, reader, sd, path, what):
        """dcp.load into fresh tensors with the reader of the writer named `reader`, checked against `sd`."""
        back = blank(sd)
        dcp.load(back, storage_reader=WRITERS[reader][1](path))
        self.sync()
        check_equal(sd, back, what)

    def warm_up(self):
        """One small save and load with each writer (untimed): DCP's and the libraries' first-call costs."""
        sd = {f"w{i}": torch.randn(1 << 18, device=self.device) for i in range(4)}
        for writer in WRITERS:
            path = os.path.join(self.host, f"warmup-{writer}")
            self.save(writer, sd, path)
            self.load(writer, sd, path, f"warm-up {writer}")
            shutil.rmtree(path)

    def pair(self, obj, sd, nbytes, target, directory, writer):
        path = os.path.join(directory, f"{obj}-{writer}")
        self.sync()
        t0 = time.perf_counter()
        extra = self.save(writer, sd, path)
        seconds = time.perf_counter() - t0
        self.save_seconds[(obj, target, writer)] = seconds
        self.add(obj, target, "save+fsync", writer, nbytes, seconds, **extra)
        self.cold(directory)
        reader = WRITERS[writer][1].__name__
        t0 = time.perf_counter()
        self.load(writer, sd, path, f"{reader} {target} {obj}")
        self.add(obj, target, "load", reader, nbytes, time.perf_counter() - t0)
        if not self.args.skip_cross_checks:  # each reader reads the other writer's checkpoint
            other = next(w for w in WRITERS if w != writer)
            self.load(other, sd, path, f"{WRITERS[other][1].__name__} reading {writer}'s checkpoint ({target})")
        shutil.rmtree(path)

    def second_save(self, obj, sd, nbytes):
        changed, changed_bytes = save_load_bench.one_percent_changed(sd, nbytes)
        for target, directory in self.targets:
            step1, step2 = (os.path.join(directory, f"{obj}-step{i}") for i in (1, 2))
            two = self.two_saves(sd, changed, target, lambda i: self.save("SpillWriter", sd, (step1, step2)[i - 1]))
            extra, first, second = two["r2"], two["first"], two["second"]
            extra.update(changed_bytes=changed_bytes, changed_tensors=len(changed), first_save_seconds=round(first, 3),
                         speedup_vs_first=round(first / second, 2), **two["ssd"])
            if two["ssd"]:
                extra["ssd_over_changed"] = round(two["ssd"]["ssd_bytes_second"] / changed_bytes, 2)
            self.add(obj, target, "save 2 (1%)", "SpillWriter dedup", nbytes, second, **extra)
            self.load("SpillWriter", sd, step2, f"second save {target} {obj}")
            for c in changed:
                sd[c].sub_(1)
            shutil.rmtree(step1)
            shutil.rmtree(step2)

    def async_save(self, obj, sd, nbytes, target, directory, writer):
        path = os.path.join(directory, f"{obj}-async-{writer}")
        w = WRITERS[writer][0](path, thread_count=self.args.thread_count)
        self.sync()
        t0 = time.perf_counter()
        response = dcp.async_save(sd, storage_writer=w)
        returned = time.perf_counter() - t0
        getattr(response, "upload_completion", response).result()  # a Future, or AsyncSaveResponse (torch 2.9+)
        total = time.perf_counter() - t0
        sync_save = self.save_seconds.get((obj, target, writer))
        self.add(obj, target, "async_save", writer, nbytes, total, returned_seconds=round(returned, 4),
                 returned_fraction=round(returned / total, 3),
                 returned_over_sync_save=round(returned / sync_save, 3) if sync_save else None)
        self.load(writer, sd, path, f"async_save {writer} {target} {obj}")
        shutil.rmtree(path)

    def run(self):
        a = self.args
        print(f"torch {torch.__version__}, device {self.device}, spillfs {spillfs.__version__}, "
              f"process group: {self.pg or 'none (no_dist)'}", flush=True)
        parts = set(a.parts.split(","))
        self.warm_up()
        for obj in a.objects.split(","):
            if obj == "state_dict":
                sd = model_state_dict(a.layers, a.hidden, a.intermediate, a.vocab, self.device)
            else:
                sd = llama_state_dict(a, self.device)
                if sd is None:
                    continue
            nbytes = sum(t.numel() * t.element_size() for t in sd.values())
            print(f"{obj}: {len(sd)} tensors, {nbytes / 2**30:.2f} GiB", flush=True)
            if "raw" in parts:
                self.raw_io(obj, nbytes)
            for target, directory in self.targets:
                for writer in WRITERS:
                    if "pairs" in parts:
                        self.pair(obj, sd, nbytes, target, directory, writer)
                    if "async" in parts:
                        self.async_save(obj, sd, nbytes, target, directory, writer)
            if "dedup" in parts:
                self.second_save(obj, sd, nbytes)
            del sd
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, help="directory on the disk to measure (files and the volume go here)")
    ap.add_argument("--layers", type=int, default=24, help="the state_dict's shape (save_load_bench's)")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=5632)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--llama-layers", type=int, default=22, help="the Llama's shape (default TinyLlama-1.1B's)")
    ap.add_argument("--llama-hidden", type=int, default=2048)
    ap.add_argument("--llama-intermediate", type=int, default=5632)
    ap.add_argument("--llama-vocab", type=int, default=32000)
    ap.add_argument("--llama-heads", type=int, default=32)
    ap.add_argument("--llama-kv-heads", type=int, default=4)
    ap.add_argument("--objects", default="state_dict,llama", help="comma-separated: state_dict, llama")
    ap.add_argument("--parts", default="raw,pairs,async,dedup",
                    help="comma-separated: raw, pairs (save + cold load per writer), async (async_save), "
                    "dedup (the 1%%-changed second save)")
    ap.add_argument("--thread-count", type=int, default=1, help="both writers' thread_count (files per rank)")
    ap.add_argument("--qd", type=int, default=16, help="threads of the raw O_DIRECT figures")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--no-pg", action="store_true", help="no process group: DCP's no_dist path")
    ap.add_argument("--spillfs", default=os.path.join(ROOT, "build", "bin", "spillfs"))
    ap.add_argument("--volume-size", default="32G")
    ap.add_argument("--no-mount", action="store_true", help="the host fs only")
    ap.add_argument("--no-drop-caches", action="store_true")
    ap.add_argument("--skip-cross-checks", action="store_true")
    ap.add_argument("--stall-seconds", type=float, default=90,
                    help="dump every thread's stack when no row comes for this long (0: never)")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    for option, known in (("objects", {"state_dict", "llama"}), ("parts", {"raw", "pairs", "async", "dedup"})):
        unknown = set(getattr(args, option).split(",")) - known
        if unknown:
            ap.error(f"--{option}: unknown {', '.join(sorted(unknown))} ({', '.join(sorted(known))})")
    bench = Bench(args)
    bench.execute()
    save_load_bench.report(bench, args, raw_GBps=save_load_bench.figures(bench.raw),
                           stock_GBps=save_load_bench.figures(bench.stock))
    return 0


if __name__ == "__main__":
    sys.exit(main())
