"""Which seeds a seeded test runs: shared by the fidelity test and the crash soak."""

from __future__ import annotations

from collections.abc import Sequence


def parse_seeds(spec: str | None, defaults: Sequence[int]) -> list[int]:
    """``N`` (seeds 1..N), ``A-B`` (inclusive) or ``A,B,...``; ``defaults`` when unset."""
    if not spec:
        return list(defaults)
    if "," in spec:
        return [int(s) for s in spec.split(",") if s.strip()]
    if "-" in spec:
        low, high = spec.split("-", 1)
        return list(range(int(low), int(high) + 1))
    return list(range(1, int(spec) + 1))
