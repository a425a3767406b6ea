"""An abstract H200 to lower kernels for on any machine (no GPU): the Pallas Triton and Mosaic GPU kernels and the split
combine, for the lowering tests and the tools (tools/mosaic_ptx.py, tools/smem.py, tools/triton_sass.py).

`PROBLEMS` are bench shapes that cover the Mosaic GPU kernel's code paths; `lowered_modules` / `module_texts` give the
Mosaic GPU modules of one call on such a problem (abstract inputs, no arrays made), with the heuristic's tuning or
another (`heuristic_tuning`, `with_overrides`: the heuristic's pick with some fields replaced, as the tools' --set)."""

from __future__ import annotations

import contextlib
import dataclasses
import re


@contextlib.contextmanager
def abstract_h200():
    """JAX lowers for an H200 (132 SMs) inside this context, without one: Pallas Triton's lowering asks the device."""
    import jax

    h200 = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="cuda")
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((1,), ("x",), abstract_device=h200)):
        yield


def lower_for_h200(fn, *args):
    """jax.jit(fn) traced on args and lowered for CUDA on an abstract H200 (a jax.stages.Lowered)."""
    import jax

    with abstract_h200():
        return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))


def with_overrides(config, overrides: dict):
    """config (a frozen tuning dataclass) with `overrides` replaced; a field it does not have is a
    ValueError naming it (dataclasses.replace would raise a TypeError)."""
    known = [f.name for f in dataclasses.fields(config)]
    unknown = sorted(set(overrides) - set(known))
    if unknown:
        raise ValueError(f"{type(config).__name__} has no field {', '.join(unknown)} (fields: {', '.join(known)})")
    return dataclasses.replace(config, **overrides)


def heuristic_tuning(mod, config, metadata, overrides=None):
    """The tuning `mod` (mla_jax.pallas_triton or .pallas_mosaic_gpu) picks for `config` and `metadata`, with
    `overrides` replaced (with_overrides)."""
    md = metadata
    base = mod.heuristic_config(config, md.num_decode_tokens, md.max_blocks, num_reqs=md.num_reqs,
                                max_query_len=md.max_query_len)
    return with_overrides(base, overrides) if overrides else base


# (heads, batch, seq_len, q_len, fp8): bench shapes, lowered on abstract inputs (no arrays made) with the heuristic's
# tuning, pages of 64
PROBLEMS = (
    (16, 128, 16384, 1, True),  # 16 rows: warpgroup_halves with v_from_ring
    (16, 8, 4096, 1, True),  # 16 rows, short splits: warpgroup_halves alone
    (16, 64, 4096, 2, True),  # 32 rows: warpgroup_halves with v_from_ring
    (32, 64, 4096, 1, True),  # 32 rows, H = 32
    (16, 1, 1024, 1, True),  # B = 1: splits of one step (the one-chain path)
    (128, 64, 4096, 1, True),  # 64 rows: the fused conversion
    (16, 128, 16384, 1, False),  # bf16: transposed scores and P @ V
    (128, 64, 4096, 2, False),  # bf16 at 64 rows
)


def problem_name(problem) -> str:
    heads, batch, seq_len, q_len, fp8 = problem
    return f"H{heads}_B{batch}_S{seq_len}_q{q_len}_{'fp8' if fp8 else 'bf16'}"


def module_texts(problem, module=None, tuning=None) -> list[str]:
    """The Mosaic GPU modules (without debug locations) of one call on `problem` ((heads, batch, seq_len, q_len,
    fp8)), lowered for an abstract H200 on abstract inputs with `tuning` (None: the heuristic's). module: the
    mla_jax.pallas_mosaic_gpu module to use (default: the package's)."""
    return [text for text, _ in lowered_modules(problem, module, tuning)]


def _abstract_problem(problem, page: int = 64):
    """(config, q, kv, metadata): `problem` ((heads, batch, seq_len, q_len, fp8)) with pages of `page` as a config and
    abstract inputs (ShapeDtypeStructs: q bf16, the cache, the metadata's arrays)."""
    import jax
    import jax.numpy as jnp

    from mla_spec import DecodeMetadata, MLAConfig

    heads, batch, seq_len, q_len, fp8 = problem
    tokens = batch * q_len
    blocks = -(-seq_len // page)
    config = MLAConfig(num_heads=heads, page_size=page, dtype="bfloat16",
                       kv_cache_dtype="fp8_e4m3" if fp8 else "auto")
    sds = jax.ShapeDtypeStruct
    q = sds((tokens, heads, 576), jnp.bfloat16)
    kv = sds((batch * blocks + 1, page, 576), jnp.float8_e4m3fn if fp8 else jnp.bfloat16)
    md = DecodeMetadata(query_start_loc=sds((batch + 1,), jnp.int32), seq_lens=sds((batch,), jnp.int32),
                        block_table=sds((batch, blocks), jnp.int32), max_query_len=q_len, max_seq_len=seq_len,
                        num_decode_tokens=tokens)
    return config, q, kv, md


def problem_tuning(problem, overrides=None, module=None, page: int = 64):
    """The heuristic's MosaicConfig for `problem` (pages of `page`), with `overrides` ({field: value}) replaced."""
    if module is None:
        from mla_jax import pallas_mosaic_gpu as module
    config, _, _, md = _abstract_problem(problem, page)
    return heuristic_tuning(module, config, md, overrides)


def abstract_call(problem, module=None, tuning=None, page: int = 64):
    """(fn, args): one call of mla_decode on `problem` ((heads, batch, seq_len, q_len, fp8)) with pages of `page`, on
    abstract inputs (_abstract_problem's and k_scale), for `lower_for_h200(fn, *args)`; `tuning` None: the
    heuristic's; a dict: the heuristic's with those fields replaced (problem_tuning, as the tools' --set)."""
    import jax
    import jax.numpy as jnp

    if module is None:
        from mla_jax import pallas_mosaic_gpu as module
    config, q, kv, md = _abstract_problem(problem, page)
    if isinstance(tuning, dict):
        tuning = problem_tuning(problem, tuning, module, page)
    fp8 = problem[4]

    def fn(q, kv, md, s):
        if fp8:
            return module.mla_decode(q, None, kv, md, config, tuning=tuning, k_scale=s)
        return module.mla_decode(q, None, kv, md, config, tuning=tuning)

    return fn, (q, kv, md, jax.ShapeDtypeStruct((), jnp.float32))


def lowered_modules(problem, module=None, tuning=None, page: int = 64) -> list[tuple[str, bytes]]:
    """(text without debug locations, bytecode handed to XLA) of each Mosaic GPU module of one call on `problem`
    (abstract_call's), lowered for an abstract H200. The bytecode is what Mosaic GPU's compiler reads
    (tools/mosaic_ptx.py)."""
    import io

    from jax.experimental.mosaic.gpu import core as mgpu_core

    fn, args = abstract_call(problem, module, tuning, page)
    out = []
    serde = mgpu_core._run_serde_pass  # (each Mosaic GPU module passes here just before it is serialized)

    def capture(mod, **kw):
        # (the dump name's counter grows with each kernel lowered in the process)
        text = re.sub(r'dump_basename = "(\w+?)_\d+"', r'dump_basename = "\1"',
                      mod.operation.get_asm(enable_debug_info=False))
        serialized = serde(mod, **kw)
        buf = io.BytesIO()  # (as Mosaic GPU's lowering rule writes it)
        serialized.operation.write_bytecode(buf, desired_version=0)
        out.append((text, buf.getvalue()))
        return serialized

    mgpu_core._run_serde_pass = capture
    try:
        lower_for_h200(fn, *args)
    finally:
        mgpu_core._run_serde_pass = serde
    return out
