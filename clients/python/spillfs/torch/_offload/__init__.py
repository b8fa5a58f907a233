"""The parts of :func:`spillfs.torch.offload_activations`, one concern a module.

- :mod:`.tiers`: where saved tensors go (the bounded host tier, pinned on
  CUDA; files under a directory through libspillfs_client's segment I/O) and
  the copy streams.
- :mod:`.policy`: which layers go where (``"all"``, ``"none"``, the adaptive
  policy: profile, bandwidth probes, a pipeline model, its prediction; the
  mixed policy: keep, offload or recompute per layer under a budget).
- :mod:`.report`: what one step did (:class:`OffloadReport`).
- :mod:`.core`: :class:`~.core.ActivationOffloader`: a step's life, made of
  the parts below (an object a concern, each passed what it needs).
- :mod:`.saved_hooks`: the saved-tensor hooks (pack and unpack: dedup,
  forwarding, stalls).
- :mod:`.layers`: :func:`~.layers.find_layers` and the module hooks (groups,
  layer boundaries, where backward begins, timing, recompute).
- :mod:`.copy_out`: forward's side: storing in a tier, file writes, the copies
  in flight and their bound (``copy_window``, ``inflight_bytes``).
- :mod:`.read_ahead`: backward's side: prefetch, the credit bounding it
  (``read_ahead_bytes``), loads.
- :mod:`.entries`: what is stored (an entry a region, a saved object a save),
  the state of the step the parts share, the worker thread, and the release
  of every buffer and file.
- :mod:`.diagnosis`: ``diagnose``'s samples of what the device holds.
"""
