"""tools/skip-summary.py: the skips of a ctest run counted by reason (tools/run-tests.sh prints them)."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tools", "skip-summary.py")

LAST_TEST_LOG = """\
1/4 Testing: python_feature_store
1/4 Test: python_feature_store
Output:
----------------------------------------------------------
........ss
=========================== short test summary info ============================
SKIPPED [20] tests/python/test_feature_store.py:75: no CUDA device
SKIPPED [1] tests/python/test_feature_store.py:97: spillfs mount: needs root
<end of output>
Test Passed.
2/4 Testing: GpuRuntime.PointerDevice
2/4 Test: GpuRuntime.PointerDevice
Output:
----------------------------------------------------------
[ RUN      ] GpuRuntime.PointerDevice
/work/tests/cuda/gpu_test.cu:229: Skipped
no CUDA device
[  SKIPPED ] GpuRuntime.PointerDevice (0 ms)
[  SKIPPED ] 1 test, listed below:
[  SKIPPED ] GpuRuntime.PointerDevice
<end of output>
3/4 Testing: python_feature_store_pyg
3/4 Test: python_feature_store_pyg
Output:
----------------------------------------------------------
<end of output>
Test Passed.
4/4 Testing: DataTest.Plain
4/4 Test: DataTest.Plain
Output:
----------------------------------------------------------
[ RUN      ] DataTest.Plain
[       OK ] DataTest.Plain (1 ms)
<end of output>
Test Passed.
"""

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
