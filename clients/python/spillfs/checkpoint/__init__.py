"""``spillfs.checkpoint``: torch.save / torch.load at the disk's speed.

    import spillfs

    report = spillfs.save(model.state_dict(), "/mnt/spill/ckpt.pt")  # torch.save's format
    sd = spillfs.load("/mnt/spill/ckpt.pt", map_location="cuda")   # disk -> pinned -> GPU
    fut = spillfs.save(model.state_dict(), "/mnt/spill/ckpt2.pt", background=True)  # a Future
    spillfs.checkpoint.wait()                                       # every background save written

:func:`save` and :func:`load` (:mod:`spillfs` exports both: ``spillfs.save``,
``spillfs.load``). What each call did is an :class:`spillfs.IOReport`.

The modules, one concern each:

- :mod:`._serialization`: :func:`save` and :func:`load`: the pickling, the
  choice of I/O, what goes to ``torch.save``/``torch.load``.
- :mod:`._background`: ``save(..., background=True)``: the snapshot taken
  in the caller's thread, the write on one writer thread; :func:`wait`.
- :mod:`._writer`: the records of an archive written to a file by offsets
  (big storages first, then the glue) or to a file object.
- :mod:`._reader`: an archive's records read, storages straight into their
  final memory, the next ones read ahead.
- :mod:`._dedup`: the units the volume already holds shared instead of
  written.
- :mod:`._zipfile`: the zip container of torch's format, laid out, written
  and read.

Files go through :mod:`spillfs._io` (libspillfs_client's segment I/O, or
Python's) below this package.
"""

from ._background import default_max_host_bytes, wait
from ._serialization import DEFAULT_PROTOCOL, load, save

__all__ = ["save", "load", "wait", "default_max_host_bytes", "DEFAULT_PROTOCOL"]
