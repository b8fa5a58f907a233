"""Indexing a table's rows, shared by the stores and the GPU tiers:
:func:`as_index` (any index a user may give to an int64 array of rows, range
checked) and :func:`rows_by_index` (``store[index]`` over a store's gather).

Its own module so that :mod:`.feature_store`, :mod:`.sharded` and
:mod:`.gpu_cache` import it without importing each other (they once imported
:mod:`spillfs.gnn` back from below it, a circle).
"""

import numpy as np

__all__ = ["as_index", "rows_by_index"]


def _torch():
    import torch  # when first used, as feature_store does
    return torch


def as_index(index, rows, what="index"):
    """A 1-D int64 numpy array of rows in [0, rows) from ``index`` (int, slice,
    list, numpy, torch on any device, any integer dtype; negatives count from
    the end; a bool mask of length ``rows``). IndexError naming the first
    index out of range."""
    torch = _torch()
    if isinstance(index, slice):
        return np.arange(rows, dtype=np.int64)[index]
    if isinstance(index, torch.Tensor):
        if index.dtype == torch.bool:
            index = index.nonzero().flatten()
        elif index.is_floating_point() or index.is_complex():
            raise IndexError(f"tensors used as {what} must be integer tensors, not {index.dtype}")
        index = index.detach().to("cpu").numpy()
    arr = np.asarray(index)
    if arr.dtype == np.bool_:
        if arr.shape != (rows,):
            raise IndexError(f"a boolean {what} must have shape ({rows},), not {arr.shape}")
        return np.flatnonzero(arr).astype(np.int64)
    if arr.size == 0:
        arr = arr.astype(np.int64)
    if not np.issubdtype(arr.dtype, np.integer):
        raise IndexError(f"{what} must hold integers, not {arr.dtype}")
    arr = arr.reshape(-1)
    if arr.dtype == np.uint64 and arr.size and arr.max() > np.iinfo(np.int64).max:
        bad = int(arr[arr > np.iinfo(np.int64).max][0])
        raise IndexError(f"{what} {bad} is out of bounds for dimension 0 with size {rows}")
    arr = arr.astype(np.int64, copy=False)
    bad = (arr < -rows) | (arr >= rows)
    if bad.any():
        raise IndexError(f"{what} {int(arr[bad][0])} is out of bounds for dimension 0 with size {rows}")
    return np.where(arr < 0, arr + rows, arr)


def rows_by_index(gather, index):
    """``store[index]`` of a store whose rows come from ``gather``: an int (or a 0-d
    tensor) gives one row, a tuple indexes the gathered rows' columns too."""
    torch = _torch()
    if isinstance(index, (int, np.integer)) and not isinstance(index, bool):
        return gather(np.array([index], dtype=np.int64))[0]
    if isinstance(index, tuple):
        rows = gather(index[0])
        return rows[(slice(None),) + tuple(index[1:])]
    if isinstance(index, torch.Tensor) and index.dim() == 0:
        return gather(index.reshape(1))[0]
    return gather(index)
