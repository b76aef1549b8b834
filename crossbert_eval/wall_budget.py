"""A sweep worker's wall-clock budget (SweepConfig.budget_s, `crossbert sweep --budget-s`): which runs still fit.

A run's time is predicted from the runs this sweep has already timed (its timings.jsonl), never from a guess:

* training: the run's remaining training FLOPs at the measured seconds per training FLOP (the sum over timed
  runs of their `train` seconds over the sum of their training FLOPs);
* evaluation (probes, geometry, mteb, reliance: every other stage): the longest evaluation measured so far,
  scaled up by the ratio of hidden sizes where the run is wider (fitting a probe, which dominates evaluation on
  a GPU and at CPU sizes, grows with the feature width; encoding is the smaller part);

times PREDICTION_MARGIN. Before any run is timed there is nothing to predict from: the cheapest run goes first
and measures the rates. A run that does not fit is skipped (the sweep records it) and the report is built from
what finished, keeping REPORT_RESERVE_S for it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

# Predicted seconds are multiplied by this: a run predicted to end just inside the budget would often not.
PREDICTION_MARGIN = 1.15
# Seconds kept for the report at the end (a rebuild takes 10-15 s on 2 CPU cores, plots included).
REPORT_RESERVE_S = 30.0
TRAIN_STAGE = "train"


@dataclass(frozen=True)
class RunCost:
    """What a planned run costs, from the plan: its training FLOPs still to spend and its width."""

    run: str
    train_flops: float  # total training FLOPs of the run
    done_fraction: float  # share of its steps already trained (a resumed run)
    hidden_size: int


@dataclass(frozen=True)
class MeasuredRates:
    seconds_per_flop: float
    evaluation_s: float  # the longest evaluation of a timed run
    evaluation_width: int  # that run's hidden size


def measured_rates(timings: list[dict], costs: dict[str, RunCost]) -> MeasuredRates | None:
    """The rates of the runs `timings` (timings.jsonl rows: stage, run, seconds) has timed, None before any."""
    train_s: dict[str, float] = {}
    evaluation_s: dict[str, float] = {}
    for row in timings:
        if row.get("run") not in costs:
            continue  # the sweep's own rows, or a run no longer planned
        into = train_s if row.get("stage") == TRAIN_STAGE else evaluation_s
        into[row["run"]] = into.get(row["run"], 0.0) + float(row.get("seconds", 0.0))
    trained = [run for run in train_s if train_s[run] > 0]
    if not trained:
        return None
    seconds_per_flop = sum(train_s[r] for r in trained) / sum(costs[r].train_flops for r in trained)
    slowest = max(evaluation_s, key=evaluation_s.get, default=None)
    if slowest is None:
        return MeasuredRates(seconds_per_flop, 0.0, 1)
    return MeasuredRates(seconds_per_flop, evaluation_s[slowest], costs[slowest].hidden_size)


def predicted_seconds(cost: RunCost, rates: MeasuredRates) -> float:
    train = (1.0 - cost.done_fraction) * cost.train_flops * rates.seconds_per_flop
    evaluation = rates.evaluation_s * max(1.0, cost.hidden_size / rates.evaluation_width)
    return PREDICTION_MARGIN * (train + evaluation)


class WallBudget:
    """`seconds` of wall time from now; `verdict(cost, timings, costs)` says whether a run fits in what is left."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.deadline = clock() + seconds

    def remaining(self) -> float:
        return self.deadline - self.clock()

    def verdict(self, cost: RunCost, timings: list[dict], costs: dict[str, RunCost]) -> tuple[bool, float | None, float]:
        """(fits, predicted seconds or None before any run was timed, seconds left for runs)."""
        left = self.remaining() - REPORT_RESERVE_S
        rates = measured_rates(timings, costs)
        if rates is None:
            return left > 0, None, left
        predicted = predicted_seconds(cost, rates)
        return predicted <= left, predicted, left
