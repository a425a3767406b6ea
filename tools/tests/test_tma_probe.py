"""tools/tma_probe.py (a GPU diagnosis): each probe lowers for CUDA on the CPU (Mosaic GPU builds its TMA descriptors
there: the 128-byte fp8 boxes need a buffer row a multiple of 128), and each runs in the Mosaic GPU interpreter, its
slots and barriers checked, the last step it loaded copied back out as the buffer holds it."""

import jax
import numpy as np
import pytest
from jax.experimental.pallas import mosaic_gpu as plgpu

from tools import tma_probe as probe
from parity.h200 import abstract_h200


@pytest.mark.parametrize("name", list(probe.PROBES))
def test_lowers_for_cuda(name):
    dtype, _, _, pitch, _, _ = probe.PROBES[name]
    with abstract_h200():
        text = probe.build(name, 3, 132).trace(jax.ShapeDtypeStruct((probe.HBM_ROWS, pitch), dtype)).lower(
            lowering_platforms=("cuda",)).as_text()
    assert "mosaic_gpu" in text


@pytest.mark.parametrize("name", list(probe.PROBES))
def test_interpreted_probe_copies_the_step_back(name):
    rows = 8 * probe.BLOCK_KV  # (a small stand-in for the large buffer: 8 steps, each CTA 3 of them over 5 loads)
    big, step = probe.big_buffer(name, rows=rows)
    assert big.shape == (rows, probe.PROBES[name][3])
    with plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams()):
        got = np.asarray(probe.build(name, 5, 2)(big))
    got = np.ascontiguousarray(got[:, :, :probe.HEAD_DIM])
    np.testing.assert_array_equal(got.view(np.uint8), np.broadcast_to(step, got.shape).view(np.uint8))


def test_the_probes_differ_as_named():
    """fp8_64p and fp8_128p load the same bytes from the same buffer, in boxes of 64- and 128-byte rows; fp8_64 and
    fp8_flat from a buffer shaped as the cache (576-byte rows), in boxes of 64- and 128-byte rows; fp8_pair from its
    view of two tokens a row."""
    assert probe.PROBES["fp8_64p_x4"][3] == probe.PROBES["fp8_128p_x4"][3] == probe.PADDED
    assert (probe.PROBES["fp8_64p_x4"][1], probe.PROBES["fp8_128p_x4"][1]) == (64, 128)
    assert probe.PROBES["fp8_64_x4"][3] == probe.PROBES["fp8_flat_x4"][3] == probe.HEAD_DIM
    assert probe.PROBES["fp8_flat_x4"][4] and not probe.PROBES["fp8_64_x4"][4]
    assert probe.PROBES["fp8_64_pf0_x4"][:5] == probe.PROBES["fp8_64_x4"][:5] and probe.PROBES["fp8_64_x4"][5] is None
    assert probe.PROBES["fp8_128r_x4"][1:4] == (128, 4, probe.HEAD_DIM)  # (128-byte boxes from the cache's rows)
    # (fp8_pair: two tokens a row of 1152 bytes, the bf16 ring's row in bytes)
    assert probe.PROBES["fp8_pair_x4"][3:5] == (probe.HEAD_DIM, 2 * probe.HEAD_DIM) == (576, 1152)
    assert probe.step_bytes("fp8_64_x4") * 2 == probe.step_bytes("bf16_128_x2") == 64 * 576 * 2


def test_main_refuses_an_unknown_probe_and_bad_iterations():
    with pytest.raises(ValueError, match="--probes: 'nope' is not one of"):
        probe.main(["--probes", "nope"])
    with pytest.raises(ValueError, match="--iters"):
        probe.main(["--iters", "5,2"])
