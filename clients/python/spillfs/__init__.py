"""spillfs: tensors to SSD at the disk's speed, and the direct data path of a spillfs mount.

    import spillfs, torch

    report = spillfs.save(model.state_dict(), "/mnt/spill/ckpt.pt")  # torch.save's format
    sd = torch.load("/mnt/spill/ckpt.pt")                          # ... which torch reads
    sd = spillfs.load("/mnt/spill/ckpt.pt", map_location="cuda")   # disk -> pinned -> GPU
    print(report.bytes_written, report.bytes_shared, report.seconds)

    with spillfs.Client("/mnt/spill") as c:                        # raw bytes, row tables
        rows = c.read_rows("feat.bin", 4096, [7, 3, 7])

By product: :mod:`spillfs.checkpoint` (save, load), :mod:`spillfs.safetensors`
(the safetensors library's save_file, load_file, safe_open; imported on its
own), :mod:`spillfs.dcp` (SpillWriter, SpillReader: torch.distributed.checkpoint's
storage writer and reader, each rank's files through the same writer; imported
on its own, ``import spillfs`` does not import torch.distributed), :mod:`spillfs.gnn`
(FeatureStore: GNN feature tables gathered through GPU and host caches;
imported on its own, it needs torch), :mod:`spillfs.pyg` (its PyTorch
Geometric stores, and a neighbour sampler that needs no pyg-lib) and
:mod:`spillfs.torch` (activation offload; imported on its own). Below them the native layer: :mod:`spillfs.client` (Client),
:mod:`spillfs._native` (finding libspillfs_client.so: see there for
$SPILLFS_CLIENT_LIB and $SPILLFS_IO), :mod:`spillfs._io` (file I/O through
it, or Python's), :mod:`spillfs._report` (IOReport).
"""

from ._native import LibraryVersionError, SpillError, load_library
from ._report import IOReport, last_report
from ._version import __version__
from .checkpoint import load, save
from .client import Client

__all__ = ["save", "load", "IOReport", "last_report", "Client", "SpillError", "LibraryVersionError",
           "load_library", "__version__"]
