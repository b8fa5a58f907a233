"""``spillfs.dcp``: a :mod:`torch.distributed.checkpoint` (DCP) storage writer
and reader that write each rank's ``.distcp`` files through spillfs's writer
(the direct data path of a spillfs mount, tensors aligned to the volume's
256 KiB dedup units) and read them back through its reader.

    import torch.distributed.checkpoint as dcp
    from spillfs.dcp import SpillReader, SpillWriter

    writer = SpillWriter("/mnt/spill/step1000")
    dcp.save(state_dict, storage_writer=writer)
    print(writer.report.bytes_written, writer.report.bytes_shared)
    dcp.load(state_dict, storage_reader=SpillReader("/mnt/spill/step1000"))

The checkpoints are DCP's own format (``FileSystemReader`` reads them;
:class:`SpillReader` reads ``FileSystemWriter``'s). Imported on its own:
``import spillfs`` does not import :mod:`torch.distributed`.
"""

from ._storage import SpillReader, SpillWriter

__all__ = ["SpillWriter", "SpillReader"]
