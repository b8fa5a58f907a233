"""A process that saves one checkpoint, to be killed by test_checkpoint_crash.py.

    python crash_saver.py PATH GENERATION [--hook before-rename|after-rename|{mid,after}-write:K [--victim PID]]
                          [--background]

Saves state(GENERATION) to PATH with spillfs.save; prints "saving" just
before the call and "saved SECONDS" after. --hook kills this process with
SIGKILL at the rename of the temporary file over PATH: just before it (the
temporary file written and fsync'ed), or just after it (before the
directory's fsync); mid-write:K, at the K-th write call of the save's file
(the earlier ones issued); after-write:K, once that call has issued its
write. --victim PID: these two kill that process (the daemon) instead, and
the save goes on against a dead mount.
--background saves with background=True and waits.
"""

import os
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "clients", "python"))

TENSORS, NUMEL = 12, 1 << 20  # 48 MiB of float32


def state(generation):
    """The checkpoint of a generation: odd tensors new each generation, even
    ones the same in all (the volume shares their units: dedup at work)."""
    import torch
    out = {}
    for i in range(TENSORS):
        seed = i if i % 2 == 0 else 1000 * (generation + 1) + i
        out[f"w{i}"] = torch.randn(NUMEL, generator=torch.Generator().manual_seed(seed))
    out["generation"] = generation
    return out


def main():
    path, generation = sys.argv[1], int(sys.argv[2])
    hook = sys.argv[sys.argv.index("--hook") + 1] if "--hook" in sys.argv else None
    import spillfs
    sd = state(generation)
    if hook is not None and hook.split(":")[0] in ("mid-write", "after-write"):
        # SIGKILL at the k-th write call of the save: before it is issued (mid-write), or once it
        # has been (after-write): surely mid-save where k is 1 (how many more follow depends on
        # what dedup shares)
        from spillfs import _io
        after, k, calls = hook.startswith("after-write"), int(hook.split(":")[1]), [0]
        victim = int(sys.argv[sys.argv.index("--victim") + 1]) if "--victim" in sys.argv else os.getpid()
        for cls in (_io.NativeFile, _io.PosixFile):
            def write(self, *args, _real=cls.write, **kwargs):
                calls[0] += 1
                if calls[0] == k and not after:
                    os.kill(victim, signal.SIGKILL)
                issued = _real(self, *args, **kwargs)
                if calls[0] == k and after:
                    os.kill(victim, signal.SIGKILL)
                return issued
            cls.write = write
    elif hook is not None:
        real = os.replace

        def replace(src, dst, **kwargs):
            if os.fspath(dst) == path:
                if hook == "before-rename":
                    os.kill(os.getpid(), signal.SIGKILL)
                real(src, dst, **kwargs)
                if hook == "after-rename":
                    os.kill(os.getpid(), signal.SIGKILL)
                return None
            return real(src, dst, **kwargs)
        os.replace = replace
    print("saving", flush=True)
    start = time.perf_counter()
    if "--background" in sys.argv:
        spillfs.save(sd, path, background=True).result()
    else:
        spillfs.save(sd, path)
    print(f"saved {time.perf_counter() - start:.3f}", flush=True)


if __name__ == "__main__":
    main()
