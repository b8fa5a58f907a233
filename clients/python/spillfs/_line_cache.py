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
- ``hybrid``: static score plus reuse from the look-ahead window (the
  batches given to ``prefetch``): a line's value is the number of window
  batches that use it plus its score's rank among all lines (in [0, 1));
  the lowest value goes first (least recent among equals), and a missing
  line comes in only over a lower value. So lines the window needs stay,
  and between lines it does not need the static score decides.

Lines of the batch being served are never evicted for it (they are its
hits), and hot lines (held by the hot-node buffer) never enter the cache.

:class:`Window` holds the future batches' lines; :class:`VictimBuffer` takes
an evicted line only where the window will reuse it (LSM-GNN's victim
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

    def push(self, lines):
        self.batches.append(np.unique(np.asarray(lines, dtype=np.int64)))

    def pop(self):
        """Drops the batch being served now (the oldest), if any."""
        if self.batches:
            self.batches.popleft()

    def reuse_count(self, lines):
        """How many of the window's batches use each line."""
        lines = np.asarray(lines, dtype=np.int64)
        out = np.zeros(len(lines), dtype=np.int64)
        for batch in list(self.batches)[:self.size]:
            if len(batch):
                out += np.isin(lines, batch)
        return out

    def next_reuse(self, lines):
        """Batches until each line is used again within the window (1: the next
        batch); ``_FAR`` where the window does not use it."""
        lines = np.asarray(lines, dtype=np.int64)
        out = np.full(len(lines), _FAR, dtype=np.int64)
        for d, batch in enumerate(list(self.batches)[:self.size], start=1):
            if len(batch) == 0:
                continue
            hit = np.isin(lines, batch, assume_unique=False) & (out == _FAR)
            out[hit] = d
        return out


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
        self.window_weight = 1.0  # hybrid: value of one window use against the whole score range
        # hybrid: a line's score as its rank among all lines, in [0, 1)
        order = np.argsort(self.score, kind="stable")
        self.score_rank = np.empty(self.n_lines, dtype=np.float64)
        self.score_rank[order] = np.arange(self.n_lines) / max(1, self.n_lines)

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
        if self.policy == "static" and len(lines) > len(free):
            order = np.argsort(-self.score[lines], kind="stable")  # best lines first
        elif self.policy == "hybrid":
            new_value = self.score_rank[lines]
            if use_window:
                new_value = new_value + self.window_weight * window.reuse_count(lines)
            order = np.argsort(-new_value, kind="stable")  # best lines first
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
            cand_reuse = (window.next_reuse(cand_lines) if window is not None
                          else np.full(len(cand), _FAR, dtype=np.int64))
            if self.policy == "lru":
                rank = np.lexsort((cand, self.last_use[cand]))
            elif self.policy == "static":
                rank = np.lexsort((self.last_use[cand], self.score[cand_lines]))
            else:  # hybrid: value = uses in the window + score rank; lowest value first, then least recent
                cand_value = self.score_rank[cand_lines]
                if use_window:
                    cand_value = cand_value + self.window_weight * window.reuse_count(cand_lines)
                rank = np.lexsort((self.last_use[cand], cand_value))
            n = min(len(rest), len(cand))
            victims = cand[rank[:n]]
            chosen = rest[:n]
            victim_reuse = cand_reuse[rank[:n]]
            if self.policy == "static":  # only where the new line outscores its victim
                better = self.score[lines[chosen]] > self.score[self.line_of_slot[victims]]
            elif self.policy == "hybrid":  # only over a lower value (best new lines, worst victims)
                better = new_value[chosen] > cand_value[rank[:n]]
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
