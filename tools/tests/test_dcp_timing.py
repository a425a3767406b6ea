"""tools/dcp_timing.py on the CPU: its whole code path (inputs, shards, the four timed loops, the checks, the table
and the JSON) on a 2-device CPU mesh and a tiny shape, in a subprocess started with the XLA flag that makes the
devices (this process's JAX may have started with one)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_dcp_timing_runs_on_a_two_device_cpu_mesh(tmp_path):
    out = tmp_path / "dcp.json"
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    # the second shape (q_len 2) is refused: DCP decodes one token a request; the tool reports it and goes on
    proc = subprocess.run(
        [sys.executable, "-m", "tools.dcp_timing", "--shapes", "H16_B2_S128_q1,H16_B2_S128_q2", "--impl", "xla",
         "--calls", "4", "--reps", "1", "--json", str(out)],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    tail = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 1, tail  # 1: a shape failed
    assert "speedup" in proc.stdout and "psum merge us" in proc.stdout, tail
    result = json.loads(out.read_text())
    assert result["world_size"] == 2 and result["devices"] == ["cpu", "cpu"]
    good, bad = result["rows"]
    assert good["shape"] == "H16_B2_S128_q1" and good["checks_ok"], good["checks"]
    assert set(good["seconds"]) == {"one_device", "dcp", "merge", "psum_merge"}
    assert all(t > 0 for t in good["seconds"].values()) and good["n_calls"]["dcp"] == 4
    assert good["speedup"] == pytest.approx(good["seconds"]["one_device"] / good["seconds"]["dcp"])
    assert good["local_max_seq_len"] == 64  # 128 tokens over 2 devices
    assert bad["shape"] == "H16_B2_S128_q2" and "q_len 1" in bad["error"], bad


def test_dcp_timing_refuses_bad_arguments(capsys):
    from tools import dcp_timing

    for argv, message in ((["--calls", "6"], "--calls must be a multiple of 4"), (["--world", "0"], "--world must"),
                          (["--shapes", "H16_B2"], "shape must look like"),
                          (["--launch-ms", "inf"], "launch-ms must be a finite positive number")):
        with pytest.raises(SystemExit):
            dcp_timing.main(argv)
        assert message in capsys.readouterr().err
