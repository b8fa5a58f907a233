"""``spillfs.save`` and ``spillfs.load``: torch.save / torch.load at the disk's speed.

The files are torch's zip format (``torch.load`` reads them, under torch 1.13
and 2.x); ``spillfs.load`` reads files of ``torch.save`` as well. See
:func:`save` and :func:`load`.
"""

import inspect
import io
import os
import pickle
import sys
import tempfile

from .. import _io
from .._report import IOReport, _publish
from . import _reader, _writer, _zipfile

__all__ = ["save", "load", "DEFAULT_PROTOCOL"]

DEFAULT_PROTOCOL = 2
_FILE_FORMAT_VERSION = b"3\n"  # the "version" record torch.save writes (1.13 and 2.x)


def _torch():
    import torch
    return torch


def _is_path(f):
    return isinstance(f, (str, os.PathLike))


def _archive_name(f):
    """The zip folder, as torch's writer names it: the file's base name
    without its extension; "archive" for file objects (and odd names)."""
    if not _is_path(f):
        return "archive"
    base = os.path.basename(os.fsdecode(os.fspath(f)))
    stem = base[:base.rfind(".")] if "." in base else base
    if not stem or not stem.isascii() or not stem.isprintable():
        return "archive"
    return stem


# -- save ---------------------------------------------------------------------

def _pickle(obj, pickle_module, pickle_protocol):
    """data.pkl as torch.save pickles it, and the storages it refers to
    ({key: UntypedStorage}, keys numbered in the order met)."""
    torch = _torch()
    serialization = torch.serialization
    storages = {}
    id_map = {}
    storage_dtypes = {}
    typed = torch.storage.TypedStorage
    # torch.is_storage's classes: persistent_id meets every object pickled
    # (thousands for a state_dict), and a set look-up is the cheap test.
    storage_classes = frozenset(getattr(torch, "_storage_classes", ()))

    def persistent_id(obj):
        cls = type(obj)
        if cls not in storage_classes and not isinstance(obj, typed) and (storage_classes or not torch.is_storage(obj)):
            return None
        if isinstance(obj, typed) or torch.is_storage(obj):
            if isinstance(obj, torch.storage.TypedStorage):
                storage = obj._untyped_storage if hasattr(obj, "_untyped_storage") else obj._storage
                storage_dtype = obj.dtype
                type_name = (obj._pickle_storage_type() if hasattr(obj, "_pickle_storage_type")
                             else obj.pickle_storage_type())
                storage_type = getattr(torch, type_name)
                storage_numel = obj._size() if hasattr(obj, "_size") else obj.size()
            else:
                storage = obj
                storage_dtype = torch.uint8
                storage_type = serialization.normalize_storage_type(type(obj))
                storage_numel = storage.nbytes()
            if str(storage.device) != "meta" and storage.data_ptr() != 0:
                if storage.data_ptr() in storage_dtypes:
                    if storage_dtype != storage_dtypes[storage.data_ptr()]:
                        raise RuntimeError("Cannot save multiple tensors or storages that "
                                           "view the same data as different types")
                else:
                    storage_dtypes[storage.data_ptr()] = storage_dtype
            key = id_map.setdefault(storage._cdata, str(len(id_map)))
            location = serialization.location_tag(storage)
            storages[key] = storage
            return ("storage", storage_type, key, location, storage_numel)
        return None

    buf = io.BytesIO()
    pickler = pickle_module.Pickler(buf, protocol=pickle_protocol)
    pickler.persistent_id = persistent_id
    pickler.dump(obj)
    return buf.getvalue(), storages


def _sources(storages):
    """{key: _writer.Source} of the storages _pickle found."""
    streams = {}  # each CUDA device's current stream, looked up once
    return {key: _writer.Source(storages[key], streams) for key in sorted(storages)}


def _records(archive, pkl, sources, byteorder):
    """The archive's records, in torch's central directory order."""
    prefix = archive + "/"
    pkl_record = _zipfile.Record(prefix + "data.pkl", len(pkl), payload=pkl)
    records = [pkl_record]
    if byteorder:
        records.append(_zipfile.Record(prefix + "byteorder", len(sys.byteorder), payload=sys.byteorder.encode()))
    for key in sorted(sources):
        src = sources[key]
        align = _zipfile.BIG_ALIGN if src.nbytes >= _zipfile.BIG_ALIGN else _zipfile.SMALL_ALIGN
        records.append(_zipfile.Record(f"{prefix}data/{key}", src.nbytes, align, payload=src))
    records.append(_zipfile.Record(prefix + "version", len(_FILE_FORMAT_VERSION), payload=_FILE_FORMAT_VERSION))
    return records, pkl_record


def save(obj, f, pickle_module=pickle, pickle_protocol=DEFAULT_PROTOCOL, _use_new_zipfile_serialization=True,
         _disable_byteorder_record=False, *, dedup=True, crc32=None, backend="auto", report=None,
         background=False, max_host_bytes=None):
    r"""save(obj, f, pickle_module=pickle, pickle_protocol=2, *, dedup=True, crc32=None, backend="auto", report=None, background=False, max_host_bytes=None)

    Saves an object to a disk file, as :func:`torch.save` does, at the disk's speed.

    The file is what :func:`torch.save` writes (a zip of ``data.pkl``, the
    pickle of `obj` with torch's persistent ids, and one record per storage),
    so :func:`torch.load` and :func:`spillfs.load` read it. What differs is how
    it is written:

    * storages of 256 KiB or more start at 256 KiB-aligned offsets (small ones
      are packed at 64 bytes), so the volume can share them; the padding is a
      hole, so the file's size may exceed torch's by up to 256 KiB a big
      storage while its blocks do not;
    * the bytes go from the tensors' memory to the file with no copy into
      pageable memory: with libspillfs_client present, by its segment I/O
      (io_uring ``O_DIRECT``; CUDA storages GPU -> pinned pool -> disk,
      pipelined; the direct path on a spillfs mount); without it, by
      ``os.pwritev`` on a few threads (CUDA storages staged through pinned
      buffers);
    * on a spillfs mount (with the library), ``dedup=True`` hashes each big
      storage's 256 KiB units first (on the GPU for CUDA storages) and the
      volume maps the units it already holds into the file by reference: they
      cross neither PCIe nor the SSD. Saving step N+1 of a fine-tune writes
      about what changed: the units of storages this process saved before
      that changed since go out at once, while the volume is asked about the
      others (``units_changed_in_place`` in the report);
    * a path is written under a temporary name in the same directory,
      fsync'ed, then renamed over `f`: an interrupted save (an exception, a
      full disk, a crash) leaves no partial file under `f`, and the previous
      file of that name intact. A full disk raises ``OSError`` with
      ``errno.ENOSPC``. The save is durable when it returns (the file and the
      directory are fsync'ed).
    * ``background=True`` returns once the storages are copied to host
      memory (CUDA ones on a side stream after the current one, finished
      before the return): the caller may change them in place at once.

    Args:
        obj: saved object (what :func:`torch.save` accepts; what it refuses is
            refused here with the same exception, and nothing is written).
        f: a path (``str`` or ``os.PathLike``), or a file-like object (has to
            implement ``write`` and ``flush``). A file object is written in
            order through its ``write`` (no temporary name, no rename, no
            fsync: the caller owns it; CUDA storages are copied with
            ``.cpu()``; no dedup).
        pickle_module: module used for pickling metadata and objects.
        pickle_protocol: can be specified to override the default protocol.
        dedup (bool): share units the volume holds (spillfs mounts only).
        crc32 (bool or None): the CRC-32 of each zip record.
            ``None`` (default): a real CRC-32 wherever the bytes are in host
            memory here anyway (CPU storages, small records, the staged
            path); **CUDA storages that libspillfs_client moves
            GPU -> pinned -> disk itself get a CRC-32 of 0**, as
            ``torch.serialization.set_crc32_options(False)`` makes torch 2.x
            write: :func:`torch.load` (1.13 and 2.x, which do not check
            CRCs) and :func:`spillfs.load` read such files, but Python's
            :mod:`zipfile` and ``unzip -t`` report them as corrupt.
            ``True``: real CRC-32s everywhere (CUDA storages then go through
            pinned staging buffers here, their bytes CRC'ed on the host).
            ``False``: no CRCs at all (0), the fastest.
            :attr:`IOReport.crc32_skipped` counts the records without one.
        backend (str): ``"auto"`` (native where available), ``"native"``
            (raise where not), ``"posix"`` (Python I/O).
        report (IOReport, optional): filled in and returned (a new one by
            default).
        background (bool): snapshot, then return a
            :class:`concurrent.futures.Future` of the report (paths only);
            one writer thread writes the file, in call order (to one path:
            the later call's file stays). ``.result()`` raises what a
            synchronous save would (``pickle``'s errors too).
            :func:`spillfs.checkpoint.wait` waits for all (so does the
            interpreter's exit). A synchronous save races pending ones.
        max_host_bytes (int, optional): bound of the snapshots of
            background saves not yet written, this one's included: the call
            waits for earlier ones until it fits (or none is left). ``None``:
            :func:`spillfs.checkpoint.default_max_host_bytes` (RAM / 4).

    Returns:
        :class:`spillfs.IOReport`: bytes written, bytes shared by dedup,
        seconds per stage (also :func:`spillfs.last_report`). Background:
        a Future of it (``seconds``: ``pickle``, ``host_wait``, ``snapshot``
        in the call; the writer's ``total``).

    Example:
        >>> spillfs.save(model.state_dict(), "/mnt/spill/step1000.pt")
        IOReport(op='save', ...)
        >>> torch.load("/mnt/spill/step1000.pt")
        >>> fut = spillfs.save(model.state_dict(), "/mnt/spill/step2000.pt", background=True)
        >>> optimizer.step()  # the file holds the parameters before this step
        >>> fut.result()
        IOReport(op='save', ...)
    """
    torch = _torch()
    path = os.fspath(f) if _is_path(f) else None
    report = report if report is not None else IOReport()
    report.op, report.path, report.dedup = "save", path, False
    if path is None and not hasattr(f, "write"):
        raise AttributeError(f"expected 'f' to be string, path, or a file-like object with a 'write' attribute")
    if background:
        if path is None:
            raise ValueError("save(background=True) needs a path, not a file object")
        if not _use_new_zipfile_serialization:
            raise ValueError("save(background=True) writes the zip format only "
                             "(_use_new_zipfile_serialization=False is synchronous)")
    check_dill = getattr(torch.serialization, "_check_dill_version", None)
    if check_dill is not None:
        check_dill(pickle_module)
    opts = _writer.Options(dedup=dedup, crc32=_crc32_default(crc32))
    if background:
        from . import _background
        return _background.submit(obj, path, pickle_module, pickle_protocol, not _disable_byteorder_record, opts,
                                  backend, report, max_host_bytes)
    with report.stage("total"):
        if not _use_new_zipfile_serialization:
            _save_legacy(obj, f, path, pickle_module, pickle_protocol, report)
        else:
            with report.stage("pickle"):
                pkl, storages = _pickle(obj, pickle_module, pickle_protocol)
            _write_archive(f, path, pkl, _sources(storages), not _disable_byteorder_record, opts, backend, report)
    _publish(report)
    return report


def _write_archive(f, path, pkl, sources, byteorder, opts, backend, report):
    """The archive of `pkl` and its storages' `sources` ({key: Source}) into
    `f` (`path`: its path, or None for a file object), as :func:`save` writes it."""
    records, first = _records(_archive_name(f), pkl, sources, byteorder)
    cd_offset = _zipfile.plan(records, first=first)
    report.storages = len(sources)
    report.storage_bytes = sum(r.size for r in records if isinstance(r.payload, _writer.Source))
    if path is None:
        report.backend = "stream"
        report.file_bytes = _writer.write_stream(f, records, records, cd_offset, opts, report)
        f.flush()
    else:
        save_records(path, records, _zipfile.Framing(records, cd_offset), cd_offset + 64 * 1024, opts,
                     backend, report)


def _crc32_default(crc32):
    if crc32 is None:
        options = getattr(_torch().serialization, "get_crc32_options", None)
        if options is not None and not options():
            return False  # torch was told to write no CRC-32s: neither do we
    return crc32


def _temporary_name(path):
    directory, base = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{base}.", suffix=".spillfs-tmp", dir=directory)
    os.close(fd)
    return tmp


def _finish_rename(tmp, path, report):
    try:
        mode = os.stat(path).st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    os.chmod(tmp, mode)
    with report.stage("rename"):
        os.replace(tmp, path)
        dirfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dirfd)
        except OSError:
            pass  # some filesystems refuse fsync on directories
        finally:
            os.close(dirfd)


def _named(e, path):
    """The OSError `e`, naming the file the caller gave (not the temporary one),
    as the OSError subclass Python picks for its errno (FileNotFoundError...)."""
    if isinstance(e, OSError) and e.errno:
        named = OSError(e.errno, e.strerror or os.strerror(e.errno), path)
        named.__cause__ = e
        return named
    return e


def save_records(path, records, framing, size_hint, opts, backend, report):
    """Writes the planned `records` in their `framing` (see
    :func:`_writer.write_by_offsets`) to `path`, as :func:`save` does: under a
    temporary name in the same directory, fsync'ed, renamed over `path`;
    errors name `path`. `size_hint`: about the file's size."""
    try:
        tmp = _temporary_name(path)
    except OSError as e:
        raise _named(e, path) from None
    file = None
    try:
        file = _io.open_file(tmp, write=True, size_hint=size_hint, backend=backend)
        report.backend = "native" if file.native else "posix"
        report.io_path = file.backend
        report.dedup = False
        file_size = _writer.write_by_offsets(file, records, framing, opts, report)
        with report.stage("sync"):
            file.sync()
        report.io_stats = dict(file.stats)
        if file.backend == "memory_io":  # the daemon shared units as it wrote them
            report.bytes_shared = int(file.stats.get("shared_bytes", 0))
        file.close()
        file = None
        report.file_bytes = file_size
        _finish_rename(tmp, path, report)
        tmp = None
    except BaseException as e:
        if file is not None:
            try:
                file.close()
            except OSError:
                pass
        if isinstance(e, OSError):
            raise _named(e, path) from None
        raise
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _save_legacy(obj, f, path, pickle_module, pickle_protocol, report):
    """_use_new_zipfile_serialization=False: torch.save writes the old format
    (through a temporary name for a path)."""
    torch = _torch()
    report.backend = "torch"
    if path is None:
        torch.save(obj, f, pickle_module, pickle_protocol, _use_new_zipfile_serialization=False)
        return
    tmp = _temporary_name(path)
    try:
        with open(tmp, "wb") as out:
            torch.save(obj, out, pickle_module, pickle_protocol, _use_new_zipfile_serialization=False)
            out.flush()
            os.fsync(out.fileno())
        report.file_bytes = report.bytes_written = os.path.getsize(tmp)
        _finish_rename(tmp, path, report)
        tmp = None
    finally:
        if tmp is not None:
            os.unlink(tmp)


# -- load ---------------------------------------------------------------------

_UNSAFE_MESSAGE = (
    "Weights only load failed. Re-running `spillfs.load` with `weights_only` set to `False` will likely "
    "succeed, but it can result in arbitrary code execution. Do it only if you got the file from a trusted "
    "source. WeightsUnpickler error: ")


def _truthy_env(name):
    return os.getenv(name, "0").lower() in ("1", "y", "yes", "true")


def _resolve_weights_only(weights_only, pickle_module):
    """torch.load's rule for this torch: its default (False in 1.13, True
    from 2.6 unless a pickle_module is given or TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD
    is set), and TORCH_FORCE_WEIGHTS_ONLY_LOAD forcing it on."""
    torch = _torch()
    if weights_only is None:
        default = inspect.signature(torch.load).parameters["weights_only"].default
        if default is None:  # torch >= 2.6
            weights_only = pickle_module is None and not _truthy_env("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
        else:
            weights_only = bool(default)
    if _truthy_env("TORCH_FORCE_WEIGHTS_ONLY_LOAD"):
        weights_only = True
    if weights_only and pickle_module is not None:
        raise RuntimeError("Can not safely load weights when explicit pickle_module is specified")
    return weights_only


def load(f, map_location=None, pickle_module=None, *, weights_only=None, mmap=None, backend="auto",
         report=None, **pickle_load_args):
    r"""load(f, map_location=None, pickle_module=pickle, *, weights_only=None, mmap=None, backend="auto", report=None, **pickle_load_args)

    Loads an object saved with :func:`torch.save` or :func:`spillfs.save`, as
    :func:`torch.load` does, each storage read from the file straight into
    the memory it ends in.

    Storages for the CPU are read into the new tensors' memory; storages for
    a CUDA device go disk -> pinned pool -> GPU through libspillfs_client
    (without it, through pinned buffers here), never through pageable memory.
    The storages after the one being unpickled are read ahead. The result is
    that of :func:`torch.load`, bit for bit.

    Args:
        f: a path (``str`` or ``os.PathLike``), or a file-like object (has to
            implement ``read``, ``readline``, ``tell`` and ``seek``).
        map_location: a function, :class:`torch.device`, string or a dict
            specifying how to remap storage locations, as for
            :func:`torch.load` (a function gets each storage on the CPU).
        pickle_module: module used for unpickling metadata and objects.
        weights_only (bool or None): restrict unpickling to tensors,
            primitive types and dictionaries (torch's weights-only
            unpickler). ``None``: torch's default for the torch installed
            (``False`` in 1.13, ``True`` from 2.6), and torch's
            ``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` /
            ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` are honoured.
        mmap (bool, optional): ``True`` hands the file to ``torch.load(mmap=True)``.
        backend (str): ``"auto"``, ``"native"`` or ``"posix"`` (see :func:`save`).
        report (IOReport, optional): filled in with what was read, and how fast.
        pickle_load_args: passed to the unpickler (e.g. ``encoding``).

    Raises:
        RuntimeError: a truncated or corrupt zip archive (naming the file),
            or a CUDA ``map_location`` without that device (torch's message).
        pickle.UnpicklingError: a file that is no torch file (naming it), or
            an object the weights-only unpickler refuses.
        EOFError: an empty file.

    Files :func:`torch.load` reads but this reader does not (the pre-1.6
    format, TorchScript archives, compressed or big-endian records, ``mmap``)
    are handed to :func:`torch.load` (``report.backend == "torch"``).

    Example:
        >>> sd = spillfs.load("/mnt/spill/step1000.pt", map_location="cuda:0")
    """
    torch = _torch()
    weights_only = _resolve_weights_only(weights_only, pickle_module)
    if pickle_module is None:
        pickle_module = pickle
    torch_load_args = dict(pickle_load_args)  # as the caller gave them: torch.load warns of any under weights_only
    pickle_load_args.setdefault("encoding", "utf-8")
    path = os.fspath(f) if _is_path(f) else None
    name = path if path is not None else repr(f)
    report = report if report is not None else IOReport()
    report.op, report.path = "load", path

    def by_torch():
        report.backend = "torch"
        if not _is_path(f):
            f.seek(start)
        kwargs = dict(torch_load_args)
        if mmap is not None:
            kwargs["mmap"] = mmap
        return torch.load(f, map_location, None if weights_only else pickle_module, weights_only=weights_only,
                          **kwargs)

    with report.stage("total"):
        start = 0 if path is not None else f.tell()
        if mmap:
            result = by_torch()
        else:
            try:
                file = _io.open_file(path, write=False, backend=backend) if path is not None \
                    else _reader.StreamFile(f)
            except OSError as e:
                raise _named(e, path) from None
            try:
                result = _load_file(file, name, map_location, pickle_module, weights_only, pickle_load_args,
                                    report)
            except _reader.Unsupported:
                result = _NOT_LOADED
            finally:
                report.io_stats = dict(file.stats)
                file.close()
            if result is _NOT_LOADED:
                result = by_torch()
    _publish(report)
    return result


_NOT_LOADED = object()


def _load_file(file, name, map_location, pickle_module, weights_only, pickle_load_args, report):
    report.backend = "stream" if isinstance(file, _reader.StreamFile) else ("native" if file.native else "posix")
    report.io_path = file.backend
    report.file_bytes = file.size
    head = file.pread(0, 4)
    if len(head) == 0:
        raise EOFError(f"{name}: Ran out of input (the file is empty)")
    if head != b"PK\x03\x04":
        if head[:1] == b"\x80":  # a pickle: the pre-1.6 torch format
            raise _reader.Unsupported("legacy format")
        raise pickle.UnpicklingError(f"{name}: not a torch file (neither a zip archive nor a pickle; "
                                     f"it starts with {head!r})")
    try:
        archive = _reader.Archive(file)
        if archive.has_record("constants.pkl"):
            raise _reader.Unsupported("TorchScript archive")
        if archive.has_record("byteorder") and archive.get_record("byteorder").decode() != sys.byteorder:
            raise _reader.Unsupported("byte order")
        with report.stage("read"):
            pkl = archive.get_record("data.pkl")
        report.bytes_read += len(pkl)
        loader = _reader.StorageLoader(archive, map_location, report)
        try:
            return _unpickle(pkl, loader, pickle_module, weights_only, pickle_load_args, name, report)
        finally:
            loader.close()
    except _zipfile.FormatError as e:
        raise RuntimeError(f"{name}: PytorchStreamReader failed reading zip archive: {e}") from None
    except (OSError, EOFError) as e:
        if isinstance(e, EOFError) or not e.filename:
            raise _reader.io_error(e, name) from None
        raise


class _Carried(Exception):
    """An error of reading a storage, carried through the unpickler as is."""

    def __init__(self, error):
        super().__init__(error)
        self.error = error


def _typed_storage(untyped_storage, dtype):
    torch = _torch()
    try:
        return torch.storage.TypedStorage(wrap_storage=untyped_storage, dtype=dtype, _internal=True)
    except TypeError:  # torch 1.13: no _internal
        return torch.storage.TypedStorage(wrap_storage=untyped_storage, dtype=dtype)


def _unpickle(pkl, loader, pickle_module, weights_only, pickle_load_args, name, report):
    torch = _torch()
    serialization = torch.serialization
    decode = getattr(serialization, "_maybe_decode_ascii", None) or (
        lambda v: v.decode("ascii") if isinstance(v, bytes) else v)
    loaded_storages = {}
    cache_empty = not hasattr(torch.storage.TypedStorage, "_data_ptr")  # 1.13 caches every storage

    def persistent_load(saved_id):
        assert isinstance(saved_id, tuple)
        typename = decode(saved_id[0])
        data = saved_id[1:]
        assert typename == "storage", \
            f"Unknown typename for persistent_load, expected 'storage' but got '{typename}'"
        storage_type, key, location, numel = data
        dtype = torch.uint8 if storage_type is torch.UntypedStorage else storage_type.dtype
        if key in loaded_storages:
            return loaded_storages[key]
        nbytes = numel * torch._utils._element_size(dtype)
        try:
            storage = loader.load(key, nbytes, decode(location))
        except BaseException as e:  # not the unpickler's: keep it from the weights-only wrapping
            raise _Carried(e) from None
        typed = _typed_storage(storage, dtype)
        if cache_empty or typed._data_ptr() != 0:
            loaded_storages[key] = typed
        return typed

    load_module_mapping = {"torch.tensor": "torch._tensor"}
    if weights_only:
        import torch._weights_only_unpickler as base
    else:
        base = pickle_module

    class UnpicklerWrapper(base.Unpickler):
        def find_class(self, mod_name, name):
            if type(name) is str and "Storage" in name:
                try:
                    return serialization.StorageType(name)
                except KeyError:
                    pass
            mod_name = load_module_mapping.get(mod_name, mod_name)
            return super().find_class(mod_name, name)

    unpickler = UnpicklerWrapper(io.BytesIO(pkl), **pickle_load_args)
    unpickler.persistent_load = persistent_load
    tls = getattr(serialization, "_serialization_tls", None)
    saved_map = getattr(tls, "map_location", None)
    if tls is not None:
        tls.map_location = loader.map_location
    try:
        with report.stage("unpickle"):
            result = unpickler.load()
    except _Carried as carried:
        raise carried.error.with_traceback(carried.error.__traceback__) from None
    except (RuntimeError, pickle.UnpicklingError) as e:
        if weights_only:
            raise pickle.UnpicklingError(f"{name}: {_UNSAFE_MESSAGE}{e}") from None
        raise
    finally:
        if tls is not None:
            tls.map_location = saved_map
    validate = getattr(torch._utils, "_validate_loaded_sparse_tensors", None)
    if validate is not None:
        validate()
    return result
