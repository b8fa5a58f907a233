"""spillfs: tensors to SSD at the disk's speed, and the direct data path of a spillfs mount.

    import spillfs, torch

    report = spillfs.save(model.state_dict(), "/mnt/spill/ckpt.pt")  # torch.save's format
    sd = torch.load("/mnt/spill/ckpt.pt")                          # ... which torch reads
    sd = spillfs.load("/mnt/spill/ckpt.pt", map_location="cuda")   # disk -> pinned -> GPU
    print(report.bytes_written, report.bytes_shared, report.seconds)

    with spillfs.Client("/mnt/spill") as c:                        # raw bytes, row tables
        rows = c.read_rows("feat.bin", 4096, [7, 3, 7])

Modules: :mod:`spillfs.serialization` (save, load), :mod:`spillfs.client`
(Client), :mod:`spillfs._native` (finding libspillfs_client.so: see there
for $SPILLFS_CLIENT_LIB and $SPILLFS_IO), :mod:`spillfs.gnn` (FeatureStore:
GNN feature tables gathered through GPU and host caches; imported on its
own, it needs torch) and :mod:`spillfs.pyg` (its PyTorch Geometric stores).
"""

from ._native import LibraryVersionError, SpillError, load_library
from ._report import IOReport, last_report
from ._version import __version__
from .client import Client
from .serialization import load, save

__all__ = ["save", "load", "IOReport", "last_report", "Client", "SpillError", "LibraryVersionError",
           "load_library", "__version__"]
