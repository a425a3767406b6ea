"""tools/sweep.py on the CPU: its rounds, its --set and --fields parsing, and the variants it times."""

import pytest


def test_sweep_rounds_idle_before_each_timing_and_drop_a_failing_variant(monkeypatch):
    from tools import sweep

    events = []

    class Timer:
        def __init__(self, name, fail=False):
            self.name, self.fail = name, fail

        def measure(self, reps):
            events.append(self.name)
            if self.fail:
                raise RuntimeError("lost")
            return 1e-5, float("nan")

    monkeypatch.setattr(sweep.time, "sleep", lambda s: events.append(s))
    fa3, ok, bad = ({"round_seconds": []} for _ in range(3))
    sweep.time_rounds([(fa3, Timer("fa3")), (ok, Timer("ok")), (bad, Timer("bad", fail=True))], 2, 3, 1.5)
    assert events == [1.5, "fa3", 1.5, "ok", 1.5, "bad", 1.5, "fa3", 1.5, "ok"]
    assert fa3["round_seconds"] == ok["round_seconds"] == [1e-5, 1e-5]
    assert bad == {"error": "RuntimeError: lost"}


def test_sweep_set_takes_field_int_pairs():
    from tools.sweep import parse_overrides

    assert parse_overrides("num_warps=8,block_kv=64") == {"num_warps": 8, "block_kv": 64}
    assert parse_overrides("") == {}
    assert parse_overrides("q_in_kernel=True,ring_pairs=False") == {"q_in_kernel": True, "ring_pairs": False}
    for bad in ("num_warps", "num_warps=eight", "=8", "q_in_kernel=true"):
        with pytest.raises(ValueError, match=f"field=int \\(or True / False\\) pairs.*{bad!r}"):
            parse_overrides(bad)


def test_tuning_overrides_name_an_unknown_field():
    """The tools' --set (parity.h200.with_overrides): a field the config lacks is a
    ValueError naming it (not dataclasses.replace's TypeError); a bad value keeps the config's own check."""
    from mla_jax.pallas_triton import TritonConfig
    from parity.h200 import with_overrides

    assert with_overrides(TritonConfig(), {"num_warps": 8}).num_warps == 8
    with pytest.raises(ValueError, match="no field num_warp "):
        with_overrides(TritonConfig(), {"num_warp": 8})
    with pytest.raises(ValueError, match="num_warps=3"):
        with_overrides(TritonConfig(), {"num_warps": 3})


def test_sweep_refuses_unknown_fields_and_shapes(capsys):
    from tools.sweep import main

    with pytest.raises(SystemExit):
        main(["--impl", "pallas_mosaic_gpu", "--fields", "num_split"])  # a typo would time the heuristic alone
    assert "num_split" in capsys.readouterr().err
    with pytest.raises(ValueError, match="H128_B64"):
        main(["--impl", "pallas_mosaic_gpu", "--fields", "none", "--shapes", "H128_B64"])
    with pytest.raises(SystemExit):
        main(["--impl", "pallas_mosaic_gpu", "--fields", "none", "--rounds", "0"])
    assert "--rounds must be >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a value the field does not take
        main(["--impl", "pallas_mosaic_gpu", "--fields", "pv_in_flight=3"])
    assert "pv_in_flight=3 is not one of pv_in_flight's values" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a relative field narrows to one of its items (x0.5, x2, =1) only
        main(["--impl", "pallas_mosaic_gpu", "--fields", "num_splits=2"])
    assert "num_splits=2 is not one of" in capsys.readouterr().err


def test_sweep_times_the_relative_split_counts_beside_other_fields():
    """--fields num_splits,transpose: the split counts x0.5, x2 and 1 of the heuristic's, then the other layouts."""
    from mla_jax.pallas_mosaic_gpu import MosaicConfig
    from tools.sweep import sweep_spec, variants

    spec = sweep_spec("pallas_mosaic_gpu", ["num_splits", "transpose"], {})
    assert spec == {"num_splits": "x0.5,x2,=1", "transpose": ("none", "scores", "scores_and_pv")}
    labels = [label for label, _ in variants(MosaicConfig(num_splits=4, transpose="scores"), spec)]
    assert labels == ["heuristic", "num_splits=2", "num_splits=8", "num_splits=1", "transpose=none",
                      "transpose=scores_and_pv"]
    # from the fp8 heuristic's pick at H = 16 q_len 1 (warpgroup_halves needs both transposed): the plain path
    both = MosaicConfig(transpose="scores_and_pv", warpgroup_halves=True)
    assert list(variants(both, {"transpose": ("none",)}))[1] == ("transpose=none", MosaicConfig())
    narrowed = sweep_spec("pallas_mosaic_gpu", ["num_splits", "pv_in_flight"], {"pv_in_flight": "1"})
    assert narrowed == {"pv_in_flight": (1,), "num_splits": "x0.5,x2,=1"}
    # --fields num_splits=x2: the doubled split count alone beside the heuristic's
    narrowed = sweep_spec("pallas_mosaic_gpu", ["num_splits"], {"num_splits": "x2"})
    assert narrowed == {"num_splits": "x2"}
    labels = [label for label, _ in variants(MosaicConfig(num_splits=4), narrowed)]
    assert labels == ["heuristic", "num_splits=8"]
