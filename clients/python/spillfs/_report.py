"""What one spillfs.save or spillfs.load did: :class:`IOReport`, :func:`last_report`;
and :class:`Report`, the fields-and-seconds base it shares with
:class:`spillfs.torch.OffloadReport`."""

import copy
import threading
import time
from contextlib import contextmanager

__all__ = ["IOReport", "last_report", "Report"]

_local = threading.local()


class Report:
    """A record of what one call or step did: named fields with their
    defaults, declared once in ``_DEFAULTS`` (in the order :meth:`as_dict`
    gives them; a mutable default is copied for each report), and
    ``seconds``, seconds by stage."""

    _DEFAULTS = {"seconds": {}}

    def __init__(self, **values):
        for name, default in self._DEFAULTS.items():
            setattr(self, name, copy.copy(default))
        for name, value in values.items():
            setattr(self, name, value)

    def add_seconds(self, name, seconds):
        """Adds ``seconds`` to ``seconds[name]``."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    @contextmanager
    def stage(self, name):
        """Adds the seconds of the ``with`` body to ``seconds[name]``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add_seconds(name, time.perf_counter() - start)

    def as_dict(self):
        """The fields as a plain dict (for ``json.dumps``); dicts copied."""
        fields = {name: getattr(self, name) for name in self._DEFAULTS}
        return {name: (dict(value) if isinstance(value, dict) else value) for name, value in fields.items()}


class IOReport(Report):
    r"""What one :func:`spillfs.save` or :func:`spillfs.load` did.

    :func:`spillfs.save` returns one; :func:`spillfs.load` fills the one passed
    as ``report=`` (it returns the loaded object, as :func:`torch.load` does);
    :func:`spillfs.last_report` gives the latest of either, per thread.

    Attributes:
        op (str): ``"save"`` or ``"load"``.
        path (str or None): the file (None for a file object).
        backend (str): ``"native"`` (libspillfs_client's segment I/O),
            ``"posix"`` (Python's ``os.pwritev``/``os.preadv``), ``"stream"``
            (a file object) or ``"torch"`` (handed to ``torch.save``/``torch.load``:
            the legacy format, TorchScript archives, ``mmap=True``).
        io_path (str or None): how the native library reached the file:
            ``"direct_path"`` (a spillfs mount's backing store),
            ``"memory_io"`` (a spillfs mount's daemon, moving the bytes between
            its backing store and memory shared with it: callers who are not
            root), ``"mount"`` (io_uring through a spillfs mount), ``"direct_io"`` (io_uring
            ``O_DIRECT``), ``"buffered"``; ``"posix"`` / ``"stream"`` otherwise.
        io_stats (dict): the native requests' ``spill_io_stats`` summed
            (``bytes``, ``io_bytes``, ``ios``, ``copy_seconds``,
            ``io_seconds``, ``hash_seconds``, ``daemon_seconds``...).
        file_bytes (int): size of the file.
        storages (int): tensor storages saved or loaded.
        storage_bytes (int): their bytes.
        bytes_written (int): bytes the save sent to the file (data and zip
            records; not the bytes shared by dedup).
        bytes_shared (int): bytes of storages the volume already held, mapped
            into the file by reference instead of being written (dedup; with
            ``io_path`` ``"memory_io"`` the daemon finds them as it writes).
        bytes_read (int): bytes the load read from the file.
        device_bytes (int): bytes that went to or from CUDA memory.
        crc32_skipped (int): records written with a CRC-32 of 0 (see
            ``spillfs.save``'s ``crc32``).
        dedup (bool): whether the save asked the volume to share units.
        dedup_requests (int): dedup requests sent to the daemon (one for a
            whole file, up to 65536 units).
        units_changed_in_place (int): 256 KiB units written without asking
            the volume, as they changed since this process last saved the
            same storage (the request about the others ran meanwhile).
        seconds (dict): seconds per stage. save: ``pickle``, ``hash`` and
            ``dedup`` (dedup only), ``write`` (submitting and waiting for the
            data, CRCs computed meanwhile), ``crc`` (waiting for CRCs after
            the data), ``sync``, ``rename``, ``total``. load: ``read`` (waiting
            for storage bytes; read-ahead runs under ``unpickle``, which
            includes it), ``unpickle``, ``total``.

    Example::

        >>> r = spillfs.save(model.state_dict(), "/mnt/spill/ckpt.pt")
        >>> r.bytes_written, r.bytes_shared, r.seconds["total"]
        >>> r2 = spillfs.IOReport()
        >>> sd = spillfs.load("/mnt/spill/ckpt.pt", map_location="cuda", report=r2)
        >>> r2.gbps()
    """

    _DEFAULTS = {"op": None, "path": None, "backend": None, "io_path": None, "io_stats": {}, "file_bytes": 0,
                 "storages": 0, "storage_bytes": 0, "bytes_written": 0, "bytes_shared": 0, "bytes_read": 0,
                 "device_bytes": 0, "crc32_skipped": 0, "dedup": False, "dedup_requests": 0,
                 "units_changed_in_place": 0, "seconds": {}}

    def __init__(self, op=None, path=None):
        super().__init__(op=op, path=path)

    def gbps(self):
        """Storage bytes per second of the whole call, in GB/s."""
        total = self.seconds.get("total")
        return self.storage_bytes / total / 1e9 if total else 0.0

    def __repr__(self):
        stages = ", ".join(f"{k}={v:.3f}s" for k, v in self.seconds.items())
        return (f"IOReport(op={self.op!r}, path={self.path!r}, backend={self.backend!r}, "
                f"storages={self.storages}, storage_bytes={self.storage_bytes}, "
                f"bytes_written={self.bytes_written}, bytes_shared={self.bytes_shared}, "
                f"bytes_read={self.bytes_read}, seconds=({stages}))")


def _publish(report):
    _local.report = report


def last_report():
    """The :class:`IOReport` of this thread's latest :func:`spillfs.save` or
    :func:`spillfs.load` (None before the first)."""
    return getattr(_local, "report", None)
