"""Helpers shared by the Pallas kernel tests: cached batches with their float64 reference,
device inputs, and the out/lse check with the harness tolerances."""

import functools

import jax.numpy as jnp
import numpy as np

import mla_jax
from mla_spec import reference
from parity.compare import compare_out_lse
from parity.scenarios import Scenario, make_batch

JNP_DTYPES = {"bfloat16": jnp.bfloat16, "float16": jnp.float16, "float32": jnp.float32}


@functools.lru_cache(maxsize=None)
def batch_and_reference(scenario: Scenario, dtype: str, seed: int = 0):
    batch = make_batch(scenario, dtype, seed=seed)
    ref_out, ref_lse = reference.mla_decode(batch.q, batch.kv_cache, batch.metadata, batch.config)
    return batch, ref_out, ref_lse


def device_inputs(batch, dtype: str):
    """(q_nope, q_pe, kv_cache, metadata) as jax arrays in `dtype`."""
    jd = JNP_DTYPES[dtype]
    return (
        jnp.asarray(batch.q_nope, jd),
        jnp.asarray(batch.q_pe, jd),
        jnp.asarray(batch.kv_cache, jd),
        mla_jax.to_jax_metadata(batch.metadata),
    )


def assert_matches(out, lse, ref_out, ref_lse, dtype: str, what: str):
    T, H, L = ref_out.shape
    assert out.shape == (T, H, L) and out.dtype == JNP_DTYPES[dtype], (out.shape, out.dtype)
    assert lse.shape == (T, H) and lse.dtype == jnp.float32, (lse.shape, lse.dtype)
    c_out, c_lse = compare_out_lse(np.asarray(out.astype(jnp.float32)), np.asarray(lse), ref_out, ref_lse, dtype)
    assert c_out.ok, f"{what}: {c_out.message}"
    assert c_lse.ok, f"{what}: {c_lse.message}"
