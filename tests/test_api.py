"""impl="auto" and its explanation, on a machine without a GPU."""

import types

import jax
import jax.numpy as jnp
import pytest
import torch

import mla_jax
import mla_torch
from parity.scenarios import SCENARIOS, make_batch

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu" or torch.cuda.is_available(),
                                reason="checks the CPU-only choice")


def test_jax_auto_picks_the_reference_on_cpu_and_says_why():
    batch = make_batch(SCENARIOS["spec_decode"], "bfloat16")
    impl, skipped = mla_jax.select_impl(batch.config)
    assert impl == "xla"
    assert set(skipped) == {"pallas_triton", "pallas_mosaic_gpu"}
    assert all("not a GPU" in why for why in skipped.values())
    out, lse, used = mla_jax.mla_decode(jnp.asarray(batch.q, jnp.bfloat16), jnp.asarray(batch.kv_cache, jnp.bfloat16),
                                        batch.metadata, batch.config, impl="auto", return_impl=True)
    assert used == "xla" and out.shape == (17, 16, 512)


def test_torch_auto_picks_the_reference_on_cpu_and_says_why():
    batch = make_batch(SCENARIOS["single_token"], "bfloat16")
    impl, skipped = mla_torch.select_impl(batch.config, torch.device("cpu"))
    assert impl == "reference" and "fa3" in skipped and skipped["fa3"]
    out, lse, used = mla_torch.mla_decode(torch.from_numpy(batch.q).bfloat16(), torch.from_numpy(batch.kv_cache).bfloat16(),
                                          batch.metadata, batch.config, impl="auto", return_impl=True)
    assert used == "reference" and lse.shape == (1, 16)


def test_kernels_state_why_they_cannot_run_a_config():
    cfg = SCENARIOS["page_size_1"].config("bfloat16")
    assert "page_size" in mla_jax.unsupported_reason("pallas_mosaic_gpu", cfg)
    assert mla_jax.unsupported_reason("pallas_triton", cfg) is None  # any page size
    assert mla_jax.unsupported_reason("pallas_triton", cfg.replace(kv_cache_dtype="fp8_e4m3")) is None
    fp8 = cfg.replace(page_size=64, kv_cache_dtype="fp8_e4m3")
    assert mla_jax.unsupported_reason("pallas_mosaic_gpu", fp8) is None  # interpret mode runs it
    hopper = types.SimpleNamespace(platform="gpu", compute_capability="9.0")
    assert mla_jax.unsupported_reason("pallas_mosaic_gpu", fp8, hopper) is None

