"""gpu_python_checks.py's timing (no GPU, no cudabuf, PyTorch or CuPy needed)."""

from __future__ import annotations

import gpu_python_checks as gpc


def test_timed_takes_at_least_the_repetitions_and_the_minimum_time() -> None:
    calls = {"fn": 0, "sync": 0}

    def fn() -> None:
        calls["fn"] += 1

    def sync() -> None:
        calls["sync"] += 1

    gpc.timed(fn, sync, 5)
    # One untimed warm-up, then samples until 5 and at least MIN_SECONDS: a call this cheap
    # is timed many more than 5 times, but never more than MAX_SAMPLES.
    assert 5 + 1 < calls["fn"] <= gpc.MAX_SAMPLES + 1
    assert calls["sync"] == calls["fn"]


def test_timed_stops_at_the_repetitions_once_the_minimum_time_is_spent() -> None:
    import time

    calls = {"fn": 0}

    def slow() -> None:
        calls["fn"] += 1
        time.sleep(gpc.MIN_SECONDS)

    median = gpc.timed(slow, lambda: None, 3)
    assert calls["fn"] == 3 + 1, "each call outlasts the minimum time: the repetitions decide"
    assert median >= gpc.MIN_SECONDS
