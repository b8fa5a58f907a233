"""``spillfs.torch``: activation offloading for training with torch.

    import spillfs.torch

    offload = spillfs.torch.offload_activations("/mnt/spill/act", host_bytes=8 << 30, layers=model)
    for x, y in batches:
        with offload:                       # one step: forward and backward inside
            loss = loss_fn(model(x), y)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(offload.report.summary())     # what this step did

See :func:`offload_activations`. Saved-tensor hooks do not trace: keep the
``with`` block outside ``torch.compile``d functions (compile the layers,
offload around them), as docs/activations.md explains.
"""

from ._offload.core import ActivationOffloader, find_layers
from ._offload.policy import AdaptivePolicy, MixedPolicy
from ._offload.report import OffloadReport

__all__ = ["offload_activations", "ActivationOffloader", "AdaptivePolicy", "MixedPolicy", "OffloadReport",
           "find_layers"]

_GiB = 1 << 30
_MiB = 1 << 20


def offload_activations(dir=None, *, host_bytes=4 * _GiB, min_bytes=1 * _MiB, prefetch_layers=1, policy="adaptive",
                        layers=None, inflight_bytes=None, read_ahead_bytes=None):
    r"""Moves the tensors autograd saves for backward off the device while
    forward runs, and brings them back, ahead of need, while backward runs.

    Returns an :class:`ActivationOffloader`, a context manager: each ``with``
    block is one step (forward and backward inside it; the backward may also
    run after the block, each stored tensor is then freed as backward consumes
    it). Reuse the same object from step to step: the adaptive policy learns
    from the first steps, the pinned host tier is allocated once.

    What is offloaded: saved tensors of at least `min_bytes` bytes, on CUDA
    (or, on a machine without one, CPU tensors the same way); never
    parameters, buffers, views of them (checked by storage, not by type) or
    leaves that require grad; never what is saved after the last of `layers`
    (the output head) nor the last tensor saved before backward begins.
    A region saved several times (the same storage, offset, extent, dtype and
    version) is stored once; a tensor still alive, or whose copy is still in
    flight, is served from its memory when backward needs it (no read).

    Where it goes, in order: the host tier while it has room (at most
    `host_bytes`, pinned on CUDA), then files in a directory of this process
    under `dir` (on a spillfs mount through the direct path where the process
    may open the backing store, else ``O_DIRECT``; any directory works), else
    it stays. A write that fails (a full disk: ``ENOSPC``) keeps the tensor
    where it was and warns (:class:`RuntimeWarning`); gradients stay exact.
    Everything a step stored is freed once backward consumed it, and at
    once when the block exits with an exception (``KeyboardInterrupt``
    included); :meth:`ActivationOffloader.close` frees the host tier and the
    directory. Directories of processes that died are removed the next time
    one is made under the same `dir`.

    Args:
        dir (str or os.PathLike, optional): where files go; ``None``: the
            host tier only.
        host_bytes (int): bytes the host tier may hold (``0``: files only).
        min_bytes (int): smaller saved tensors stay where they are.
        prefetch_layers (int): how many layers ahead of the one whose backward
            begins the reads start.
        policy (str, AdaptivePolicy or MixedPolicy): ``"adaptive"`` (profile the first
            steps keeping everything, then choose per layer keep, host or SSD
            so that the step stays as fast as keeping; see
            :class:`AdaptivePolicy`), ``"all"`` (every layer, host tier first)
            or ``"none"`` (keep: its steps run without the saved-tensor hooks, so
            nothing is counted and nothing costs per tensor; ``report.saved_hooks`` is False),
            or a :class:`MixedPolicy` (per layer keep, offload or recompute under a memory or an
            overhead budget: ``policy=spillfs.torch.MixedPolicy(memory_budget=0.5)``; needs `layers`).
        layers (nn.Module or list of nn.Module, optional): the blocks whose
            hooks tag what each saves, time them and drive the prefetch; a
            model is searched for its repeated blocks (:func:`find_layers`:
            e.g. GPT-2's ``transformer.h``, Llama's ``model.layers``) and its
            parameters are excluded up front. ``None``: tensors are grouped
            by bytes saved (64 MiB) instead of by layer.
        inflight_bytes (int, optional): memory-tight forward: the most bytes
            of originals kept on the device while their copies to the host
            run; past it the compute stream waits for the oldest copies and
            their originals go. The end of forward (the last of `layers`
            returns) and the start of backward wait for every copy, the last
            tensor saved by the layers included, and the output head's
            tensors but its last one are offloaded too (where the policy
            moves any): the head and backward begin without the offloaded
            activations. Cost: the compute waits where the copies lag, and
            backward reads the last layer back before using it. ``None``
            (default): copies may lag one layer (``copy_window``), the last
            layer's originals serve backward (forwarding).
        read_ahead_bytes (int, optional): memory-tight backward: tensors are
            read back only as backward frees saved activations of the layers
            (counted when autograd drops them, after their node ran), plus at
            most this many bytes ahead, granted when the first layer's
            backward begins; reads land in memory of the compute stream, so
            the bound holds on the device, not only in the allocator's
            figures. Cost: a read starts only once the compute stream has
            freed its room. ``None`` (default): the layer whose backward
            begins is read at once, the layer ahead as backward uses saved
            tensors.

    Raises:
        ValueError: a negative size or count, an unknown policy.
        TypeError: `layers` holds something else than modules.

    Example::

        >>> model = GPT(cfg).cuda()
        >>> offload = spillfs.torch.offload_activations("/mnt/spill/act", host_bytes=16 << 30,
        ...                                             layers=model)
        >>> for step in range(100):
        ...     with offload:
        ...         model(x).loss.backward()
        ...     opt.step(); opt.zero_grad()
        >>> offload.report.predicted, offload.report.measured

    .. note::
        Saved-tensor hooks are not traced by ``torch.compile``: enter the
        block outside compiled functions (compiled layers inside it are fine).
    """
    return ActivationOffloader(dir, host_bytes=host_bytes, min_bytes=min_bytes, prefetch_layers=prefetch_layers,
                               policy=policy, layers=layers, inflight_bytes=inflight_bytes,
                               read_ahead_bytes=read_ahead_bytes)
