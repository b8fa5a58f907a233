"""One rank of test_dcp.py: a gloo group of WORLD processes (init_method
file://) saving and loading DCP checkpoints of DTensors sharded over a CPU
mesh with spillfs.dcp and with DCP's stock writer/reader. Writes
{check: "ok" | traceback, figures...} to OUT (JSON).

    python3 dcp_worker.py RANK WORLD MOUNT OUT_JSON

WORLD 2 saves (step1, step2 with 1% of the tensors changed, async, stock) and
reads back; WORLD 3 loads the 2-rank checkpoints (resharding) and saves one
of its own (step3, which the test's own process loads as one rank).
"""

import datetime
import json
import os
import subprocess
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "clients", "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor, Shard  # noqa: E402

from spillfs.dcp import SpillReader, SpillWriter  # noqa: E402
from worker_results import Results  # noqa: E402

RANK, WORLD, MOUNT, OUT = 0, 1, None, None  # set by main (test_dcp.py imports global_state)
TENSORS = 100  # 1% changed = 1 tensor
ROWS, COLS = 128, 1024  # 512 KiB of float32: one 256 KiB unit a rank at 2 ranks
results = Results()  # its file set by main
warnings.filterwarnings("ignore", message=".*overwriting.*")


def global_state(step=1):
    """The checkpoint's full values: TENSORS sharded weights (tensor 0 changes
    at step 2), an odd-sized bf16 one, a replicated plain tensor and a
    non-tensor (BYTE_IO) item."""
    out = {}
    for i in range(TENSORS):
        g = torch.Generator().manual_seed(1000 * (step if i == 0 else 1) + i)
        out[f"w{i:03d}"] = torch.randn(ROWS, COLS, generator=g)
    out["odd"] = (torch.arange(97 * 33, dtype=torch.float32).reshape(97, 33) * 0.25 + step).to(torch.bfloat16)
    out["replicated"] = torch.arange(10, dtype=torch.int64) * step
    out["extra"] = {"step": step, "name": f"step{step}"}
    return out


def sharded(full, mesh, zero=False):
    """`full` as the state dict of this rank: tensors of 2 dims sharded by rows
    (torch.chunk's split, as Shard(0) does), others as they are."""
    out = {}
    for k, v in full.items():
        if isinstance(v, torch.Tensor) and v.dim() == 2:
            local = v.chunk(WORLD)[RANK].clone()
            if zero:
                local.zero_()
            out[k] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False, shape=v.shape, stride=v.stride())
        elif isinstance(v, torch.Tensor):
            out[k] = torch.zeros_like(v) if zero else v.clone()
        else:
            out[k] = {"step": 0, "name": ""} if zero else dict(v)
    return out


def check_equal(full, loaded):
    """Each tensor of `loaded` (this rank's) holds exactly the bits of `full`'s part."""
    for k, v in full.items():
        got = loaded[k]
        if isinstance(got, DTensor):
            want = v.chunk(WORLD)[RANK]
            got = got.to_local()
        else:
            want = v
        if isinstance(v, torch.Tensor):
            assert got.dtype == want.dtype and got.shape == want.shape, (k, got.dtype, got.shape, want.shape)
            assert torch.equal(got.view(torch.uint8) if got.dtype == torch.bfloat16 else got,
                               want.view(torch.uint8) if want.dtype == torch.bfloat16 else want), k
        else:
            assert got == want, (k, got, want)


def stat():
    out = subprocess.run([os.environ.get("SPILLFS_BIN", "spillfs"), "stat", "--json", MOUNT], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout)


def check(fn):
    results.check(fn, dist.barrier)


def ckpt(name):
    return os.path.join(MOUNT, name)


def main():
    global RANK, WORLD, MOUNT, OUT
    RANK, WORLD, MOUNT, OUT = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    results.path = OUT
    dist.init_process_group("gloo", init_method="file://" + os.path.join(os.path.dirname(OUT), f"rendezvous-{WORLD}"),
                            rank=RANK, world_size=WORLD, timeout=datetime.timedelta(seconds=60))
    mesh = init_device_mesh("cpu", (WORLD,))
    step1, step2 = global_state(1), global_state(2)

    def t_save_twice_second_writes_little():
        """step1 then step2 (1 tensor of 100 changed) by SpillWriter, each to
        its own directory; the volume's counters read around each save."""
        reports = {}
        for step, full in (("step1", step1), ("step2", step2)):
            dist.barrier()
            before = stat() if RANK == 0 else None
            writer = SpillWriter(ckpt(step))
            dcp.save(sharded(full, mesh), storage_writer=writer)
            dist.barrier()
            if RANK == 0:
                after = stat()
                results[f"{step}_ssd"] = after["bytes_written_ssd"] - before["bytes_written_ssd"]
                results[f"{step}_direct"] = after["bytes_written_direct"] - before["bytes_written_direct"]
                results[f"{step}_deduplicated"] = after["bytes_deduplicated"] - before["bytes_deduplicated"]
            reports[step] = writer.report
            results[f"{step}_report"] = {k: v for k, v in writer.report.as_dict().items() if k != "seconds"}
        assert reports["step1"].bytes_written > 0

    def t_async_save():
        writer = SpillWriter(ckpt("async"))
        future = dcp.async_save(sharded(step2, mesh), storage_writer=writer)
        future.result(timeout=60)
        results["async_report"] = {k: v for k, v in writer.report.as_dict().items() if k != "seconds"}
        assert os.path.exists(os.path.join(ckpt("async"), ".metadata"))

    def t_stock_save():
        dcp.save(sharded(step2, mesh), storage_writer=FileSystemWriter(ckpt("stock")))

    def t_load_same_world():
        """Each of ours and stock's, by each reader, at the world that wrote it."""
        for name, full in (("step1", step1), ("step2", step2), ("async", step2), ("stock", step2)):
            for reader in (SpillReader, FileSystemReader):
                if name == "stock" and reader is FileSystemReader:
                    continue  # stock both ways is DCP's own test
                target = sharded(full, mesh, zero=True)
                dcp.load(target, storage_reader=reader(ckpt(name)))
                check_equal(full, target)

    def t_load_resharded():
        """The 2-rank checkpoints (ours and stock's) loaded by 3 ranks with SpillReader."""
        for name in ("step2", "stock"):
            target = sharded(step2, mesh, zero=True)
            reader = SpillReader(ckpt(name))
            dcp.load(target, storage_reader=reader)
            check_equal(step2, target)
            results[f"load_{name}_report"] = {k: v for k, v in reader.report.as_dict().items() if k != "seconds"}

    def t_save_3_ranks():
        dcp.save(sharded(step2, mesh), storage_writer=SpillWriter(ckpt("step3")))

    if WORLD == 2:
        for fn in (t_save_twice_second_writes_little, t_async_save, t_stock_save, t_load_same_world):
            check(fn)
    else:
        for fn in (t_load_resharded, t_save_3_ranks):
            check(fn)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
