"""The decision: per sweep, dataset and train size, how many layers can be frozen — one sentence each,
the same honest rule in every mode (results/settle.py).

Each frozen depth is compared with full fine-tuning (k = 0) on the seeds where both trained, and full
fine-tuning with the constant baseline, with one-sided tests whose claims hold together over the group's
claims (family-wise per group: one dataset, train size and model) and over every look the sweep took (a
fixed grid: one, once complete; a settle sweep: its budget's); how often each collapses is counted and bounded beside it. Advice is the most-frozen depth
shown within the tolerance of full fine-tuning when it trains, with its collapse count. There is none
from fewer than 3 trained pairs, from a bound of zero width, or where full fine-tuning is not shown to
beat the constant baseline by more than the tolerance; what stays undecided is said, with the seeds it
had and, where the spread of at least 3 trained pairs allows, the budget that would decide it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import pandas as pd

from freezesweep.results.query import BASELINE, SCORE, with_methods
from freezesweep.results.settle import (
    COLLAPSE_SHARE,
    arm_labels,
    FINAL,
    FULL,
    STUCK,
    LEARNED,
    MIN_PAIRS,
    NOT_TESTED,
    NOTHING_LEARNED,
    UNDECIDED,
    WITHIN,
    WORSE,
    Comparison,
    GroupDecision,
    SettleRule,
    decide as decide_group,
    is_freeze,
    next_round,
    open_arms,
    order,
    seeds_to_decide,
    trained_seeds,
)
from freezesweep.results.stats import GROUP, TOLERANCE, confidence_pct, largest_k_retaining, lower_pct, upper_pct

DECISION_COLUMNS = [
    *GROUP,
    "metric",
    "baseline_seeds",
    "learned",
    "frozen_layers",
    "pairs",
    "score_0",
    "score_k",
    "mean_diff",
    "ci_low",
    "ci_high",
    "collapsed",
    "collapse_upper",
    "confidence",
    "looks",
    "within",
    "worse",
    "undecided",
    "not_tested",
    "decided_at_seeds",
    "params_saved_pct",
    "time_saved_pct",
    "mem_saved_pct",
    "k_retaining_90",
    "sentence",
]
# trials.metrics.REGRESSION_METRICS (results/ imports no trial code; a test checks the two agree): a
# group selected by one is a regression task, whose constant predictor answers one value, not one class
REGRESSION_METRICS = ("pearson", "spearman")


def decide(
    rows: pd.DataFrame,
    retained: pd.DataFrame,
    costs: pd.DataFrame,
    tolerance: float = TOLERANCE,
    planned_ks: dict[str, set[int]] | None = None,
    rules: Mapping[str, tuple[SettleRule, int, Mapping[str, Sequence[str]]]] | None = None,
    planned_seeds: dict[str, set[int]] | None = None,
    tolerances: Mapping[str, float] | None = None,
    planned_others: dict[str, set[str]] | None = None,
) -> pd.DataFrame:
    """One row per (sweep, dataset, train size) that has ok rows, every method's rows in it (LoRA ranks and
    the probe are claims of the group too, as its rounds decided them). ``planned_ks``: the frozen layers
    of each sweep's grid, when known ("k = 0 is not in the grid" or "has not finished"); ``planned_others``:
    its other methods' arms ("lora r=8", "probe"), a fixed grid's waited for as its depths are; ``rules``: per sweep,
    its settle rule, looks and each model's arms (default: its ``tolerances`` entry, else ``tolerance``,
    95 %, one look, the arms in the rows: a fixed grid); ``planned_seeds``: a fixed grid's seeds, when
    known — it is looked at once, when every planned cell of the group is in (a look at part of it would be
    one it was not paid for)."""
    layers = with_methods(rows)
    layers = layers.assign(arm=arm_labels(layers))  # once: every helper below reads a group's arms
    retaining = largest_k_retaining(retained).set_index(GROUP)["k_retaining_90"]
    many_sweeps = rows["sweep"].nunique() > 1
    records = []
    for key, group in layers.groupby(GROUP):
        if not (group["status"] == "ok").any():
            continue  # nothing finished: the completeness section says what failed
        asked = (tolerances or {}).get(key[0], tolerance)  # a fixed grid's question
        rule, looks, arms = (rules or {}).get(key[0], (SettleRule(tolerance=asked), 1, None))
        grid = _grid_arms(group, arms)
        decision = decide_group(_arms(group), rule, looks, grid)
        record = _record(key, group, decision, rule, looks, costs, grid)
        # what budget of a new settle sweep (its looks paid anew) would decide what is open: a settle
        # sweep's past its own; a fixed grid's from one seed more than a settle sweep's first look
        settle = key[0] in (rules or {})
        new = rule if settle else dataclasses.replace(rule, max_seeds=rule.initial_seeds)
        rounds_left = settle and _rounds_left(group, decision, rule, grid)
        open_ones = _open_comparisons(decision, new, grid)
        # a settle group its own rounds go on with is priced by no new sweep (report's budget_prices)
        record["decided_at_seeds"] = _decided_at(decision, rule, settle, rounds_left, open_ones, new)
        # not a column: the sentence's, to say why no budget is given (DataFrame drops it below)
        record["fewest_pairs"] = min((c.pairs for c in open_ones), default=None)
        planned = _planned_arms((planned_ks or {}).get(key[0]), (planned_others or {}).get(key[0]))
        running = _running(group, planned, (planned_seeds or {}).get(key[0]))
        if not settle and running:
            records.append(_waiting(record, _prefix(key, many_sweeps) + running))
            continue
        record["k_retaining_90"] = retaining.get(key) if decision.learned.decision == LEARNED else None
        if decision.learned.decision != LEARNED:  # not a column: the arms that trained, named as observations
            record["trained_arms"] = trained_seeds(_arms(group))
        settled = not open_arms(decision, grid, rule.tolerance)
        said = sentence(record, decision, rule, (planned_ks or {}).get(key[0]), settle, settled, rounds_left)
        record["sentence"] = _prefix(key, many_sweeps) + said
        records.append(record)
    return pd.DataFrame(records, columns=DECISION_COLUMNS)


def _waiting(record: dict, sentence: str) -> dict:
    """A fixed grid's group before its one look: what it is, and why it waits (no claim yet)."""
    return {**{c: record[c] for c in (*GROUP, "metric", "baseline_seeds", "confidence", "looks")}, "sentence": sentence}


def _grid_arms(group: pd.DataFrame, arms: Mapping[str, Sequence[str]] | None) -> list[str]:
    """The group's arms: a settle sweep's grid for the group's model (a depth with no row yet stops the
    sequence there; every arm counts in Holm's family, as in its rounds), else the arms in the rows (a
    fixed grid is decided once complete, when every arm of its model has rows)."""
    own = set(group["arm"])
    models = set(group["model"]) if "model" in group else set()
    if arms and len(models) == 1:
        own |= set(arms.get(next(iter(models)), ()))
    return sorted(own, key=order)


def _decided_at(
    decision: GroupDecision,
    rule: SettleRule,
    settle: bool,
    rounds_left: bool,
    open_ones: Sequence[Comparison],
    new: SettleRule,
) -> int | None:
    """The budget the sentence names (``decided_at_seeds``): where every seed of full fine-tuning collapsed,
    the seeds, every one collapsed, that would show nothing learned (the sentence's; its rounds where they
    reach it); else the seeds per arm that would decide what is open, unless its own rounds go on."""
    if _every_seed_collapsed(decision.learned):
        needed = all_collapsed_to_show(decision, rule)
        return None if rounds_left and needed <= rule.max_seeds else needed
    return None if rounds_left else _budget_to_decide(open_ones, new, decision)


def _rounds_left(group: pd.DataFrame, decision: GroupDecision, rule: SettleRule, grid: Sequence[str]) -> bool:
    """A settle group its own rounds would run more seeds for (read mid-run, or after a launch that
    stopped): a row to run again (failed, oom), or the next round a resume would run (``next_round``, as
    orchestrator/plan.py's ``group_round`` asks them)."""
    if not group["status"].isin(FINAL).all():
        return True
    seeds_done = _arms(group).groupby("arm")["seed"].agg(set).to_dict()
    return bool(next_round(decision, rule, [a for a in grid if a != FULL], seeds_done))


def _planned_arms(ks: set[int] | None, others: set[str] | None) -> set[str]:
    return {f"freeze k={int(k)}" for k in ks or ()} | set(others or ())


def _running(group: pd.DataFrame, arms: set[str], seeds: set[int] | None) -> str:
    """Why a fixed grid's group is not looked at yet ("": every planned cell has its outcome)."""
    if not arms or not seeds:
        return ""
    cells = list(zip(group["arm"], group["seed"]))
    final = {cell for cell, status in zip(cells, group["status"]) if status in FINAL}
    planned = {(a, s) for a in arms for s in seeds}
    if planned <= final:
        return ""
    failed = set(cells) & planned - final  # rows, not final: failed, oom
    counts = f"{len(planned & final)} of {len(planned)} cells in"
    # rows cannot tell a launch still running from one that stopped (a walk-through's interrupted launch
    # was called "still running"): both are said
    state = (
        f"the grid is not complete here: {len(failed)} cell{'s' if len(failed) > 1 else ''} failed, which "
        f"`freezesweep resume` runs again ({counts})"
        if failed
        else f"the grid is not all in here yet ({counts}: running now, or interrupted — `freezesweep resume` "
        "runs the rest)"
    )
    return (
        f"{state}: a fixed grid is decided once, when all its cells are in (a look at part of it would be one "
        "more look than its confidence was shared by)."
    )


def _arms(group: pd.DataFrame) -> pd.DataFrame:
    """A group's rows as settle mode reads them: arm, seed, score, baseline_score, status."""
    return pd.DataFrame(
        {
            "arm": group["arm"],
            "seed": group["seed"],
            "score": group[SCORE],
            "baseline_score": group[BASELINE],
            "status": group["status"],
            "collapsed": group["collapsed"] if "collapsed" in group else None,
        }
    )


def _record(
    key: tuple,
    group: pd.DataFrame,
    decision: GroupDecision,
    rule: SettleRule,
    looks: int,
    costs: pd.DataFrame,
    grid: Sequence[str] = (),
) -> dict:
    """The group's row of the decision table. ``grid``: the depths its sequence walks; one no round ran
    (settle mode, before full fine-tuning is shown to learn) is not tested, as the sentence says."""
    ok = group[group["status"] == "ok"]
    compared = {c.arm for c in decision.arms}
    unrun = [a for a in grid if a not in compared and a != FULL and is_freeze(a)]
    record = dict(
        zip(GROUP, key),
        metric=ok["select_metric"].iloc[0] if len(ok) else None,
        baseline_seeds=int((ok["arm"] == FULL).sum()),
        learned=decision.learned.decision,
        confidence=rule.confidence,
        looks=looks,
        **{
            name: ", ".join(_k(c.arm) for c in decision.arms if c.decision == state)
            for name, state in (
                ("within", WITHIN),
                ("worse", WORSE),
                ("undecided", UNDECIDED),
                ("not_tested", NOT_TESTED),
            )
        },
    )
    untested = [c.arm for c in decision.arms if c.decision == NOT_TESTED] + unrun  # LoRA, probe too: not learned yet
    record["not_tested"] = ", ".join(_k(a) for a in sorted(untested, key=order))
    chosen = next((c for c in decision.arms if c.arm == decision.advice), None)
    if chosen is None:
        return record
    k = int(chosen.arm.split("=")[1])
    # the sentence pairs paired numbers only: both means over the seeds where both trained
    record.update(
        frozen_layers=k,
        pairs=int(chosen.pairs),
        score_0=chosen.reference,
        score_k=chosen.score,
        mean_diff=chosen.mean,
        ci_low=chosen.low,
        ci_high=chosen.high,
        collapsed=f"{chosen.collapsed}/{chosen.seeds}",
        collapse_upper=chosen.collapse_upper,
    )
    cell = (*key, k)  # a tuple first: mypy takes (*key, k) inside [] for 3.11's star index
    cost = costs.set_index([*GROUP, "frozen_layers"]).loc[cell]
    for column in ["params_saved_pct", "time_saved_pct", "mem_saved_pct"]:
        record[column] = float(cost[column])
    return record


def _open_comparisons(decision: GroupDecision, rule: SettleRule, arms: Sequence[str]) -> list[Comparison]:
    """What is open of the answer: "learned", else the depths of the sequence still open. LoRA ranks and
    the probe are not asked: one near its boundary would leave the depths without a budget."""
    if decision.learned.decision == NOTHING_LEARNED:
        return []
    if decision.learned.decision != LEARNED:
        return [decision.learned]
    compared = {c.arm: c for c in decision.arms}
    return [compared[a] for a in open_arms(decision, arms, rule.tolerance) if a in compared and is_freeze(a)]


def _budget_to_decide(open_ones: Sequence[Comparison], rule: SettleRule, decision: GroupDecision) -> int | None:
    """The seeds per arm that would decide ``open_ones`` if the means and spreads stay as they are (None:
    no such budget up to 100 seeds, nothing open, or fewer than MIN_PAIRS trained pairs to estimate from)."""
    # no advice from too few seeds (seeds_to_decide: a spread from fewer than MIN_PAIRS differences gives
    # none): a walk-through's 2 seeds said 11, and the settle sweep run at 11 needed more than 100
    needed = [seeds_to_decide(c, rule, decision.levels) for c in open_ones]
    return None if not needed or None in needed else max(needed)


def _k(arm: str) -> str:
    return arm.replace("freeze ", "")


def _prefix(key: tuple, many_sweeps: bool) -> str:
    sweep, dataset, train_size = key
    return f"{sweep} · {dataset}, n = {train_size}: " if many_sweeps else f"{dataset}, n = {train_size}: "


def sentence(
    record: dict,
    decision: GroupDecision,
    rule: SettleRule,
    planned_ks: set[int] | None = None,
    settle: bool = False,
    settled: bool = False,
    rounds_left: bool = False,
) -> str:
    """The decision in words (without the "dataset, n = …:" prefix). ``settled``: no seed could change the
    advice any more (``results.settle.open_arms``); ``rounds_left``: a settle sweep's own rounds would run
    more of this group's seeds (its next step is to go on, not a new sweep)."""
    budget_left = rule.max_seeds if rounds_left else None
    left_out = _left_out(decision.excluded)
    if record["baseline_seeds"] == 0:
        why = (
            "none in the store"
            if planned_ks is None
            else "none has finished yet"
            if 0 in planned_ks
            else "the sweep's grid has none"
        )
        return f"no full fine-tuning (k = 0) runs to compare with ({why}), so no decision{left_out}."
    gain = decision.learned
    if gain.decision != LEARNED:
        # full fine-tuning's diverged seeds are counted in its sentence: "left out" names the others only
        said, named = (
            _not_learned(record, decision, rule, settle, budget_left),
            _left_out(decision.excluded, gain.diverged),
        )
        seen = _trained_arms(record)
        if named and seen and said.endswith(seen):  # one parenthesis: "(observed, …; left out: 1 failed)"
            return f"{said[:-1]}; {named.strip()[1:]}."
        return f"{said}{named}."
    rest, methods = _others(record, decision, budget_left, settle), _methods_within(record, decision, rule)
    full = _full_collapses(gain, _family(rule))
    if record.get("frozen_layers") is None and settled:
        return _or_methods(_every_layer(decision, rule, settle), decision) + f"{full}{rest}{methods}{left_out}."
    if record.get("frozen_layers") is None:
        return _or_methods(
            f"fine-tune every layer: no k is shown within {rule.tolerance:g} of full fine-tuning at "
            f"{_pairs(decision)} trained pairs{full}{rest}; {_add_seeds(record, settle, rule.tolerance, budget_left=budget_left, over=rule.max_seeds)}"
            f"{methods}{left_out}.",
            decision,
        )
    return _advice(record, decision, rule) + f"{rest}{methods}{left_out}."


def _within_methods(decision: GroupDecision) -> list[Comparison]:
    """LoRA ranks and the probe shown within the tolerance (Holm's claims, beside the depths' sequence)."""
    return [c for c in decision.arms if not is_freeze(c.arm) and c.decision == WITHIN]


def _method_name(arm: str) -> str:
    return "the probe" if arm == "probe" else arm.replace("lora r=", "LoRA r=")


def _or_methods(words: str, decision: GroupDecision) -> str:
    """No depth to freeze, but another method as good: the answer's first words say so (a walk-through read
    "fine-tune every layer" where the probe was shown within, at a fifth of the time)."""
    shown = _within_methods(decision)
    if not shown:
        return words
    names = _join([_method_name(c.arm) for c in shown])
    return words.replace("fine-tune every layer", f"fine-tune every layer, or use {names} (below)", 1)


def _methods_within(record: dict, decision: GroupDecision, rule: SettleRule) -> str:
    """Each other method shown within, with its evidence, as a depth's advice gives it."""
    return "".join(
        f"; {_method_name(c.arm)} is shown within the {rule.tolerance:g} tolerance of full fine-tuning when it "
        f"trains ({_family(rule)}): {record['metric']} {c.score:.3f} vs {c.reference:.3f} on the same {c.pairs} "
        f"seeds, paired difference {c.mean:+.3f} (its own one-sided bound {c.low:+.3f}, at {confidence_pct(1 - c.level)} %, "
        f"the level Holm's step held it to){_collapses(c, _family(rule), record['metric'])}"
        for c in _within_methods(decision)
    )


def _every_layer(decision: GroupDecision, rule: SettleRule, settle: bool) -> str:
    """No depth within, and no seed would change that: a claim where the first depth is shown worse, else
    what stopped its seeds, an estimate (``results.settle.open_arms``: its own bound, or hopeless)."""
    first = next((c for c in decision.arms if c.arm == decision.stopped_at), None)
    if decision.stopped_at is None:
        return "fine-tune every layer: the grid has no frozen depth to compare with full fine-tuning"
    depth = _k(decision.stopped_at)
    if first is not None and first.decision == WORSE:
        return (
            f"fine-tune every layer: freezing costs more than {rule.tolerance:g} here — the least frozen depth "
            f"({depth}) is shown worse than full fine-tuning by more than the tolerance, when it trains or in mean "
            f"with its collapses ({_family(rule)})"
        )
    fallback = "it runs no more seeds" if settle else "the grid ran its seeds"
    why = _estimate(first.why, settle) if first is not None and first.why else fallback
    return (
        f"fine-tune every layer: no k is shown within {rule.tolerance:g} of full fine-tuning, and the least "
        f"frozen depth ({depth}) is undecided ({why}; an estimate, not a claim)"
    )


def _estimate(why: str, settle: bool) -> str:
    """What stopped a depth's seeds, in its mode's words: a fixed grid was going to run none anyway."""
    return why if settle else why.removesuffix(STUCK)


def _family(rule: SettleRule) -> str:
    return f"{confidence_pct(rule.confidence)} % family-wise"


def _not_learned(
    record: dict, decision: GroupDecision, rule: SettleRule, settle: bool, budget_left: int | None = None
) -> str:
    """Nothing learned, shown; or not yet shown that full fine-tuning learns: why, and what would show it."""
    gain, pct = decision.learned, _family(rule)
    if gain.decision == NOTHING_LEARNED and (gain.pairs == 0 or "collapses" in gain.why):
        # the claim is full fine-tuning's collapse-or-diverge rate above 1/2: of it alone, each kind counted
        return (
            f"full fine-tuning did not learn at this size: it {_failed(gain, record['metric'])} ("
            f"{'it does on' if not gain.diverged else 'one or the other on'} at least {lower_pct(gain.collapse_lower)} % "
            f"of seeds, {pct}); {_NO_ADVICE}{_trained_arms(record)}"
        )
    if gain.decision == NOTHING_LEARNED:
        return (
            f"full fine-tuning did not learn at this size: when it trains, it beats the constant baseline by "
            f"{gain.mean:+.3f} (at most {gain.high:+.3f}, {gain.pairs} seeds), not by more than {rule.tolerance:g} "
            f"({pct}){_collapses(gain, pct, record['metric'])}; {_NO_ADVICE}{_trained_arms(record)}"
        )
    if _every_seed_collapsed(gain):
        needed = all_collapsed_to_show(decision, rule)
        budget_left = budget_left if budget_left and needed <= budget_left else None  # else its rounds cannot
        how = (
            f"{needed} seeds, every one collapsed, would; {_rounds_go_on(budget_left)}"
            if budget_left
            else f"a new settle sweep with settle.max_seeds {needed}, every seed collapsed, would"
            if settle
            else f"a new grid of {needed} seeds, every seed collapsed, would"
        )
        every, count = ("all", f"{gain.seeds} seeds") if gain.seeds > 1 else ("the", "one seed")
        failed = _all_failed(gain, record["metric"])
        return (
            f"{every} {count} of full fine-tuning {failed}: nothing learned as "
            f"far as {'they show' if gain.seeds > 1 else 'it shows'}, but {count} cannot show it at {pct} ({how}"
            f"{'' if budget_left else _NEW_SWEEP}); no freezing advice"
        )
    trained = f"{gain.pairs} trained seed{'s' if gain.pairs != 1 else ''}"
    return (
        f"not yet shown that full fine-tuning beats the constant baseline by more than {rule.tolerance:g} here "
        f"({trained}: {gain.why}){_collapses(gain, pct, record['metric']) if gain.collapsed else ''}; no freezing advice — "
        f"{_add_seeds(record, settle, rule.tolerance, _LEARNS, budget_left, rule.max_seeds)}"
    )


_NO_ADVICE = "no freezing advice, since freezing is judged against full fine-tuning"


def _failed(gain: Comparison, metric: str | None) -> str:
    """Full fine-tuning's seeds that did not train, each kind counted apart: a diverged seed predicted
    nothing (a walk-through's 6 diverged and 4 collapsed read "predicted one class on 10 of 10 seeds")."""
    one = gain.collapsed - gain.diverged
    if not gain.diverged:
        return f"{_one_answer(metric)} on {one} of {gain.seeds} seeds"
    if not one:
        return f"diverged on {gain.diverged} of {gain.seeds} seeds"
    return f"{_one_answer(metric)} on {one} of {gain.seeds} seeds and diverged on {gain.diverged}"


def _trained_arms(record: dict) -> str:
    """The arms that trained where full fine-tuning did not, with their trained seeds' mean: what was seen,
    not a claim (nothing compares them with anything)."""
    seen = [
        f"{_k(arm)} trained on {trained} of {seeds} seeds, {record['metric']} {mean:.3f} on them"
        for arm, (trained, seeds, mean) in sorted((record.get("trained_arms") or {}).items(), key=lambda a: order(a[0]))
        if arm != FULL and trained
    ]
    return f" (observed, not claimed: {'; '.join(seen)})" if seen else ""


def _one_answer(metric: str | None) -> str:
    """What a collapsed seed did, in the task's words (settle.COLLAPSE_SHARE): the constant predictor is a
    classifier's majority class, a regression's train mean (its correlation 0: trials/metrics.py)."""
    return f"collapsed ({_collapse_def(metric)})"


def _collapse_def(metric: str | None) -> str:
    """A collapse in words (trials/run.py collapsed, settle.COLLAPSE_SHARE): one answer everywhere, which may
    score above the line (a minority class answered everywhere: F1 2p / (1 + p)), or a score below it."""
    if metric in REGRESSION_METRICS:
        one, constant = "one value", "the constant predictor's (the train mean's)"
    else:
        one, constant = "one class", "the constant predictor's"
    return f"answered {one} everywhere, or scored at most {COLLAPSE_SHARE * 100:g} % of the way from {constant} score to a perfect one"


def _all_failed(gain: Comparison, metric: str | None) -> str:
    """Every seed of full fine-tuning collapsed or diverged: each kind counted where both happened."""
    one = gain.collapsed - gain.diverged
    if not gain.diverged:
        return _one_answer(metric)
    if not one:
        return "diverged"
    return f"collapsed or diverged ({one} collapsed, {_collapse_def(metric)}; {gain.diverged} diverged)"


def _full_collapses(learned: Comparison, pct: str) -> str:
    """Beside the answer where full fine-tuning learned: its own collapses, where it had any (the gate reads
    only its trained seeds, each of which beats the baseline by the collapse line; its bound is paid with
    the arms')."""
    if not learned.collapsed:
        return ""
    return (
        f"; full fine-tuning collapsed or diverged on {learned.collapsed} of {learned.seeds} seeds (at most "
        f"{upper_pct(learned.collapse_upper)} % of seeds do, {pct})"
    )


def _every_seed_collapsed(gain: Comparison) -> bool:
    """Full fine-tuning collapsed or diverged on every seed looked at, too few to show it learns nothing:
    the sentence's case and the table's budget for it (``all_collapsed_to_show``), one test for both."""
    return gain.decision == UNDECIDED and bool(gain.seeds) and gain.collapsed == gain.seeds


def all_collapsed_to_show(decision: GroupDecision, rule: SettleRule) -> int:
    """The fewest seeds, every one collapsed, that show full fine-tuning collapses on most
    seeds at the group's level for "nothing learned" (Holm's first step of its two claims, at a new
    settle budget's last look: what the report prices; a fixed grid of as many, read once, shows it too)."""
    first_step = decision.levels.nothing / 2
    for seeds in range(max(rule.initial_seeds, 1), 200):
        weight = dataclasses.replace(rule, max_seeds=seeds).look_weights[-1]
        if 0.5**seeds <= first_step * weight:
            return seeds
    return 200


def _advice(record: dict, decision: GroupDecision, rule: SettleRule) -> str:
    savings = [
        _change(record["params_saved_pct"], "fewer", "more", "trainable parameters"),
        _change(record["time_saved_pct"], "less", "more", "train time"),
        _change(record["mem_saved_pct"], "less", "more", "peak memory"),
    ]
    savings = [s for s in savings if s]
    saves = f"; it trains with {_join(savings)}" if savings else ""
    chosen = next(c for c in decision.arms if c.arm == decision.advice)
    return (
        f"freeze {_what(int(record['frozen_layers']))} — shown within the {rule.tolerance:g} tolerance of full "
        f"fine-tuning when it trains ({_family(rule)}; {_sequence(decision)}): {record['metric']} "
        f"{record['score_k']:.3f} vs {record['score_0']:.3f} on the same {record['pairs']} seeds, paired difference "
        f"{record['mean_diff']:+.3f} (its own one-sided bound {record['ci_low']:+.3f}, at "
        f"{confidence_pct(1 - chosen.level)} % unadjusted for choosing this depth)"
        f"{_collapses(chosen, _family(rule), record['metric'])}{_full_collapses(decision.learned, _family(rule))}{saves}"
    )


def _sequence(decision: GroupDecision) -> str:
    """The fixed sequence in words: the depths shown within in order, and where it stopped."""
    shown = [_k(c.arm) for c in decision.arms if c.decision == WITHIN and c.arm.startswith("freeze")]
    walked = f"tested from the least frozen depth: {', '.join(shown)} within"
    return walked + (f", stopped at {_k(decision.stopped_at)}" if decision.stopped_at else ", none left")


def _collapses(c: Comparison, pct: str, metric: str | None) -> str:
    """Stability beside quality: the seeds that did not train, and the bound on how often that happens."""
    if not c.seeds:
        return ""
    return (
        f"; {c.collapsed} of {c.seeds} seeds {_one_answer(metric)} or diverged (at most "
        f"{upper_pct(c.collapse_upper)} % of seeds do, {pct})"
    )


_LEARNS = "whether full fine-tuning learns (the depths, asked next, may need more)"
_NEW_SWEEP = ", under a new name and another split_seed, so that its seeds are not the rows already seen"


def _rounds_go_on(max_seeds: int) -> str:
    return (
        f"this sweep's own rounds go on, up to settle.max_seeds {max_seeds} seeds per arm (`freezesweep resume` "
        "runs them where its launch stopped)"
    )


def _add_seeds(
    record: dict,
    settle: bool,
    tolerance: float,
    what: str = "it",
    budget_left: int | None = None,
    over: int | None = None,
) -> str:
    """What would decide it: the sweep's own rounds where they go on (``budget_left``: its max_seeds), else a
    budget of a new settle sweep (plan prices it), or why there is none. A new sweep, under a new name and
    another split_seed: its seeds 0, 1, … under the same split_seed would be the rows already seen (a
    cell's run seed is drawn from its seed, split_seed, dataset and model), and a fixed grid's seeds grown
    in place would look at its rows twice. ``over``: a settle sweep's max_seeds, said where its rounds are over
    (a walk-through's report never said its budget had run out)."""
    if budget_left:
        return f"not decided yet: {_rounds_go_on(budget_left)}"
    ended = (
        f"this sweep's own rounds are over (at most settle.max_seeds {over} seeds per arm); " if settle and over else ""
    )
    budget = record.get("decided_at_seeds")
    if budget is None or pd.isna(budget):
        return ended + _no_budget(record, settle, what)
    where = (
        f"settle.max_seeds {int(budget)}"
        if settle
        else f"settle: {{tolerance: {tolerance:g}, max_seeds: {int(budget)}}} in place of `seeds:` and `tolerance:`"
    )
    return ended + (
        f"{int(budget)} seeds per arm would decide {what} if the spread stays as it is (a new settle sweep with "
        f"{where}{_NEW_SWEEP}: `freezesweep plan` prices it)"
    )


def _no_budget(record: dict, settle: bool, what: str) -> str:
    """Why no budget is given: too few trained pairs to estimate one from (a fixed grid's words say it of
    every reason a budget is missing), else one above 100 seeds or a mean on the boundary."""
    fewest = record.get("fewest_pairs")
    if settle and fewest is not None and fewest < MIN_PAIRS:
        return (
            f"these seeds cannot say how many would decide {what}: an estimate from fewer than {MIN_PAIRS} trained "
            f"pairs ({fewest} here) would be a guess (a new settle sweep under a new name and another split_seed "
            "runs as many as the question needs)"
        )
    if settle:
        return "more seeds than 100 per arm would be needed at this spread, or the mean sits on the boundary"
    return (
        "these seeds cannot say how many would, too few trained or their differences identical (a settle "
        "sweep under a new name and another split_seed runs as many as the question needs)"
    )


def _pairs(decision: GroupDecision) -> str:
    """The arms' paired seeds: one count, or the range (settle mode gives each arm its own)."""
    counts = sorted({c.pairs for c in decision.arms}) or [0]
    return f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"


def _others(record: dict, decision: GroupDecision, budget_left: int | None = None, settle: bool = False) -> str:
    """The other arms in words: worse, undecided and not tested, the last two with their estimates (a depth
    whose seeds stopped, with why: ``results.settle``'s ``_stuck_why``)."""

    def listed(state: str) -> str:
        return ", ".join(
            f"{_k(c.arm)} ({c.mean:+.3f} when trained{_stopped(c, settle)})" if c.pairs else _k(c.arm)
            for c in decision.arms
            if c.decision == state
        )

    parts = [
        f"worse than full fine-tuning: {record['worse']}" if record["worse"] else "",
        f"undecided: {listed(UNDECIDED)}" if record["undecided"] else "",
        f"not tested, deeper than where the sequence stopped: {listed(NOT_TESTED)}" if record["not_tested"] else "",
    ]
    parts = [p for p in parts if p]
    budget = record.get("decided_at_seeds")
    if budget_left and record.get("frozen_layers") is not None and record["undecided"]:
        parts.append(f"this sweep's own rounds go on for what is open, up to {budget_left} seeds per arm")
    elif budget is not None and not pd.isna(budget) and record.get("frozen_layers") is not None:
        parts.append(f"{int(budget)} seeds per arm would decide what is open")
    return f" ({'; '.join(parts)})" if parts else ""


def _stopped(c: Comparison, settle: bool) -> str:
    """Why an undecided depth runs no more seeds (its own bound, or hopeless), where that is why: an
    estimate at no level the claims pay for (a false one in about 1 % of fixed grids at the boundary: an
    audit), said as one; a fixed grid's says nothing of seeds it was never going to run."""
    if c.decision != UNDECIDED or not c.why.endswith(STUCK):
        return ""
    return f": {_estimate(c.why, settle)}; an estimate, not a claim"


def _left_out(excluded: dict[str, int], named_diverged: int = 0) -> str:
    """The rows no bound reads (failed, oom, diverged), less the diverged ones the sentence already counts."""
    counts = {**excluded, "diverged": excluded.get("diverged", 0) - named_diverged}
    counts = {status: n for status, n in counts.items() if n > 0}
    if not counts:
        return ""
    return " (left out: " + ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) + ")"


def _what(k: int) -> str:
    if k == -1:
        return "the embeddings only (k = -1)"
    return f"the embeddings and the first {k} layer{'s' if k != 1 else ''} (k = {k})"


def _change(pct: float, fewer: str, more: str, noun: str) -> str:
    if pct is None or math.isnan(pct):
        return ""  # not measured (e.g. peak memory on some devices): say nothing rather than 0 %
    return f"{abs(pct):.0f} % {fewer if pct >= 0 else more} {noun}"


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
