"""Every implementation on the shared decode cases (tests/cases.py), one subclass each.

On a CPU: the torch reference, the jnp reference (`impl="xla"`) and both Pallas kernels in interpret
mode. Marked `gpu` (skipped, with the reason, where no GPU is): both Pallas kernels compiled, FA3
(`mla_torch.mla_decode(impl="fa3")`) and FlashMLA where it imports (`parity.runner.flashmla_decode`).
Each kernel runs with its own default tuning (its heuristic), as a user calls it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
import torch

import mla_jax
import mla_torch
from cases import PADDED_CASES, PADDED_IDS, DecodeCases

JNP_DTYPES = {"bfloat16": jnp.bfloat16, "float16": jnp.float16, "float32": jnp.float32}
TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


# ----------------------------------------------------------------------------- torch


class _Torch(DecodeCases):
    impl: str
    device = "cpu"

    def unsupported_reason(self, config, query_lens):
        return mla_torch.unsupported_reason(self.impl, config, torch.device(self.device))

    def decode(self, batch, k_scale):
        cfg = batch.config
        q = torch.from_numpy(batch.q).to(self.device, TORCH_DTYPES[cfg.dtype])
        kv_dtype = torch.float8_e4m3fn if cfg.is_fp8_kv_cache else TORCH_DTYPES[cfg.dtype]
        kv = torch.from_numpy(batch.kv_cache).to(self.device, kv_dtype)
        out, lse = mla_torch.mla_decode(q, kv, batch.metadata, cfg, impl=self.impl, k_scale=k_scale)
        if self.device != "cpu":
            torch.cuda.synchronize()
        return out, lse


class TestTorchReference(_Torch):
    impl = "reference"


@pytest.mark.gpu
class TestTorchFA3(_Torch):
    impl, device = "fa3", "cuda"
    page_tail = "finite"  # FA3 multiplies masked (zero) probabilities by the rows past seq_len

    def decode(self, batch, k_scale):
        try:
            return super().decode(batch, k_scale)
        except RuntimeError as e:
            # FA3 takes the page sizes vLLM declares for it (multiples of 16); its own message says so
            if batch.config.page_size % 16:
                pytest.skip(f"FA3 rejects page_size={batch.config.page_size}: {e}")
            raise


@pytest.mark.gpu
class TestFlashMLA(DecodeCases):
    page_tail = "finite"  # as FA3

    def unsupported_reason(self, config, query_lens):
        from parity import runner

        return runner.flashmla_unsupported_reason(config, query_lens)

    def decode(self, batch, k_scale):
        from parity import runner

        dt = TORCH_DTYPES[batch.config.dtype]
        q = torch.from_numpy(batch.q).to("cuda", dt)
        kv = torch.from_numpy(batch.kv_cache).to("cuda", dt)
        out, lse = runner.flashmla_decode(q, kv, batch.metadata, batch.config)
        torch.cuda.synchronize()
        return out, lse

    @pytest.mark.parametrize("case", PADDED_CASES, ids=PADDED_IDS)
    def test_padded_bucket(self, case):
        pytest.skip("FlashMLA is a timing anchor here, called on exact batches: the padded buckets are the "
                    "library's implementations' contract")


# ----------------------------------------------------------------------------- JAX


class _Jax(DecodeCases):
    """`mla_jax.mla_decode(impl=...)`: packed q, NumPy metadata, the kernel's default tuning."""

    impl: str
    interpret: bool | None = None  # the Pallas kernels: True on the CPU, False compiled on a GPU

    def device(self):
        return None if self.interpret else jax.devices()[0]

    def unsupported_reason(self, config, query_lens):
        if self.interpret is False and jax.default_backend() != "gpu":
            return f"JAX has no GPU (default backend {jax.default_backend()!r})"
        return mla_jax.unsupported_reason(self.impl, config, self.device())

    def decode(self, batch, k_scale):
        cfg = batch.config
        q = jnp.asarray(batch.q, JNP_DTYPES[cfg.dtype])
        kv = jnp.asarray(batch.kv_cache, jnp.float8_e4m3fn if cfg.is_fp8_kv_cache else JNP_DTYPES[cfg.dtype])
        extra = {} if self.interpret is None else dict(interpret=self.interpret)
        return jax.block_until_ready(
            mla_jax.mla_decode(q, kv, batch.metadata, cfg, impl=self.impl, k_scale=k_scale, **extra))


class TestJaxReference(_Jax):
    impl = "xla"


class TestPallasTritonInterpret(_Jax):
    impl, interpret = "pallas_triton", True


@pytest.mark.gpu
class TestPallasTritonGPU(_Jax):
    impl, interpret = "pallas_triton", False


class TestPallasMosaicGPUInterpret(_Jax):
    impl, interpret = "pallas_mosaic_gpu", True

    @pytest.fixture(autouse=True)
    def _needs_absl(self):
        pytest.importorskip("absl", reason="Mosaic GPU interpret mode needs absl-py")


@pytest.mark.gpu
class TestPallasMosaicGPU(_Jax):
    impl, interpret = "pallas_mosaic_gpu", False
