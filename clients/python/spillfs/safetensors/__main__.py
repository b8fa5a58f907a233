"""``python -m spillfs.safetensors train.py ARGS`` (or ``-m module ARGS``): runs
a training script as ``python train.py ARGS`` would, with
:func:`spillfs.safetensors.patch_transformers` on, so its ``save_pretrained``,
``from_pretrained`` and Trainer checkpoints go through spillfs.safetensors
without a line of it changed."""

import runpy
import sys


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    from . import patch_transformers
    patch_transformers()
    if argv[0] == "-m" and len(argv) > 1:
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
