"""A claim's error over its looks, with the last look spent (results/settle.py ``last_look_level``), on
fresh draws: is it within the level, and how much of it does it spend, beside Bonferroni over the looks?

A claim of a t statistic is looked at on nested samples (``counts``: its differences at each look of the
schedule), the earlier looks at the level × their weights, the last at ``last_look_level`` (simulated
with its own fixed seed). Here standard normal samples exactly at the boundary (the least favourable
null, the t bound's own assumption) are drawn with another seed, and the chance that *any* look crosses
is counted per level: the sequence's (0.55 α), "nothing learned"'s (0.3 α over 2, 0.3 α) and Holm's over
"worse" (0.1 α over 7, over 4, 0.1 α, and nine tenths and one tenth of each: the two bounds that test
"worse", ``settle.WORSE_SHARES``), on the default schedule and on uneven counts (a collapse at some
look moves a look's count).

    python benchmarks/last_look_validity.py [--paths 4000000]

Spent must stay ≤ 1 of the level (the Monte Carlo error is printed beside it); Bonferroni's is the rule
without the last look's spending.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
from scipy import special

from freezesweep.results import settle

ALPHA = 0.05
HOLM = [0.1 * ALPHA / 7, 0.1 * ALPHA / 4, 0.1 * ALPHA]  # Holm's steps: the first of 7 and of 4 claims, the last
# "worse" is one claim tested by two bounds at their shares of its Holm level (settle.WORSE_SHARES)
SHARES = sorted({share * a for share in settle.WORSE_SHARES.values() for a in HOLM})
LEVELS = sorted({*HOLM, *SHARES, 0.15 * ALPHA, 0.3 * ALPHA, 0.55 * ALPHA})
COUNTS = [(3, 5, 7, 9, 10), (2, 4, 5, 7, 8), (3, 4, 6, 8, 9), (3, 5, 7)]
CHUNK = 200_000


def crossings(counts: tuple[int, ...], paths: int, rng: np.random.Generator) -> dict[float, tuple[float, float]]:
    """Per level: the share of paths crossing at any look (the last spent, the last at Bonferroni's)."""
    weights = settle.look_weights(counts) if len(counts) < 5 else settle.SettleRule().look_weights
    spent = {a: settle.last_look_level(counts, a, tuple(weights)) for a in LEVELS}
    hits = {a: [0, 0] for a in LEVELS}
    for start in range(0, paths, CHUNK):
        draws = rng.standard_normal((min(CHUNK, paths - start), counts[-1]))
        total, squares = np.cumsum(draws, axis=1), np.cumsum(draws**2, axis=1)
        p = [special.stdtr(n - 1, -settle.t_of_prefix(total, squares, n)) if n >= 3 else 1.0 for n in counts]
        early = np.min([np.broadcast_to(q / w, len(draws)) for q, w in zip(p[:-1], weights)], axis=0)
        for a in LEVELS:
            hits[a][0] += int(((early <= a) | (p[-1] <= spent[a])).sum())
            hits[a][1] += int(((early <= a) | (p[-1] <= a * weights[len(counts) - 1])).sum())
    return {a: (h[0] / paths, h[1] / paths) for a, h in hits.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paths", type=int, default=4_000_000)
    args = parser.parse_args()
    rng = np.random.default_rng(12345)  # not the rule's own seed (results/settle.py _SIMULATION_SEED)
    for counts in COUNTS:
        start = time.perf_counter()
        for a, (spent, bonferroni) in crossings(counts, args.paths, rng).items():
            se = math.sqrt(spent / args.paths) / a
            print(f"{counts} level {a:.2e}: spent {spent / a:.3f} of it (SE {se:.3f}), Bonferroni {bonferroni / a:.3f}")
        print(f"  {time.perf_counter() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
