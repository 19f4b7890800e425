"""Successive halving and HyperBand over a fixed list of configurations: budgets and promotions.

Successive halving (Jamieson & Talwalkar 2016; as Ray Tune's and Optuna's schedulers use it)
trains every configuration to a small budget, keeps the best 1/η, trains those η times longer,
and so on up to the full budget. Rung k of a sweep trains to `min_steps * η**k` environment
steps; the last rung to the full budget. HyperBand (Li et al. 2018) hedges the choice of
`min_steps`: bracket b starts its configurations at rung b, so bracket 0 prunes most
aggressively and the last bracket trains its configurations to the full budget unpruned.

A configuration's score at a rung is the mean over its seeds of the metric of each seed's
evaluation at that rung's budget (the trainer evaluates where it stops). The mean over seeds
estimates what the configuration reaches at that budget; the last evaluation rather than the
best so far, because the best of several noisy evaluations rewards luck and favours
high-variance configurations. A configuration with a failed seed has no score and is not
promoted: its mean would rest on the seeds that happened to survive.

Everything here is a pure function of the spec and the scores, so a resumed sweep recomputes
the same plan and the same promotions.
"""

import math


def rung_budgets(min_steps, reduction_factor, max_steps):
    """The budgets of the rungs: min_steps * η**k for k < K, then max_steps.

    K is log_η(max_steps / min_steps) rounded to the nearest integer (at least 1), so the last
    step up is between √η and η√η: 16384 steps and η = 3 to 150000 gives rungs of 16384, 49152
    and 150000 (no rung of 147456 just before the full budget); 20000 to 100000 gives 20000 and
    100000.
    """
    count = max(1, round(math.log(max_steps / min_steps) / math.log(reduction_factor)))
    return [min_steps * reduction_factor ** k for k in range(count)] + [max_steps]


def bracket_sizes(num_configurations, brackets, num_rungs, reduction_factor):
    """How many of the configurations each bracket gets (bracket 0 first).

    HyperBand's proportions: bracket b starts at rung b of `num_rungs` and gets a share
    proportional to η**s / (s + 1), s = num_rungs - 1 - b, so that every bracket spends about
    the same compute; the shares are rounded by largest remainder.
    """
    weights = [reduction_factor ** (num_rungs - 1 - b) / (num_rungs - b)
               for b in range(brackets)]
    exact = [num_configurations * weight / sum(weights) for weight in weights]
    sizes = [math.floor(value) for value in exact]
    left = num_configurations - sum(sizes)
    for bracket in sorted(range(brackets), key=lambda b: (sizes[b] - exact[b], b))[:left]:
        sizes[bracket] += 1
    return sizes


def assign_brackets(config_ids, brackets, num_rungs, reduction_factor):
    """{bracket: [config ids]}: consecutive runs of the configuration list, bracket 0 first."""
    sizes = bracket_sizes(len(config_ids), brackets, num_rungs, reduction_factor)
    assignment, start = {}, 0
    for bracket, size in enumerate(sizes):
        assignment[bracket] = list(config_ids[start:start + size])
        start += size
    return assignment


def score(values):
    """The mean of the seeds' metric values, or None if a seed has none (failed)."""
    if not values or any(value is None or not math.isfinite(value) for value in values):
        return None
    return sum(values) / len(values)


def promote(scores, reduction_factor, mode):
    """The config ids that go on to the next rung, best first: the top 1/η (at least one).

    `scores`: {config id: score or None}. Configurations without a score never go on; ties go
    to the smaller config id, so the choice does not depend on the order results came in.
    """
    scored = [(config_id, value) for config_id, value in scores.items() if value is not None]
    sign = -1.0 if mode == 'max' else 1.0
    scored.sort(key=lambda item: (sign * item[1], item[0]))
    keep = max(1, len(scores) // reduction_factor)
    return [config_id for config_id, _ in scored[:keep]]


def ranks(scores, mode):
    """{config id: rank from 1} among the configurations with a score, as `promote` orders."""
    sign = -1.0 if mode == 'max' else 1.0
    scored = sorted(((config_id, value) for config_id, value in scores.items()
                     if value is not None), key=lambda item: (sign * item[1], item[0]))
    return {config_id: rank for rank, (config_id, _) in enumerate(scored, 1)}
