#!/usr/bin/env python3
"""Counts the skips of a ctest run by reason, so that a skip nobody meant shows.

Usage: tools/skip-summary.py BUILD_DIR [CTEST_CONSOLE_LOG]
Reads BUILD_DIR/Testing/Temporary/LastTest.log (ctest's log of the last run, every
test's output) and finds the skips with their reasons:
  - pytest's (every suite runs with -rs):  SKIPPED [3] tests/python/x.py:75: no CUDA device
  - GoogleTest's (GTEST_SKIP() << reason): "file:line: Skipped", the reason, "[  SKIPPED ] Suite.Case"
With CTEST_CONSOLE_LOG (what ctest printed), a test ctest reports "***Skipped" whose
output gave no reason (e.g. one that exited with its SKIP_RETURN_CODE) is counted too,
under a reason that says so. Prints one line per reason: how many, and which ctest
tests they came from.
Standard library only: it runs under whatever python3 the machine has.
"""

import collections
import os
import re
import sys

PYTEST = re.compile(r"^SKIPPED \[(\d+)\] ([^:]+):\d+: (.*)$")
GTEST_REASON = re.compile(r"^\S+:\d+: Skipped$")
GTEST_DONE = re.compile(r"^\[  SKIPPED \] (\S+)")
ENTRY = re.compile(r"^\d+/\d+ Test(?: #\d+)?: (\S+)$")
CONSOLE_SKIP = re.compile(r"^\s*\d+/\d+ Test\s+#\d+: (\S+) \.*\s*\*+Skipped")


def tally(lines):
    """Returns {reason: [count, {ctest test names}]} for the lines of one LastTest.log."""
    reasons = collections.defaultdict(lambda: [0, set()])
    test = "?"
    pending = None  # a GoogleTest reason waiting for its "[  SKIPPED ]" line
    for i, line in enumerate(lines):
        line = line.rstrip("\n")
        m = ENTRY.match(line)
        if m:
            test, pending = m.group(1), None
            continue
        m = PYTEST.match(line)
        if m:
            entry = reasons[m.group(3).strip()]
            entry[0] += int(m.group(1))
            entry[1].add(test)
            continue
        if GTEST_REASON.match(line):
            pending = lines[i + 1].strip() if i + 1 < len(lines) else ""
            continue
        if GTEST_DONE.match(line) and pending is not None:
            entry = reasons[pending or "(GTEST_SKIP() with no reason)"]
            entry[0] += 1
            entry[1].add(test)
            pending = None
            continue
    return reasons


def skipped_by_ctest(lines):
    """The tests ctest's console output marks ***Skipped."""
    return {m.group(1) for m in (CONSOLE_SKIP.match(line) for line in lines) if m}


def main(argv):
    if len(argv) not in (2, 3):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    log = os.path.join(argv[1], "Testing", "Temporary", "LastTest.log")
    try:
        with open(log, errors="replace") as f:
            lines = f.readlines()
    except OSError as e:
        print(f"skip-summary: cannot read {log}: {e.strerror}", file=sys.stderr)
        return 1
    reasons = tally(lines)
    if len(argv) == 3:
        try:
            with open(argv[2], errors="replace") as f:
                console = f.readlines()
        except OSError as e:
            print(f"skip-summary: cannot read {argv[2]}: {e.strerror}", file=sys.stderr)
            return 1
        explained = set().union(*(tests for _, tests in reasons.values()))
        for test in sorted(skipped_by_ctest(console) - explained):
            entry = reasons["(skipped with no reason in its output: see the test's log)"]
            entry[0] += 1
            entry[1].add(test)
    total = sum(count for count, _ in reasons.values())
    print(f"== skips by reason ({total} in all; from {log})")
    for reason, (count, tests) in sorted(reasons.items(), key=lambda kv: (-kv[1][0], kv[0])):
        names = sorted(tests)
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        print(f"{count:6d}  {reason}  [{shown}]")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
