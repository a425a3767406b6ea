"""tools/convert_probe.py's shared probe helpers (the TMA probe uses them too), on the CPU."""


def test_slope_time_and_write_rows(tmp_path):
    """The probes' shared timer (slope_time): the slope between two iteration counts, and the rows written with the
    device's kind."""
    import json
    import time

    from tools.convert_probe import slope_time, write_rows

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
