import subprocess
import sys

import pytest


def run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "adaptune.cli", *args], capture_output=True, text=True,
                          timeout=600, cwd=cwd)


@pytest.mark.parametrize("args,needle", [
    (["tune-op", "no-such-layer"], "unknown workload"),
    (["tune-op", "conv2d:1,2,3"], "needs"),
    (["tune-op", "conv2d:1,8,4,4,8,9,9"], "kernel larger"),
    (["tune-op", "dense:0,4,4"], "positive"),
    (["tune-op", "L8", "--trials", "0"], "--trials"),
    (["tune-op", "L8", "--target", '{"kind": "bogus"}'], "bad target"),
    (["tune-op", "L8", "--target", "{not json"], "bad target JSON"),
    (["tune-op", "L8", "--strategy", "nope"], "invalid choice"),
    (["tune-op", "L8", "--resume", "--work-dir", "missing-dir"], "does not exist"),
    (["tune-op", "L8", "--spaces", "fancy"], "invalid choice"),
    (["tune-op", "L8", "--json", "no/such/dir/x.json"], "does not exist"),
])
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, cli, args, needle):
    code, _, err = cli(*args)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_a_real_process_exits_2_with_one_line(tmp_path):
    """``python -m adaptune.cli`` itself: its exit status and one stderr line (the cases above run in-process)."""
    out = run("tune-op", "L8", "--target", "{not json", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.strip().count("\n") == 0 and "bad target JSON" in out.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_tune_op_reports_and_checks_numerics(tmp_path, cli):
    code, out, err = cli("tune-op", "tiny-dense", "--trials", "6", "--work-dir", str(tmp_path / "wd"), "--strategy", "random")
    assert code == 0, err
    assert "PASS" in out and "GFLOPS" in out
    code, _, err = cli("tune-op", "tiny-dense", "--trials", "6", "--work-dir", str(tmp_path / "wd"))
    assert code == 2 and "--resume" in err
