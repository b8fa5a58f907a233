"""``spillfs.safetensors``: the safetensors library's save_file / load_file /
safe_open, through spillfs's direct path and dedup.

    import spillfs.safetensors as st

    st.save_file(model.state_dict(), "/mnt/spill/model.safetensors", metadata={"format": "pt"})
    sd = st.load_file("/mnt/spill/model.safetensors", device="cuda:0")   # disk -> pinned -> GPU
    with st.safe_open("/mnt/spill/model.safetensors", framework="pt", device="cpu") as f:
        w = f.get_slice("lm_head.weight")[:1024]

The files are safetensors files: the library reads ours, and these read
the library's. What differs is the layout (tensors placed so that one saved
again unchanged shares the volume's 256 KiB units: :mod:`._format`) and the
I/O (:mod:`spillfs.checkpoint`'s writer and loader: libspillfs_client's
segment I/O, CUDA memory through its pinned pool, dedup on a spillfs mount;
Python's I/O where the library is not available). For ``transformers``,
:func:`patch_transformers` (or ``python -m spillfs.safetensors script.py``)
makes ``save_pretrained`` / ``from_pretrained`` and the Trainer use these.

The modules: :mod:`._format` (dtypes, header, layout), :mod:`._files`
(save_file, load_file, safe_open), :mod:`._transformers` (the patch).
"""

from ._files import SafeSlice, SafetensorIOError, load_file, safe_open, save_file
from ._format import SafetensorError
from ._transformers import patch_transformers

__all__ = ["save_file", "load_file", "safe_open", "SafeSlice", "SafetensorError", "SafetensorIOError",
           "patch_transformers"]
