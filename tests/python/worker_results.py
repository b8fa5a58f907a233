"""What the worker processes of a multi-process test report to it: a dict of
{check name: "ok" | its traceback, figures...}, written whole to a JSON file
after each check (replaced by rename, so the test never reads half of one).
Used by sharded_worker.py and dcp_worker.py."""

import json
import os
import time
import traceback


class Results(dict):
    """The worker's results, saved to `path` (set now or before the first save)."""

    def __init__(self, path=None):
        super().__init__()
        self.path = path

    def save(self):
        with open(self.path + ".tmp", "w") as f:
            json.dump(self, f)
        os.replace(self.path + ".tmp", self.path)

    def check(self, fn, barrier):
        """Runs `fn` (its traceback kept on failure), saves, then waits at
        `barrier`: every rank runs the same checks with the same collectives
        whatever each one finds, so the ranks stay in step."""
        t0 = time.perf_counter()
        try:
            fn()
            self[fn.__name__] = "ok"
        except Exception:  # noqa: BLE001
            self[fn.__name__] = traceback.format_exc()
        self[fn.__name__ + "_seconds"] = time.perf_counter() - t0
        self.save()
        barrier()
