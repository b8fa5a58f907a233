"""``transformers`` on spillfs.safetensors, its training script unchanged.

``save_pretrained`` writes each shard with ``safetensors.torch.save_file``
(bound in ``transformers.modeling_utils`` as ``safe_save_file``),
``from_pretrained`` opens them with ``safetensors.safe_open``, the Trainer
calls ``safetensors.torch.save_file`` / ``load_file``. None of these takes
another writer (``save_pretrained(save_function=...)`` is for the torch
format only), so :func:`patch_transformers` replaces those functions, where
transformers and safetensors hold them, by this package's: the files stay
safetensors files; the I/O is spillfs's. Undone on exit of its ``with``, or
by ``undo()``. ``python -m spillfs.safetensors train.py ARGS`` runs a script
with the patch on.
"""

import sys

__all__ = ["patch_transformers", "Patch"]


class Patch:
    """The functions replaced: ``(namespace, name, original)``; :meth:`undo` puts them back."""

    def __init__(self, replaced):
        self.replaced = replaced

    def undo(self):
        for namespace, name, original in reversed(self.replaced):
            setattr(namespace, name, original)
        self.replaced = []

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        self.undo()


def patch_transformers():
    """Makes ``transformers`` (and any caller of ``safetensors.torch.save_file``,
    ``load_file`` or ``safetensors.safe_open``) save and load safetensors
    files through :mod:`spillfs.safetensors`.

    The library's functions are replaced in ``safetensors``,
    ``safetensors.torch`` and every loaded ``transformers`` module that
    imported them by name (``transformers.modeling_utils`` is loaded
    first); modules loaded later import the replacements.

    Returns:
        :class:`Patch`: a context manager; ``undo()`` restores the library's.

    Example:
        >>> with spillfs.safetensors.patch_transformers():
        ...     model.save_pretrained("/mnt/spill/run1/step1000")
        ...     model = LlamaForCausalLM.from_pretrained("/mnt/spill/run1/step1000")
    """
    import safetensors
    import safetensors.torch

    from . import _files

    ours = {safetensors.torch.save_file: _files.save_file, safetensors.torch.load_file: _files.load_file,
            safetensors.safe_open: _files.safe_open}
    try:
        import transformers.modeling_utils  # noqa: F401 - loaded so that its names are replaced too
    except ImportError:
        pass
    replaced = []
    for module_name, module in list(sys.modules.items()):
        parts = module_name.split(".")
        # the packages' public modules only: the library's own extension module keeps its functions
        if module is None or parts[0] not in ("safetensors", "transformers") or any(p.startswith("_") for p in parts):
            continue
        for name, value in list(vars(module).items()):
            try:
                replacement = ours.get(value)
            except TypeError:  # unhashable values
                continue
            if replacement is not None:
                replaced.append((module, name, value))
                setattr(module, name, replacement)
    return Patch(replaced)
