import math

from loadtests.stats import percentile, summarize, thin_p99_warning


def test_percentiles_interpolate_like_numpy_default():
    xs = list(range(1, 101))  # 1..100
    assert percentile(xs, 50) == 50.5
    assert math.isclose(percentile(xs, 99), 99.01)
    assert percentile([7.0], 99) == 7.0


def test_summarize_skips_missing_and_counts_samples():
    s = summarize([None, 3.0, float("nan"), 1.0, 2.0])
    assert s.count == 3 and s.p50 == 2.0 and s.min == 1.0 and s.max == 3.0
    assert not s.p99_reliable
    assert "n=3" in s.fmt() and "<100" in s.fmt()
    assert summarize([]).count == 0


def test_thin_p99_warning_below_100_samples():
    assert thin_p99_warning("ttft", summarize([1.0] * 20)) is not None
    assert thin_p99_warning("ttft", summarize([1.0] * 100)) is None
