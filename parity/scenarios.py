"""Named parity scenarios (vLLM's BATCH_SPECS idea) and the batches they make.

A `Batch` holds float32 NumPy inputs whose values are exactly representable in
the scenario's dtype (so every stack sees the same numbers), block tables that
are random permutations with block 0 left unused, and NaN in every cache slot
that no request may read.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np

from mla_spec import DecodeMetadata, MLAConfig, build_decode_metadata
from mla_spec.fp8 import FP8_E4M3_MAX, fp8_k_scale, quantize_fp8  # noqa: F401 (FP8_E4M3_MAX: re-exported)

_NP_DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values rounded to `dtype` (bf16/fp16/fp32), kept as float32."""
    return np.asarray(x, np.float32).astype(_NP_DTYPES[dtype]).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    seq_lens: tuple[int, ...]
    query_lens: tuple[int, ...]
    num_heads: int = 16
    page_size: int = 64
    permute_blocks: bool = True  # random block order, block 0 never used
    spare_blocks: int = 3  # unused (NaN) blocks in the cache besides block 0

    def config(self, dtype: str = "bfloat16", **overrides) -> MLAConfig:
        return MLAConfig(num_heads=self.num_heads, page_size=self.page_size, dtype=dtype, **overrides)

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario("single_token", seq_lens=(1,), query_lens=(1,)),
        Scenario("decode_mixed_lengths", seq_lens=(1, 17, 33, 97, 1030), query_lens=(1, 1, 1, 1, 1)),
        Scenario("page_size_1", seq_lens=(1, 5, 17, 33), query_lens=(1, 1, 2, 1), page_size=1),
        Scenario("page_size_16", seq_lens=(17, 33, 97, 300), query_lens=(1, 1, 1, 1), page_size=16),
        Scenario("spec_decode", seq_lens=(40, 97, 300, 1030), query_lens=(2, 4, 8, 3)),
        Scenario("spec_decode_page_16", seq_lens=(8, 64, 200), query_lens=(8, 5, 2), page_size=16),
        Scenario("heads_128", seq_lens=(33, 97, 520), query_lens=(1, 1, 1), num_heads=128),
        Scenario("heads_128_spec", seq_lens=(97, 300), query_lens=(4, 2), num_heads=128, page_size=16),
        Scenario("contiguous_blocks", seq_lens=(64, 128, 65), query_lens=(1, 1, 1), permute_blocks=False),
    ]
}
"""The parity table. Small enough for interpret mode on a CPU; every entry runs on the GPU too."""


@dataclasses.dataclass(frozen=True)
class Batch:
    scenario: Scenario
    config: MLAConfig
    metadata: DecodeMetadata
    q: np.ndarray  # [T, H, L+R] float32, values representable in config.dtype
    kv_cache: np.ndarray  # [num_blocks, P, L+R] float32, NaN in every unreadable slot

    @property
    def q_nope(self) -> np.ndarray:
        return self.q[..., : self.config.kv_lora_rank]

    @property
    def q_pe(self) -> np.ndarray:
        return self.q[..., self.config.kv_lora_rank :]


PAGE_TAILS = ("nan", "finite")


def make_batch(
    scenario: Scenario, dtype: str = "bfloat16", seed: int = 0, *, page_tail: str = "nan", **config_overrides
) -> Batch:
    """The scenario's batch. Unused blocks are always NaN. `page_tail` fills the slots past
    seq_len inside a request's last page: "nan" (the strict test), or "finite" (large finite
    garbage, +-1e4: still caught if attended to, but harmless to a kernel that multiplies
    masked probabilities (0) by those rows, as FA3 does). The readable data is the same."""
    if page_tail not in PAGE_TAILS:
        raise ValueError(f"page_tail must be one of {PAGE_TAILS}, got {page_tail=}")
    config = scenario.config(dtype, **config_overrides)
    rng = np.random.default_rng(seed)
    P, D = config.page_size, config.head_dim
    pages = [-(-s // P) for s in scenario.seq_lens]
    num_used = sum(pages)
    num_blocks = 1 + num_used + scenario.spare_blocks
    ids = np.arange(1, num_blocks)
    if scenario.permute_blocks:
        ids = rng.permutation(ids)
    block_table, k = [], 0
    for n in pages:
        block_table.append(ids[k : k + n])
        k += n
    metadata = build_decode_metadata(
        seq_lens=scenario.seq_lens,
        query_lens=scenario.query_lens,
        block_table=block_table,
        config=config,
        num_blocks=num_blocks,
    )
    kv_cache = np.full((num_blocks, P, D), np.nan, np.float32)
    for seq_len, row in zip(scenario.seq_lens, block_table):
        pos = np.arange(seq_len)
        kv_cache[row[pos // P], pos % P] = rng.standard_normal((seq_len, D), dtype=np.float32)
    q = rng.standard_normal((scenario.num_tokens, config.num_heads, D), dtype=np.float32)
    if page_tail == "finite":
        tail_rng = np.random.default_rng(seed + 7919)
        for seq_len, row, n in zip(scenario.seq_lens, block_table, pages):
            pos = np.arange(seq_len, n * P)
            kv_cache[row[pos // P], pos % P] = 1e4 * tail_rng.choice([-1.0, 1.0], size=(pos.size, D))
    return Batch(scenario, config, metadata, round_to(q, dtype), round_to(kv_cache, dtype))


def random_scenario(rng: np.random.Generator, *, num_heads=16, page_size=16, max_reqs=4, max_seq=300, max_q=8):
    """A random valid scenario (for property tests)."""
    n = int(rng.integers(1, max_reqs + 1))
    seq = rng.integers(1, max_seq + 1, size=n)
    q = np.minimum(rng.integers(1, max_q + 1, size=n), seq)
    return Scenario(
        f"random_{n}", tuple(int(x) for x in seq), tuple(int(x) for x in q), num_heads=num_heads, page_size=page_size
    )




def make_fp8_batch(
    scenario: Scenario, dtype: str = "bfloat16", seed: int = 0, *, page_tail: str = "nan", **config_overrides
) -> tuple[Batch, float]:
    """The scenario's batch with an fp8 KV cache (kv_cache_dtype="fp8_e4m3"), and its k_scale.

    The cache of `make_batch` is quantized with one per-tensor scale, vLLM's convention
    (real value = fp8 value * k_scale), k_scale = amax / 448 over the readable slots (a float32
    value). `batch.kv_cache` holds the float8_e4m3fn values as float32 (exact; cast it to
    float8_e4m3fn for the kernels), NaN where make_batch put NaN (float8_e4m3fn has NaN).
    The float64 reference of the dequantized cache is `reference.mla_decode(q, kv_cache * k_scale,
    metadata, config with kv_cache_dtype="auto")`, or the same call with the fp8 config and k_scale.
    """
    batch = make_batch(scenario, dtype, seed, page_tail=page_tail, kv_cache_dtype="fp8_e4m3", **config_overrides)
    P = batch.config.page_size
    kv = batch.kv_cache
    bt = np.asarray(batch.metadata.block_table)
    readable = np.concatenate(
        [kv[bt[r, np.arange(s) // P], np.arange(s) % P] for r, s in enumerate(scenario.seq_lens)]
    )
    fp8, k_scale = quantize_e4m3(kv, np.abs(readable).max())
    return dataclasses.replace(batch, kv_cache=fp8), k_scale


def quantize_e4m3(kv: np.ndarray, amax) -> tuple[np.ndarray, float]:
    """(fp8, k_scale): `kv` quantized by the cache's rule (`mla_spec.fp8`) with one per-tensor scale k_scale =
    amax / 448 (a float32 value; amax: that of the readable slots), the float8_e4m3fn values returned as float32
    (exact), NaN where `kv` has NaN."""
    k_scale = fp8_k_scale(amax)
    return quantize_fp8(kv, k_scale), k_scale
