"""tools/skip-summary.py: the skips of a ctest run counted by reason (tools/run-tests.sh prints them)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tools", "skip-summary.py")


def log_entry(number, name, output, passed=True):
    """One test's entry in ctest's LastTest.log: its name, its output, and "Test Passed." where it passed."""
    rule = "-" * 58
    head = f"{number}/4 Testing: {name}\n{number}/4 Test: {name}\nOutput:\n{rule}\n"
    return head + output + "<end of output>\n" + ("Test Passed.\n" if passed else "")


LAST_TEST_LOG = (
    log_entry(
        1,
        "python_feature_store",
        "........ss\n"
        "=========================== short test summary info ============================\n"
        "SKIPPED [20] tests/python/test_feature_store.py:75: no CUDA device\n"
        "SKIPPED [1] tests/python/test_feature_store.py:97: spillfs mount: needs root\n",
    )
    + log_entry(
        2,
        "GpuRuntime.PointerDevice",
        "[ RUN      ] GpuRuntime.PointerDevice\n"
        "/work/tests/cuda/gpu_test.cu:229: Skipped\n"
        "no CUDA device\n"
        "[  SKIPPED ] GpuRuntime.PointerDevice (0 ms)\n"
        "[  SKIPPED ] 1 test, listed below:\n"
        "[  SKIPPED ] GpuRuntime.PointerDevice\n",
        passed=False,
    )
    + log_entry(3, "python_feature_store_pyg", "")
    + log_entry(4, "DataTest.Plain", "[ RUN      ] DataTest.Plain\n[       OK ] DataTest.Plain (1 ms)\n")
)

CONSOLE = """\
1/4 Test #1: python_feature_store .............   Passed    3.00 sec
2/4 Test #2: GpuRuntime.PointerDevice .........***Skipped   0.00 sec
3/4 Test #3: python_feature_store_pyg .........***Skipped   0.10 sec
4/4 Test #4: DataTest.Plain ...................   Passed    0.01 sec
"""


def run(tmp_path, *extra):
    log_dir = tmp_path / "Testing" / "Temporary"
    log_dir.mkdir(parents=True)
    (log_dir / "LastTest.log").write_text(LAST_TEST_LOG)
    (tmp_path / "console.log").write_text(CONSOLE)
    args = [sys.executable, SCRIPT, str(tmp_path)] + [str(tmp_path / e) for e in extra]
    return subprocess.run(args, capture_output=True, text=True, check=True).stdout.splitlines()


def test_skips_are_counted_by_reason_across_pytest_and_googletest(tmp_path):
    lines = run(tmp_path)
    assert lines[0].startswith("== skips by reason (22 in all;")
    assert lines[1].split()[:4] == ["21", "no", "CUDA", "device"]
    assert "GpuRuntime.PointerDevice" in lines[1] and "python_feature_store]" in lines[1]
    assert lines[2].split()[0] == "1" and "spillfs mount: needs root" in lines[2]
    assert len(lines) == 3


def test_a_skip_with_no_reason_is_counted_from_ctests_output(tmp_path):
    lines = run(tmp_path, "console.log")
    assert lines[0].startswith("== skips by reason (23 in all;")
    unexplained = [line for line in lines if "no reason in its output" in line]
    assert len(unexplained) == 1 and unexplained[0].split()[0] == "1"
    assert "[python_feature_store_pyg]" in unexplained[0]


def test_a_missing_log_is_a_clear_error(tmp_path):
    r = subprocess.run([sys.executable, SCRIPT, str(tmp_path / "nowhere")], capture_output=True, text=True)
    assert r.returncode == 1 and "cannot read" in r.stderr and "LastTest.log" in r.stderr
