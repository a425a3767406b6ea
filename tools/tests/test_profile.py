"""tools/profile.py on the CPU: its --loop and --set checks and the tuning it profiles."""

import dataclasses

import pytest

from parity import timing


def test_profile_rejects_a_loop_that_is_not_a_multiple_of_4(capsys):
    from tools import profile

    with pytest.raises(SystemExit):
        profile.main(["--impl", "jax.pallas_triton", "--shape", "H16_B1_S1024_q1", "--loop", "6"])
    assert "--loop must be a positive multiple of 4" in capsys.readouterr().err


def test_profile_set_replaces_fields_of_the_heuristic(capsys, monkeypatch):
    """`profile --set`: the jax.pallas_* runner on the heuristic's tuning for the shape with the fields replaced (fp8
    for a .fp8 impl); refused for the torch impls and for a field the tuning lacks."""
    import types

    from mla_jax import pallas_mosaic_gpu
    from tools import profile
    from parity.scenarios import Scenario, make_batch

    with pytest.raises(SystemExit):
        profile.main(["--impl", "torch.fa3", "--shape", "H16_B1_S1024_q1", "--set", "pv_in_flight=1"])
    assert "--set applies to the jax.pallas_* impls" in capsys.readouterr().err
    batch = make_batch(Scenario("p", seq_lens=(4096, 4096), query_lens=(2, 2), num_heads=16), "bfloat16")
    inp = types.SimpleNamespace(config=batch.config, metadata=batch.metadata)
    seen = {}
    monkeypatch.setattr(timing, "jax_kernel", lambda impl, tuning, fp8: seen.update(impl=impl, tuning=tuning, fp8=fp8))
    profile._with_tuning("jax.pallas_mosaic_gpu.fp8", inp, {"pv_in_flight": 1})
    md = batch.metadata
    base = pallas_mosaic_gpu.heuristic_config(batch.config.replace(kv_cache_dtype="fp8_e4m3"), md.num_decode_tokens,
                                              md.max_blocks, num_reqs=md.num_reqs, max_query_len=md.max_query_len)
    assert base.pv_in_flight != 1
    assert seen == dict(impl="pallas_mosaic_gpu", tuning=dataclasses.replace(base, pv_in_flight=1), fp8=True)
    with pytest.raises(ValueError, match="no field nope"):
        profile._with_tuning("jax.pallas_mosaic_gpu", inp, {"nope": 1})
