"""CachedSample: one read per collection round, however close the rounds are."""

from otel_eacgm.metrics._cache import CachedSample


def test_consumers_share_a_read_until_one_asks_again() -> None:
    reads = []
    sample = CachedSample(lambda: reads.append(1) or len(reads))
    assert (sample.get("io"), sample.get("packets"), sample.get("errors")) == (1, 1, 1)
    # Second round: the first consumer to come back triggers a fresh read the others share.
    assert (sample.get("io"), sample.get("packets")) == (2, 2)
    assert len(reads) == 2
