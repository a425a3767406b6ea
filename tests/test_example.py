"""examples/deepseek_decode.py: DeepSeek-V3's YaRN numbers, and a tiny decode loop of the attention layer (xla and the
torch reference) through two buckets, every step within the harness tolerances and one compile a bucket."""

from __future__ import annotations

import math

import numpy as np
import torch

from examples import deepseek_decode as dd
from parity.compare import TOLERANCES


def test_deepseek_v3_yarn():
    """V3's rope settings: the ramp spans rotary dims 10..23, the fastest pair keeps theta's frequency and the slowest
    is divided by the factor, the softmax scale is 192 ** -0.5 (0.1 ln 40 + 1) ** 2, and the cos/sin carry no
    extra factor (mscale == mscale_all_dim)."""
    shape = dd.LayerShape()
    assert dd.yarn_correction_range(shape) == (10, 23)
    inv_freq = dd.yarn_inv_freq(shape)
    assert inv_freq[0] == 1.0
    assert math.isclose(inv_freq[-1], 1 / (40 * 10000 ** (62 / 64)), rel_tol=1e-12)
    assert np.all(np.diff(inv_freq) < 0)
    assert math.isclose(shape.softmax_scale, 192**-0.5 * (0.1 * math.log(40) + 1) ** 2, rel_tol=1e-12)
    assert shape.mla_config(page_size=64).softmax_scale == shape.softmax_scale
    cos, sin = dd.rope_cos_sin(np.array([0, 7, 100_000]), shape)
    np.testing.assert_allclose(cos**2 + sin**2, 1.0, rtol=1e-12)


def test_rope_is_a_rotation_of_interleaved_pairs():
    """The stacks' rope rotates pairs (x[2i], x[2i+1]) by position x inv_freq[i]: q . k depends on the positions'
    difference only."""
    shape = dd.LayerShape()
    table = torch.from_numpy(dd.rope_table(shape, 64)).double()
    half = shape.qk_rope_head_dim // 2
    q, k = torch.randn(2, shape.qk_rope_head_dim, generator=torch.Generator().manual_seed(0), dtype=torch.float64)

    def rot(x, p):
        return dd._torch_rope(x[None], table[p : p + 1, :half], table[p : p + 1, half:])[0].double()

    assert torch.allclose(rot(q, 9) @ rot(k, 4), rot(q, 40) @ rot(k, 35), rtol=1e-6)
    x = torch.zeros(shape.qk_rope_head_dim, dtype=torch.float64)
    x[0] = 1.0  # (1, 0) in the first pair turns into (cos, sin) of position x inv_freq[0] = position
    np.testing.assert_allclose(rot(x, 3)[:2].numpy(), [math.cos(3), math.sin(3)], rtol=1e-6)


# Two requests, a third joins at step 2 (the 4-request bucket), the first leaves at step 3 and a fourth joins (its
# blocks may be the first's), both late ones leave after step 4: step 5 is back in the 2-request bucket.
REQUESTS = [dd.RequestSpec(arrival=0, prompt_len=20, decode_steps=3), dd.RequestSpec(0, 5, 6),
            dd.RequestSpec(2, 33, 3), dd.RequestSpec(3, 9, 2)]


def test_decode_loop_two_buckets():
    shape = dd.LayerShape(num_heads=16, hidden_size=64)
    buckets = dd.make_buckets(4, max_seq_len=48, page_size=16)[1:]  # 2 and 4 requests (4 and 8 token rows)
    assert [(b.num_reqs, b.num_tokens) for b in buckets] == [(2, 4), (4, 8)]
    result = dd.run_decode_loop(shape, REQUESTS, steps=6, page_size=16, buckets=buckets, impl_jax="xla",
                                impl_torch="reference")
    tol = TOLERANCES["bfloat16"]
    assert [(r.num_reqs, r.bucket.num_reqs) for r in result.records] == [(2, 2), (2, 2), (3, 4), (3, 4), (3, 4),
                                                                        (1, 2)]
    for r in result.records:
        for c in (r.jax_vs_ref, r.torch_vs_ref, r.jax_vs_torch):
            assert c.ok and c.rel_err <= tol["out_rel"] and c.cos_sim >= tol["out_cos"], f"step {r.step}: {c.message}"
    assert len(result.buckets_used) == 2
    assert result.jax_compiles == {"pre": 2, "decode": 2, "post": 2}
    assert result.throughput("jax")["steps"] == 4 and "tokens/s" in result.summary()
