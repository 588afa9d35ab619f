#!/usr/bin/env python3
"""Pools the rounds of several bench/http_load.sh runs of one scenario.

Each argument is the whole output of one run, stdout and stderr together
(`bench/http_load.sh > run1.txt 2>&1`): its `round N: <layer> <requests/s>
<non-2xx> <CPU µs/request>` lines. For every round, the ratios of the
pressure layer to tower_governor and of each to no layer; printed, over
all rounds of all runs: the median of each ratio, its 95% interval by
resampling the rounds (5,000 resamples, a fixed seed, so the same files
give the same figures) and the rounds at or above 1.

Usage: bench/pool_rounds.py run1.txt run2.txt run3.txt
"""
import random
import re
import statistics
import sys

ROUND = re.compile(r"round (\d+): (\w+) ([\d.]+) (\d+) ([\d.]+)")


def interval(ratios):
    rng = random.Random(1)
    medians = sorted(
        statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(5000)
    )
    return medians[125], medians[4874]


def main(paths):
    ratios = {"pressure / governor": [], "CPU per request, pressure / governor": [],
              "pressure / none": [], "governor / none": []}
    served = []
    for path in paths:
        rounds = {}
        with open(path) as f:
            for line in f:
                m = ROUND.match(line)
                if m:
                    rounds.setdefault((path, m[1]), {})[m[2]] = (float(m[3]), float(m[5]))
        for layers in rounds.values():
            rps = {k: v[0] for k, v in layers.items()}
            cpu = {k: v[1] for k, v in layers.items()}
            ratios["pressure / governor"].append(rps["pressure"] / rps["governor"])
            ratios["CPU per request, pressure / governor"].append(cpu["pressure"] / cpu["governor"])
            ratios["pressure / none"].append(rps["pressure"] / rps["none"])
            ratios["governor / none"].append(rps["governor"] / rps["none"])
            served.extend(rps.values())
    if not served:
        sys.exit("no `round N: ...` lines found (keep stderr: `> run.txt 2>&1`)")
    n = len(ratios["pressure / governor"])
    print(f"{n} rounds; each server served {min(served):.0f}-{max(served):.0f} requests/s per round")
    for name, xs in ratios.items():
        lo, hi = interval(xs)
        at_or_above = sum(x >= 1 for x in xs)
        print(f"{name}: median {statistics.median(xs):.3f}, 95% interval {lo:.3f}-{hi:.3f}, "
              f"at or above 1 in {at_or_above} of {n}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
