"""The timing the benchmarks share: medians of interleaved repeats.

The functions are timed in alternation (a, b, c, a, b, c, ...), so that a slow spell of a
shared machine hits all of them alike, and each one's median over the rounds is reported.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Dict, List


def interleaved_medians(fns: Dict[str, Callable[[], object]], rounds: int, *, calls: int = 1,
                        warmup: int = 1,
                        clock: Callable[[], float] = time.perf_counter) -> Dict[str, float]:
    """Median seconds per call of each function, timed in alternation after ``warmup`` calls
    of each.

    A round times ``calls`` calls of each function in a row and divides by ``calls``;
    ``clock`` is ``time.perf_counter`` (wall clock) or ``time.process_time`` (CPU time of this
    process, which other programs on the machine inflate much less).
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: Dict[str, List[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = clock()
            for _ in range(calls):
                fn()
            samples[name].append((clock() - start) / calls)
    return {name: statistics.median(s) for name, s in samples.items()}
