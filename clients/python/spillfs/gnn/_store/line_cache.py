"""Which lines of a feature table a cache keeps: the eviction policies of
:class:`spillfs.gnn.FeatureStore`, shared by its host cache (``device="cpu"``)
and its GPU cache (the directory of the HBM lines lives here, on the host).

A *line* is ``rows_per_line`` consecutive rows (about 4 KiB: what one block
read brings anyway); the last line of a table may be partial. The cache has
``capacity`` slots; :class:`LineDirectory` maps lines to slots and, when lines
must come in, picks the slots to free:

- ``lru``: least recently used first; every missing line comes in.
- ``static``: lowest static score first (a line's score is the highest of its
  rows': degree, reverse PageRank or the caller's); a missing line comes in
  only where it outscores the line it would evict, so the cache converges to
  the top lines and stays there.
- ``hybrid``: static score plus next reuse from the look-ahead window (the
  batches given to ``prefetch``; LSM-GNN's hybrid eviction). A line's value
  is its look-ahead, ``window + 1 - next reuse`` (the next batch's lines
  highest, 0 where the window does not use it: Belady's choice inside the
  window), plus its score's rank among all lines (in [0, 1)): lines the
  window needs stay, the soonest needed last to go, and between lines it
  does not need the static score decides; recency only breaks ties (least
  recent first). A missing line comes in only over a lower value.

  Why, by trace-driven simulation (``tools/bench/eviction_sim.py``: the
  benchmark's RMAT graph, sampler and reverse PageRank, these classes driven
  as the GPU tiers drive them, the device run's ratios of cache, hot and
  victim lines, window 4, batches never repeated): with batches of random
  seeds the reverse PageRank predicts reuse better than recency does.
  Blending recency into the value (half and half by rank) lost up to 1
  point of hit rate, and recency alone is LRU, below static and hybrid by 3-5
  points once the cache is full (scale 22, 128-seed batches, 300 batches,
  cache 10 % and 25 % of the lines: hybrid 0.740 / 0.816, static 0.735 /
  0.815, LRU 0.691 / 0.783); dropping the admission rule lost up to 0.2
  point there (and gained 0.8 in the 10 % case below, lost 0.3 in the 25 %). With batches large against the cache (scale 21, 1024 seeds) the
  look-ahead dominates: hybrid 0.709 / 0.812, LRU 0.696 / 0.791, static
  0.623 / 0.778. While the cache is still filling nothing is evicted and
  the three policies hit alike: a time box that lets one serve more batches
  favours it (compare hit rates over the same batches).

Lines of the batch being served are never evicted for it (they are its
hits), and hot lines (held by the hot-node buffer) never enter the cache.

:class:`Window` holds the future batches' lines (a look-up costs
O(window + lines asked): a scratch array over line ids, no sort);
:class:`VictimBuffer` takes an evicted line only where the window will reuse it (LSM-GNN's victim
buffer) and hands it back instead of a storage read.

Threading: none of these lock; the FeatureStore serializes its calls.
"""

from collections import deque

import numpy as np

__all__ = ["POLICIES", "LineDirectory", "Window", "VictimBuffer"]

POLICIES = ("hybrid", "lru", "static")
_FAR = np.iinfo(np.int64).max


class Window:
    """The unique lines of up to ``size`` future batches, in order."""

    def __init__(self, size):
        self.size = int(size)
        self.batches = deque()
        self._scratch = np.empty(0, dtype=np.int64)  # per line, _FAR outside the calls below

    def push(self, lines):
        self.batches.append(np.unique(np.asarray(lines, dtype=np.int64)))

    def pop(self):
        """Drops the batch being served now (the oldest), if any."""
        if self.batches:
            self.batches.popleft()

    def _per_line(self, lines, mark):
        """``mark(scratch, d, batch)`` for each window batch (d = 1: the next),
        then the scratch values of ``lines`` (_FAR for lines no batch marked).
        O(window + len(lines)): a scratch array over the lines ids, not a sort."""
        lines = np.asarray(lines, dtype=np.int64)
        batches = [b for b in list(self.batches)[:self.size] if len(b)]
        if not batches:
            return np.full(len(lines), _FAR, dtype=np.int64)
        top = max(int(b[-1]) for b in batches) + 1
        if len(self._scratch) < top:
            self._scratch = np.full(max(top, 2 * len(self._scratch)), _FAR, dtype=np.int64)
        s = self._scratch
        for d in range(len(batches), 0, -1):
            mark(s, d, batches[d - 1])
        out = np.full(len(lines), _FAR, dtype=np.int64)
        inside = lines < len(s)
        out[inside] = s[lines[inside]]
        for b in batches:
            s[b] = _FAR
        return out

    def reuse_count(self, lines):
        """How many of the window's batches use each line."""
        def mark(s, d, b):
            s[b] = np.where(s[b] == _FAR, 1, s[b] + 1)
        out = self._per_line(lines, mark)
        out[out == _FAR] = 0
        return out

    def next_reuse(self, lines):
        """Batches until each line is used again within the window (1: the next
        batch); ``_FAR`` where the window does not use it."""
        def mark(s, d, b):
            s[b] = d  # marked from the farthest batch to the nearest: the nearest stays
        return self._per_line(lines, mark)


class LineDirectory:
    """Lines to slots, and the choice of the slots to free."""

    def __init__(self, n_lines, capacity, policy="hybrid", line_score=None):
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, not {policy!r}")
        self.n_lines = int(n_lines)
        self.capacity = int(capacity)
        self.policy = policy
        self.slot_of_line = np.full(self.n_lines, -1, dtype=np.int64)
        self.line_of_slot = np.full(self.capacity, -1, dtype=np.int64)
        self.last_use = np.zeros(self.capacity, dtype=np.int64)
        self.score = (np.zeros(self.n_lines, dtype=np.float64) if line_score is None
                      else np.asarray(line_score, dtype=np.float64))
        self.evictions = 0
        self.window_weight = 1.0  # hybrid: one step of look-ahead against the whole score range
        # hybrid: a line's score as its rank among the distinct scores, in [0, 1) (equal scores: equal ranks)
        distinct, rank = np.unique(self.score, return_inverse=True)
        self.score_rank = rank.reshape(-1) / max(1, len(distinct))

    def lookup(self, lines):
        return self.slot_of_line[lines]

    def touch(self, slots, stamp):
        self.last_use[slots] = stamp

    def admit(self, lines, stamp, window=None, protect=None):
        """Makes room for the unique ``lines`` (missing, needed at ``stamp``).

        Returns ``(slots, evicted_lines, evicted_slots, evicted_reuse)``: the
        slot each line now holds (-1: not admitted), the lines evicted for them,
        the slots they held (their bytes are still there until the caller
        overwrites them) and, for each, its next reuse in the window
        (``_FAR``: none). ``protect``: slots that
        must stay (the batch's hits; default: those used at ``stamp``)."""
        lines = np.asarray(lines, dtype=np.int64)
        slots = np.full(len(lines), -1, dtype=np.int64)
        if len(lines) == 0 or self.capacity == 0:
            return slots, np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64)
        free = np.flatnonzero(self.line_of_slot < 0)
        order = np.arange(len(lines))
        use_window = window is not None and len(window.batches) > 0
        new_reuse = window.next_reuse(lines) if use_window else np.full(len(lines), _FAR, dtype=np.int64)
        if self.policy == "static" and len(lines) > len(free):
            order = np.argsort(-self.score[lines], kind="stable")  # best lines first
        elif self.policy == "hybrid" and len(lines) > len(free):
            order = np.argsort(-self._hybrid_value(lines, new_reuse, window), kind="stable")  # best lines first
        take = min(len(free), len(lines))
        slots[order[:take]] = free[:take]
        rest = order[take:]
        evicted = np.empty(0, np.int64)
        victims = np.empty(0, np.int64)
        reuse = np.empty(0, np.int64)
        if len(rest):
            occupied = np.flatnonzero(self.line_of_slot >= 0)
            keep = self.last_use[occupied] == stamp if protect is None else np.isin(occupied, protect)
            cand = occupied[~keep]
            cand_lines = self.line_of_slot[cand]
            cand_reuse = (window.next_reuse(cand_lines) if use_window
                          else np.full(len(cand), _FAR, dtype=np.int64))
            if self.policy == "lru":
                rank = np.lexsort((cand, self.last_use[cand]))
            elif self.policy == "static":
                rank = np.lexsort((self.last_use[cand], self.score[cand_lines]))
            else:
                value = self._hybrid_value(cand_lines, cand_reuse, window)
                new_value = self._hybrid_value(lines[rest], new_reuse[rest], window)
                # Lowest value first, least recent among equals; only the lowest
                # (those up to the n-th value, ties included) sorted: O(candidates).
                pool = np.arange(len(cand))
                k = min(len(rest), len(cand))
                if 0 < k < len(cand):
                    pool = np.flatnonzero(value <= np.partition(value, k - 1)[k - 1])
                rank = pool[np.lexsort((self.last_use[cand[pool]], value[pool]))]
            n = min(len(rest), len(cand))
            victims = cand[rank[:n]]
            chosen = rest[:n]
            victim_reuse = cand_reuse[rank[:n]]
            if self.policy == "static":  # only where the new line outscores its victim
                better = self.score[lines[chosen]] > self.score[self.line_of_slot[victims]]
            elif self.policy == "hybrid":  # only over a lower value (best new lines, worst victims)
                better = new_value[:n] > value[rank[:n]]
            else:
                better = np.ones(n, dtype=bool)
            victims, chosen, victim_reuse = victims[better], chosen[better], victim_reuse[better]
            evicted = self.line_of_slot[victims].copy()
            reuse = victim_reuse
            self.slot_of_line[evicted] = -1
            self.line_of_slot[victims] = -1
            slots[chosen] = victims
            self.evictions += len(victims)
        admitted = slots >= 0
        self.slot_of_line[lines[admitted]] = slots[admitted]
        self.line_of_slot[slots[admitted]] = lines[admitted]
        self.last_use[slots[admitted]] = stamp
        return slots, evicted, victims.copy(), reuse

    def _hybrid_value(self, lines, reuse, window):
        """Hybrid's value of ``lines`` (higher: keep): the window's look-ahead
        (``size + 1 - next reuse``: the next batch's lines highest; 0 where the
        window does not use a line) times ``window_weight``, plus the static
        score's rank among all lines, in [0, 1)."""
        ahead = np.zeros(len(lines))
        if window is not None:
            near = reuse != _FAR
            ahead[near] = window.size + 1 - np.minimum(reuse[near], window.size)
        return self.window_weight * ahead + self.score_rank[lines]

    def check(self, hot=None):
        """Asserts the directory's invariants (tests)."""
        held = self.line_of_slot[self.line_of_slot >= 0]
        assert len(held) <= self.capacity
        assert len(np.unique(held)) == len(held), "a line in two slots"
        assert (self.slot_of_line[held] == np.flatnonzero(self.line_of_slot >= 0)).all()
        assert (self.slot_of_line >= 0).sum() == len(held)
        if hot is not None:
            assert not np.isin(held, hot).any(), "a hot line in the cache"


class VictimBuffer:
    """Lines evicted while the window will reuse them: ``capacity`` slots of a
    buffer the owner keeps (host memory or pinned); this keeps which line
    each holds and its next reuse."""

    def __init__(self, capacity):
        self.capacity = int(capacity)
        self.slot_of_line = {}
        self.reuse = {}
        self.free = list(range(self.capacity - 1, -1, -1))
        self.stored = 0
        self.dropped = 0

    def __len__(self):
        return len(self.slot_of_line)

    def place(self, lines, reuse):
        """Slots for the evicted ``lines`` reused within the window (``reuse`` !=
        _FAR), nearest reuse first, while slots are free; -1 for those not kept."""
        lines = np.asarray(lines, dtype=np.int64)
        reuse = np.asarray(reuse, dtype=np.int64)
        out = np.full(len(lines), -1, dtype=np.int64)
        if self.capacity == 0 or not self.free:
            return out
        for i in np.argsort(reuse, kind="stable"):
            if reuse[i] == _FAR or not self.free:
                break
            line = int(lines[i])
            if line in self.slot_of_line:
                continue
            slot = self.free.pop()
            self.slot_of_line[line] = slot
            self.reuse[line] = int(reuse[i])
            out[i] = slot
            self.stored += 1
        return out

    def take(self, lines):
        """Slots holding ``lines`` (-1 where not held); held ones leave the buffer
        (their slots are free once the caller has copied them out)."""
        lines = np.asarray(lines, dtype=np.int64)
        out = np.full(len(lines), -1, dtype=np.int64)
        if not self.slot_of_line or len(lines) == 0:
            return out
        held = np.fromiter(self.slot_of_line.keys(), dtype=np.int64, count=len(self.slot_of_line))
        for i in np.flatnonzero(np.isin(lines, held)).tolist():
            line = int(lines[i])
            slot = self.slot_of_line.pop(line, None)
            if slot is not None:  # (a line given twice is taken once)
                del self.reuse[line]
                out[i] = slot
        return out

    def needed_next(self, window):
        """Lines held here that the window's next batch uses (to copy back ahead)."""
        if not self.slot_of_line or not window.batches:
            return np.empty(0, dtype=np.int64)
        held = np.fromiter(self.slot_of_line.keys(), dtype=np.int64)
        return held[np.isin(held, window.batches[0])]

    def put_back(self, lines, slots):
        """Lines taken but not used keep their slots (next reuse: the next batch)."""
        for line, slot in zip(np.asarray(lines).tolist(), np.asarray(slots).tolist()):
            self.slot_of_line[line] = slot
            self.reuse[line] = 1

    def release(self, slots):
        self.free.extend(int(s) for s in slots if s >= 0)

    def age(self, window):
        """One batch passed: reuse distances shrink; lines the window no longer
        reuses leave."""
        if not self.slot_of_line:
            return
        lines = np.fromiter(self.slot_of_line.keys(), dtype=np.int64)
        reuse = window.next_reuse(lines)
        for line, d in zip(lines.tolist(), reuse.tolist()):
            if d == _FAR:
                self.free.append(self.slot_of_line.pop(line))
                del self.reuse[line]
                self.dropped += 1
            else:
                self.reuse[line] = d
