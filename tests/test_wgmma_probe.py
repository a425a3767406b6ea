"""parity.wgmma_probe (a GPU diagnosis): each probe lowers for CUDA on the CPU, and the probes the Mosaic GPU
interpreter can run (its wgmma takes no register operand, and no run_state over an accumulator) match numpy."""

import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

from parity import wgmma_probe as probe


def _operands(name=None, random=False):
    """q, k (numpy) and the probe's device inputs (the HBM probes: a small stand-in for the 1 GiB buffer, copies of
    K's first step)."""
    q, k = probe.operands(random)  # (as main, --random or not)
    args = tuple(jnp.asarray(x, jnp.bfloat16) for x in (q, k))
    if name in probe.HBM_PROBES:
        args += (jnp.tile(args[1][:probe.BLOCK_KV], (3, 1)),)
    return q, k, args


@pytest.mark.parametrize("name", list(probe.PROBES))
def test_lowers_for_cuda(name):
    _, _, args = _operands(name)
    text = probe.build(name, 3, 2).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu" in text


@pytest.mark.parametrize("name", ["qk", "qk_n128", "qk+qk", "qk32", "qk_sm", "qk32_sm"])
def test_interpreted_probe_matches_numpy(name):
    q, k, args = _operands()
    with plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams()):
        got = np.asarray(probe.build(name, 3, 1)(*args))
    for w, want in enumerate(probe.expected(name, 3, q, k)):
        if want is not None:
            assert probe.matches(probe.PROBES[name][w], got[w], want), (got[w], want)


@pytest.mark.parametrize("name", list(probe.STEPS))
@pytest.mark.parametrize("iters", [1, 2, 5])
def test_interpreted_step_probe_matches_numpy(name, iters):
    """The step probes' hand-offs (barriers by step parity) under the interpreter's barrier checks, and their
    results against numpy."""
    q, k, args = _operands(name)
    with plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams()):
        got = np.asarray(probe.build(name, iters, 1, interpret=True)(*args))
    for w, want in enumerate(probe.expected(name, iters, q, k)):
        assert probe.matches(probe.PROBES[name][w], got[w], want), (w, got[w], want)


@pytest.mark.parametrize("name", list(probe.STREAMS))
def test_interpreted_stream_probe_runs(name):
    """The stream probes' slots and barriers (each load awaited `depth` iterations later, the last ones at the end)
    under the interpreter's barrier checks."""
    q, k, args = _operands(name)
    with plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams()):
        got = np.asarray(probe.build(name, 5, 2)(*args))
    assert probe.matches("stream", got[0], probe.expected(name, 5, q, k)[0])


@pytest.mark.parametrize("name", ["step_flashmla_1p", probe.RING, "step_flashmla_1p_ring_scattered_pf2"])
def test_interpreted_step_probe_matches_numpy_on_random_values(name):
    """--random: the step probes' tolerance (one bf16 ulp of P) holds for normal q and K too."""
    q, k, args = _operands(name, random=True)
    with plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams()):
        got = np.asarray(probe.build(name, 3, 1, interpret=True)(*args))
    for w, want in enumerate(probe.expected(name, 3, q, k)):
        assert probe.matches(probe.PROBES[name][w], got[w], want), (w, got[w], want)


def test_bad_arguments():
    with pytest.raises(ValueError, match="'nope'"):
        probe.main(["--probes", "nope"])
    with pytest.raises(ValueError, match="'5,2'"):
        probe.main(["--iters", "5,2"])


def test_slope_time_and_write_rows(tmp_path):
    """The probes' shared timer (parity.convert_probe.slope_time): the slope between two iteration counts, and the
    rows written with the device's kind."""
    import json
    import time

    from parity.convert_probe import slope_time, write_rows

    class Done:
        def block_until_ready(self):
            return self

    def sleeper(seconds):
        return lambda: (time.sleep(seconds), Done())[1]

    us, t_lo, t_hi = slope_time(sleeper(0.001), sleeper(0.011), (), 100, 1100, 3)
    assert 0.001 <= t_lo < t_hi and 5 < us < 30  # (10 ms over 1000 iterations: 10 us, give or take the sleeps)
    path = tmp_path / "rows.json"
    write_rows(str(path), [{"probe": "x"}])
    assert json.loads(path.read_text())["rows"] == [{"probe": "x"}]
    write_rows(None, [{"probe": "x"}])  # (no --json: nothing written, no error)
