"""The parts of :func:`spillfs.torch.offload_activations`, one concern a module.

- :mod:`.tiers`: where saved tensors go (the bounded host tier, pinned on
  CUDA; files under a directory through libspillfs_client's segment I/O) and
  the copy streams.
- :mod:`.policy`: which layers go where (``"all"``, ``"none"``, the adaptive
  policy: profile, bandwidth probes, a pipeline model, its prediction).
- :mod:`.report`: what one step did (:class:`OffloadReport`).
- :mod:`.core`: the saved-tensor and module hooks, dedup, forwarding,
  prefetch and the release of every buffer and file.
"""
