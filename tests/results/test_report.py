"""The report from stores with known rows: the decision sentence, the tables, the retained quality and
the paired contrasts against values computed by hand; the CLI; a real headless Chromium rendering."""

import html
import json
import math
import re
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from scipy.stats import t

from freezesweep.results.report import SweepRows, build_report, decisions, write_report
from freezesweep.results.store import SCHEMA, ResultStore
from tests.conftest import REPO

T_975_DF2 = 4.302652729911275  # Student t quantile 0.975 with 2 degrees of freedom (tables)
MAJORITY = 0.5
# n = 100, seeds 0, 1, 2: accuracy per k. k = 3 is 0.002 below full fine-tuning with a tight spread
# (qualifies); k = 6 is 0.05 below; k = -1 is level with full fine-tuning, tight too (the sequence passes it).
ACC_100 = {0: [0.80, 0.85, 0.90], 3: [0.798, 0.847, 0.899], 6: [0.75, 0.78, 0.87], -1: [0.801, 0.851, 0.899]}
COST_100 = {0: (1000, 10.0, 400.0), 3: (250, 6.0, 300.0), 6: (10, 4.0, 250.0), -1: (900, 9.0, 390.0)}


def row(sweep="s", dataset="d", n=100, k=0, seed=0, acc=None, status="ok", cost=(None, None, None), **extra):
    params, time_s, mem_mb = cost
    return (
        {name: None for name in SCHEMA.names}
        | dict(
            sweep=sweep,
            trial_id=f"{sweep}-{dataset}-{n}-{k}-{seed}",
            dataset=dataset,
            train_size=n,
            frozen_layers=k,
            seed=seed,
            status=status,
            best_val_accuracy=acc,
            majority_baseline=MAJORITY,
            trainable_params=params,
            train_time_s=time_s,
            peak_mem_mb=mem_mb,
        )
        | extra
    )


def regression_row(k: int, seed: int, score: float, sweep="s", dataset="d", **extra) -> dict:
    """An STS-B-like row: Pearson selected, the train mean's correlation (0) its constant baseline."""
    return row(
        sweep,
        dataset=dataset,
        k=k,
        seed=seed,
        acc=None,
        majority_baseline=None,
        select_metric="pearson",
        best_val_score=score,
        baseline_score=0.0,
        best_val_pearson=score,
        baseline_pearson=0.0,
        collapsed=score == 0.0,
        **extra,
    )


def known_rows(sweep="s") -> list[dict]:
    rows = [
        row(sweep, k=k, seed=seed, acc=acc, cost=COST_100[k])
        for k, accs in ACC_100.items()
        for seed, acc in enumerate(accs)
    ]
    rows.append(row(sweep, k=6, seed=3, status="failed", error="CUDA out of memory"))
    rows += [
        row(sweep, n=20, k=0, acc=0.7, cost=(1000, 2.0, 400.0)),  # one paired seed: no CI
        row(sweep, n=20, k=3, acc=0.7, cost=(250, 1.0, 300.0)),
    ]
    rows.append(row(sweep, n=50, k=3, acc=0.75, cost=(250, 3.0, 300.0)))  # no k = 0 at n = 50
    return rows


@pytest.fixture
def store_rows(tmp_path) -> ResultStore:
    store = ResultStore(str(tmp_path / "store"), "s")
    for r in known_rows():
        store.write_row(r)
    return store


def test_paired_contrasts_match_hand_computed_t_intervals(store_rows):
    contrasts = build_report([SweepRows.from_store(store_rows)]).contrasts.set_index(["train_size", "frozen_layers"])
    k3 = contrasts.loc[(100, 3)]
    half = T_975_DF2 * 0.001 / math.sqrt(3)  # diffs -0.002, -0.003, -0.001: sd 0.001
    assert k3["pairs"] == 3 and k3["mean_diff"] == pytest.approx(-0.002)
    assert (k3["ci_low"], k3["ci_high"]) == pytest.approx((-0.002 - half, -0.002 + half))
    k6 = contrasts.loc[(100, 6)]  # diffs -0.05, -0.07, -0.03: sd 0.02; the failed seed 3 plays no part
    assert k6["pairs"] == 3 and k6["ci_low"] == pytest.approx(-0.05 - T_975_DF2 * 0.02 / math.sqrt(3))
    # Unpaired (Welch) over the same runs, by its formula: far wider, because seed luck is shared.
    a, b = np.array(ACC_100[3]), np.array(ACC_100[0])
    va, vb = a.var(ddof=1) / 3, b.var(ddof=1) / 3
    df = (va + vb) ** 2 / (va**2 / 2 + vb**2 / 2)
    unpaired_half = t.ppf(0.975, df) * math.sqrt(va + vb)
    assert k3["unpaired_ci_high"] - k3["unpaired_ci_low"] == pytest.approx(2 * unpaired_half)
    assert k3["narrower_pct"] == pytest.approx(100 * (1 - half / unpaired_half))
    assert k3["narrower_pct"] > 97
    assert math.isnan(contrasts.loc[(20, 3), "ci_low"])  # one pair: no interval
    assert 50 not in contrasts.index.get_level_values(0)  # nothing to pair with


def test_retained_quality_and_its_bootstrap_interval(store_rows):
    retained = build_report([SweepRows.from_store(store_rows)]).retained.set_index(["train_size", "frozen_layers"])
    k3 = retained.loc[(100, 3)]
    assert k3["retained"] == pytest.approx((0.848 - 0.5) / (0.85 - 0.5))
    # Resampling 3 seeds as pairs, each all-one-seed resample has probability 1/27 > 2.5 %, and a ratio of
    # means lies between the per-seed ratios: the percentile CI spans exactly the per-seed extremes.
    per_seed = [(ak - 0.5) / (a0 - 0.5) for ak, a0 in zip(ACC_100[3], ACC_100[0])]
    assert (k3["ci_low"], k3["ci_high"]) == pytest.approx((min(per_seed), max(per_seed)))
    assert retained.loc[(100, 6), "retained"] == pytest.approx((0.8 - 0.5) / 0.35)  # 0.857: below 90 %
    assert retained.loc[(100, -1), "retained"] == pytest.approx((np.mean(ACC_100[-1]) - 0.5) / 0.35)


# n = 100: learned, then k = -1, 3, 6 in that order, each "within" one-sided at 1 - 0.55 × 0.05, the
# sequence's share of α at its full level, one look (results/settle.py).
T_Q_DF2 = float(t.ppf(1 - 0.55 * 0.05, 2))


def test_decision_sentences_and_table(store_rows):
    report = build_report([SweepRows.from_store(store_rows)])
    decisions = report.decisions.set_index("train_size")
    half = T_Q_DF2 * 0.001 / math.sqrt(3)  # k = 3: diffs -0.002, -0.003, -0.001
    assert (decisions.loc[100, "ci_low"], decisions.loc[100, "ci_high"]) == pytest.approx(
        (-0.002 - half, -0.002 + half)
    )
    assert decisions.loc[100, "sentence"] == (
        "d, n = 100: freeze the embeddings and the first 3 layers (k = 3) — shown within the 0.01 tolerance of full "
        "fine-tuning when it trains (95 % family-wise; tested from the least frozen depth: k=-1, k=3 within, stopped "
        "at k=6): accuracy 0.848 vs 0.850 on the same 3 seeds, paired difference -0.002 (its own one-sided bound "
        f"{-0.002 - half:.3f}, at 97.25 % unadjusted for choosing this depth); 0 of 3 seeds collapsed (answered one class "
        "everywhere, or scored at most "
        f"10 % of the way from the constant predictor's score to a perfect one) or diverged (at most {math.ceil(100 * (1 - (0.05 * 0.05 / 4) ** (1 / 3)))} % of seeds do, 95 % family-wise); it trains with 75 % fewer "
        "trainable parameters, 40 % less train time and 25 % less peak memory (undecided: k=6 (-0.050 when trained); "
        "7 seeds per arm would decide what is open) (left out: 1 failed)."
    )
    assert decisions.loc[100, "frozen_layers"] == 3 and decisions.loc[100, "k_retaining_90"] == 3
    assert decisions.loc[100, ["params_saved_pct", "time_saved_pct", "mem_saved_pct"]].tolist() == pytest.approx(
        [75.0, 40.0, 25.0]
    )
    assert decisions.loc[20, "sentence"] == (
        "d, n = 20: not yet shown that full fine-tuning beats the constant baseline by more than 0.01 here (1 trained "
        "seed: fewer than 3 trained seeds); no freezing advice — these seeds cannot say how many would, too few "
        "trained or their differences identical (a settle sweep under a new name and another split_seed runs as many "
        "as the question needs)."
    )
    assert decisions.loc[50, "sentence"] == (
        "d, n = 50: no full fine-tuning (k = 0) runs to compare with (none in the store), so no decision."
    )


def test_a_tighter_tolerance_admits_no_k_and_says_what_is_undecided(store_rows):
    decisions = build_report([SweepRows.from_store(store_rows)], tolerance=0.001).decisions.set_index("train_size")
    assert decisions.loc[100, "sentence"] == (  # k = -1's bound straddles -0.001: the sequence stops there
        "d, n = 100: fine-tune every layer: no k is shown within 0.001 of full fine-tuning at 3 trained pairs "
        "(undecided: k=-1 (+0.000 when trained); not tested, deeper than where the sequence stopped: k=3 (-0.002 "
        "when trained), k=6 "
        "(-0.050 when trained)); 15 seeds per arm would decide it if the spread stays as it is (a new settle sweep "
        "with settle: {tolerance: 0.001, max_seeds: 15} in place of `seeds:` and `tolerance:`, under a new name and another split_seed, so that its seeds "
        "are not the rows already seen: `freezesweep plan` prices it) "
        "(left out: 1 failed)."
    )
    assert pd.isna(decisions.loc[100, "frozen_layers"])


def test_a_looser_tolerance_asks_full_fine_tuning_to_beat_the_baseline_by_more(store_rows):
    """ "Learned" is a gain shown above the tolerance (the one boundary nothing learned is shown below): at
    0.25, full fine-tuning's +0.35 is bounded below by +0.21 only — open, so no advice. Before: learned at any
    gain above 0, and k = 6 advised (its interval above the tolerance) in a group not shown to learn it."""
    decisions = build_report([SweepRows.from_store(store_rows)], tolerance=0.25).decisions.set_index("train_size")
    assert decisions.loc[100, "learned"] == "undecided" and pd.isna(decisions.loc[100, "frozen_layers"])
    assert (
        "not yet shown that full fine-tuning beats the constant baseline by more than 0.25"
        in decisions.loc[100, "sentence"]
    )


def test_no_advice_from_identical_differences_or_where_nothing_is_learned(tmp_path):
    """The demo's n = 50 before: both runs at the majority class (0.516 and 0.520 against 0.509) and two
    identical differences gave "freeze the embeddings and the first 6 layers (95 % CI +0.004 to +0.004)".
    Seeds this near the baseline collapsed (a tenth of the way to a perfect score is 0.558): not trained
    seeds whose gain is below the tolerance, as an audit found such seeds break the bound's normality."""
    store = ResultStore(str(tmp_path), "demo")
    for k, accs in {0: [0.516, 0.512, 0.515, 0.511, 0.513], 6: [0.520, 0.516, 0.519, 0.515, 0.517]}.items():
        for seed, acc in enumerate(accs):  # k = 6 is 0.004 above k = 0 at every seed: zero spread
            store.write_row(row("demo", n=50, k=k, seed=seed, acc=acc, majority_baseline=0.509, cost=(1000, 1.0, 10.0)))
    report = build_report([SweepRows.from_store(store)])
    (decision,) = report.decisions.to_dict("records")
    assert decision["frozen_layers"] is None or pd.isna(decision["frozen_layers"])
    assert decision["learned"] == "undecided" and decision["sentence"].startswith(
        "d, n = 50: all 5 seeds of full fine-tuning collapsed (answered one class everywhere, or scored at most "
        "10 % of the way from the constant "
        "predictor's score to a perfect one): nothing learned as far as they show, but 5 seeds cannot show it"
    )
    assert "no freezing advice" in decision["sentence"] and report.retained.empty  # no ratio of two near-zero gains


def test_costs_savings_and_frontier(store_rows):
    costs = build_report([SweepRows.from_store(store_rows)]).costs
    at_100 = costs[costs["train_size"] == 100].set_index("frozen_layers")
    assert at_100.loc[6, "time_saved_pct"] == pytest.approx(60.0)
    assert at_100.loc[-1, "params_saved_pct"] == pytest.approx(10.0)
    # mean accuracy / train time: k6 0.800/4 s, k3 0.848/6 s, k-1 0.850/9 s, k0 0.850/10 s (not faster)
    assert at_100["on_frontier"].to_dict() == {-1: True, 0: False, 3: True, 6: True}


def test_report_files_tables_and_completeness(store_rows, tmp_path):
    status = pd.DataFrame(
        [
            {"axis": "frozen_layers", "value": "6", "done": 3, "failed": 1, "missing": 0},
            {"axis": "total", "value": "", "done": 14, "failed": 1, "missing": 2},
        ]
    )
    write_report([SweepRows.from_store(store_rows, status)], str(tmp_path / "out"))
    markdown = (tmp_path / "out" / "report.md").read_text()
    page = (tmp_path / "out" / "index.html").read_text()
    assert "s: INCOMPLETE — 14 of 17 cells done, 1 failed, 2 missing (not run yet, or running now)" in markdown
    assert "CUDA out of memory" in markdown and "CUDA out of memory" in page
    low = -0.002 - T_Q_DF2 * 0.001 / math.sqrt(3)
    decision_row = [
        "d",
        "100",
        "learned",
        "3",
        "3",
        "0.8500",
        "0.8480",
        "-0.0020",
        f"{low:.4f}",
        "0/3",
        f"{math.ceil(100 * (1 - (0.05 * 0.05 / 4) ** (1 / 3)))} %",  # a bound on a share of seeds, as the sentence says it
        "k=-1, k=3",
        "",
        "k=6",
        "",
        "75.0 %",
        "40.0 %",
        "25.0 %",
        "7",  # seeds to decide: k = 6 is open
    ]
    tables = markdown_rows(markdown)
    assert decision_row in tables
    # headed in words, the decision's sentences before its table
    assert tables[0][:4] == ["Dataset", "Train size", "Full fine-tuning", "Freeze k"]
    assert markdown.index("d, n = 100: freeze the embeddings") < markdown.index("| Dataset")
    assert (
        "k = 3 is the largest whose mean keeps ≥ 90 % of full fine-tuning's gain — a point estimate, evidence"
        in markdown
    )
    assert re.search(r"Pairing makes the CI \d+ % narrower", page)
    assert len(re.findall(r'<img [^>]*src="data:image/png;base64,', page)) == 5
    assert not re.search(r"https?://", page)  # self-contained: nothing fetched from anywhere
    assert sorted(p.name for p in (tmp_path / "out" / "figures").iterdir()) == [
        "accuracy.png",
        "contrasts.png",
        "cost.png",
        "heatmap.png",
        "retained.png",
    ]


def markdown_rows(markdown: str) -> list[list[str]]:
    return [
        [cell.strip() for cell in line.strip("|").split("|")] for line in markdown.splitlines() if line.startswith("|")
    ]


def test_two_sweeps_side_by_side(tmp_path):
    stores = []
    for name in ("base", "large"):
        stores.append(ResultStore(str(tmp_path), name))
        for r in known_rows(name):
            stores[-1].write_row(r)
    report = build_report([SweepRows.from_store(s) for s in stores])
    sentences = report.decisions["sentence"].tolist()
    assert len(sentences) == 6 and sentences[0].startswith("base · d, n = 20: ")
    assert any(s.startswith("large · d, n = 100: freeze the embeddings and the first 3 layers") for s in sentences)
    assert set(report.appendix["sweep"]) == {"base", "large"}


def test_a_sweep_with_nothing_finished_still_reports(tmp_path):
    store = ResultStore(str(tmp_path), "s")
    store.write_row(row(k=0, status="failed", error="boom"))
    status = pd.DataFrame([{"axis": "total", "value": "", "done": 0, "failed": 1, "missing": 3}])
    report = write_report([SweepRows.from_store(store, status)], str(tmp_path / "out"))
    assert report.decisions.empty and report.figures == {}
    assert "0 of 4 cells done, 1 failed, 3 missing" in (tmp_path / "out" / "index.html").read_text()


def _stored_fixed_grid(tmp_path, seeds: int, name: str = "s", **more) -> tuple[list, ResultStore]:
    """A fixed grid (k 0 and 3, n = 100) stored as a launch stores it, no rows yet: its cells and store."""
    from freezesweep.orchestrator.plan import build_grid
    from freezesweep.orchestrator.spec import SweepSpec, TrainingSpec
    from freezesweep.orchestrator.sweeps import resolve_here

    spec = SweepSpec(
        **{
            "name": name,
            "model": "m",
            "datasets": ["d"],
            "train_sizes": [100],
            "frozen_layers": [0, 3],
            "seeds": list(range(seeds)),
            "training": TrainingSpec(precision="fp32", select_metric="accuracy"),  # resolved, as a launch stores it
            "store": str(tmp_path),
            **more,
        }
    )
    store = ResultStore(str(tmp_path), name)
    store.write_spec(spec.to_yaml())
    return build_grid(resolve_here(spec)), store


def test_cli_report_names_what_is_missing(tmp_path):
    cells, store = _stored_fixed_grid(tmp_path, 4)
    for cfg in cells:
        if cfg.seed < 3:  # seed 3 has not run yet
            store.write_row(
                row(
                    k=cfg.frozen_layers,
                    seed=cfg.seed,
                    acc=ACC_100[cfg.frozen_layers][cfg.seed],
                    cost=COST_100[cfg.frozen_layers],
                    trial_id=cfg.trial_id,
                )
            )
    cli = [
        sys.executable,
        "-m",
        "freezesweep.orchestrator.cli",
        "report",
        "s",
        "--store",
        str(tmp_path),
        "--out",
        str(tmp_path / "out"),
    ]
    done = subprocess.run(cli, capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    # a running fixed grid is not looked at: its intervals are shared by one look, when it is complete.
    # Before: "freeze the embeddings and the first 3 layers", from 3 of its 4 seeds
    assert "d, n = 100: the grid is not all in here yet (6 of 8 cells in: running now, or interrupted" in done.stdout
    assert "s: INCOMPLETE — 6 of 8 cells done, 0 failed, 2 missing" in done.stdout
    for cfg in cells:
        if cfg.seed == 3:
            store.write_row(
                row(
                    k=cfg.frozen_layers,
                    seed=3,
                    acc={0: 0.82, 3: 0.818}[cfg.frozen_layers],
                    cost=COST_100[cfg.frozen_layers],
                    trial_id=cfg.trial_id,
                )
            )
    done = subprocess.run(cli, capture_output=True, text=True, cwd=REPO)
    assert "d, n = 100: freeze the embeddings and the first 3 layers (k = 3)" in done.stdout
    assert "paired difference -0.002" in (tmp_path / "out" / "report.md").read_text()


needs_chromium = pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed")
# Headless, offline: no background connections to refused hosts (the machine's network is closed).
CHROMIUM = [
    "chromium",
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WIDTH = 1280  # a laptop's browser window


@needs_chromium
def test_chromium_renders_the_figures(store_rows, tmp_path):
    from PIL import Image

    write_report([SweepRows.from_store(store_rows)], str(tmp_path / "out"))
    shot = tmp_path / "shot.png"
    subprocess.run(
        [
            *CHROMIUM,
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}",
            f"--window-size={WIDTH},2400",
            (tmp_path / "out" / "index.html").as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=True,
    )
    pixels = np.asarray(Image.open(shot).convert("RGB"))
    assert pixels.shape[:2] == (2400, WIDTH)
    # The decision's text and table sit on top; the figures below it are what a broken <img> would lose:
    # a rendered matplotlib figure has many colours (viridis, antialiased lines and text).
    lower = pixels[800:].reshape(-1, 3)
    assert len(np.unique(lower, axis=0)) > 500
    assert (lower != 255).any(axis=1).mean() > 0.05  # not a white page


# Measured in the page as Chromium lays it out: every heading word (a column's own name: each piece up to
# an underscore) against the room its cell gives it; a word wider than its cell is one the browser breaks.
MEASURE = """<script>
const probe = document.createElement("span");
probe.style.cssText = "position:absolute;visibility:hidden;white-space:nowrap";
document.body.appendChild(probe);
const broken = [];
for (const th of document.querySelectorAll("th")) {
  const style = getComputedStyle(th);
  const room = th.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  for (const part of th.querySelectorAll(".label, .column")) {
    probe.style.font = getComputedStyle(part).font;
    const words = part.classList.contains("column") ? part.textContent.split(/(?<=_)/) : part.textContent.split(" ");
    for (const word of words) {
      probe.textContent = word;
      const width = probe.getBoundingClientRect().width;
      if (width > room + 0.5) broken.push([th.textContent, word, Math.round(width), Math.round(room)]);
    }
  }
}
const decision = document.querySelector("section.decision .table");
const result = document.createElement("pre");
result.id = "measured";
result.textContent = JSON.stringify({
  broken,
  headings: [...document.querySelectorAll("section.decision th .label")].map(e => e.textContent),
  page_overflow: document.documentElement.scrollWidth - window.innerWidth,
  decision_overflow: decision.scrollWidth - decision.clientWidth,
});
document.body.appendChild(result);
</script>"""


@needs_chromium
def test_headings_are_words_that_never_break_inside_at_1280_px(store_rows, tmp_path):
    """The issue's "train_siz|e", "frozen_laye|rs": headings in words, each as wide as its column needs, the
    column's own name beside it; the decision's table fits a 1280 px window without scrolling."""
    write_report([SweepRows.from_store(store_rows)], str(tmp_path / "out"))
    page = (tmp_path / "out" / "index.html").read_text()
    measured_page = tmp_path / "measured.html"
    measured_page.write_text(page.replace("</body>", MEASURE + "</body>"))
    dom = subprocess.run(
        [
            *CHROMIUM,
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--window-size={WIDTH},2000",
            "--dump-dom",
            measured_page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    measured = json.loads(html.unescape(re.search(r'<pre id="measured">(.*?)</pre>', dom, re.S).group(1)))
    assert measured["broken"] == []
    headings = measured["headings"]
    assert headings[:2] == ["Dataset", "Train size"]
    assert not any("_" in h for h in headings), headings  # words, not the store's column names
    assert measured["page_overflow"] <= 0 and measured["decision_overflow"] <= 0


def test_the_report_shows_each_rows_selected_metric(tmp_path):
    """An STS-B sweep selects Pearson: the decision, contrasts and retained quality are on Pearson (the mean
    prediction's 0.0 is the baseline), not on accuracy, which regression rows do not have."""
    store = ResultStore(str(tmp_path / "store"), "sts")
    for k, scores in {0: [0.80, 0.85, 0.90], 3: [0.798, 0.847, 0.899]}.items():
        for seed, score in enumerate(scores):
            store.write_row(regression_row(k, seed, score, sweep="sts", dataset="stsb", cost=COST_100[k]))
    report = build_report([SweepRows.from_store(store)])
    (decision,) = report.decisions.to_dict("records")
    assert decision["metric"] == "pearson" and decision["frozen_layers"] == 3
    assert "when it trains (95 % family-wise" in decision["sentence"]
    assert "): pearson 0.848 vs 0.850 on the same 3 seeds" in decision["sentence"]
    retained = report.retained.iloc[0]
    assert retained["baseline"] == 0.0 and retained["retained"] == pytest.approx(0.848 / 0.85)
    assert report.appendix.set_index("frozen_layers").loc[3, "metric"] == "pearson"


def method_rows(sweep="s") -> list[dict]:
    """known_rows plus LoRA (rank 8) and probe rows at n = 100 on the same seeds."""
    rows = known_rows(sweep)
    for seed, (lora_acc, probe_acc) in enumerate([(0.82, 0.78), (0.84, 0.78), (0.86, 0.79)]):
        rows.append(
            row(
                sweep,
                k=None,
                seed=seed,
                acc=lora_acc,
                cost=(50, 8.0, 350.0),
                method="lora",
                lora_rank=8,
                trial_id=f"{sweep}-lora-{seed}",
                wall_time_s=9.0,
            )
        )
        rows.append(
            row(
                sweep,
                k=None,
                seed=seed,
                acc=probe_acc,
                cost=(33, 0.1, 200.0),
                method="probe",
                trial_id=f"{sweep}-probe-{seed}",
                wall_time_s=1.0,
            )
        )
    return rows


def test_methods_side_by_side_and_the_layer_analysis_unchanged(tmp_path, store_rows):
    store = ResultStore(str(tmp_path / "methods"), "s")
    for r in method_rows():
        store.write_row(r | {"method": r.get("method") or "freeze"})
    report = build_report([SweepRows.from_store(store)])
    freeze_only = build_report([SweepRows.from_store(store_rows)])
    pd.testing.assert_frame_equal(report.contrasts, freeze_only.contrasts)  # LoRA/probe rows are not "k" rows
    # the decision has every method's claims, as settle's rounds decide them (Holm's family holds them)
    at_100, before = (r.decisions.set_index("train_size").loc[100] for r in (report, freeze_only))
    assert at_100["frozen_layers"] == before["frozen_layers"] == 3
    assert at_100["undecided"] == "k=6, lora r=8, probe" and before["undecided"] == "k=6"
    assert "lora r=8 (-0.010 when trained), probe (-0.067 when trained)" in at_100["sentence"]
    assert at_100["ci_low"] < before["ci_low"]  # the sequence's share gives the other methods' claims theirs
    table = report.methods[report.methods["train_size"] == 100].set_index("variant")
    # freeze by how much it freezes (0, then the embeddings only, then layers), LoRA by rank, then the probe
    assert list(table.index) == ["freeze k=0", "freeze k=-1", "freeze k=3", "freeze k=6", "lora r=8", "probe"]
    assert table.loc["lora r=8", "score"] == pytest.approx(0.84) and table.loc["probe", "seeds"] == 3
    lo, hi = table.loc["lora r=8", ["ci_low", "ci_high"]]
    assert (lo, hi) == pytest.approx((0.84 - T_975_DF2 * 0.02 / math.sqrt(3), 0.84 + T_975_DF2 * 0.02 / math.sqrt(3)))
    freeze = table[table["method"] == "freeze"]
    assert freeze["best_in_method"].tolist() == (freeze["score"] == freeze["score"].max()).tolist()
    assert not table.loc["freeze k=6", "best_in_method"] and table.loc[["lora r=8", "probe"], "best_in_method"].all()
    section = next(s for s in report.sections if s.title == "Methods side by side")
    line = next(p for p in section.paragraphs if p.startswith("d, n = 100:"))
    assert re.fullmatch(r"d, n = 100: freeze k=(0|-1) 0\.850; lora r=8 0\.840 in 9 s; probe 0\.783 in 1 s", line), line
    assert "methods" in report.figures and report.figures["methods"].startswith(b"\x89PNG")


def test_a_method_shown_within_where_no_depth_is_leads_the_answer(tmp_path):
    """A walk-through: "fine-tune every layer" where the probe was shown within the tolerance, at a fifth
    of the train time; the report said nothing of it."""
    store = ResultStore(str(tmp_path / "probe"), "s")
    full, probe = [0.80, 0.85, 0.90, 0.82, 0.88], [0.81, 0.862, 0.905, 0.828, 0.893]
    for seed, (a, b) in enumerate(zip(full, probe)):
        store.write_row(row(k=0, seed=seed, acc=a, cost=COST_100[0], method="freeze"))
        store.write_row(row(k=6, seed=seed, acc=a - 0.1 - 0.01 * seed, cost=COST_100[6], method="freeze"))
        store.write_row(
            row(k=None, seed=seed, acc=b, cost=(33, 0.1, 200.0), method="probe", trial_id=f"p{seed}", wall_time_s=1.0)
        )
    [sentence] = build_report([SweepRows.from_store(store)]).decisions["sentence"]
    assert sentence.startswith("d, n = 100: fine-tune every layer, or use the probe (below): "), sentence
    assert "; the probe is shown within the 0.01 tolerance of full fine-tuning when it trains (95 % family-wise)" in (
        sentence
    )
    assert "paired difference +0.010" in sentence
    # an audit: its bound came without the level it was computed at, where a depth's gives its own
    assert re.search(
        r"paired difference \+0\.010 \(its own one-sided bound [+-]0\.\d{3}, at 99\.\d+ %, the level Holm's", sentence
    )


def test_the_descriptive_sections_say_which_seeds_they_read_and_that_their_intervals_are_unadjusted(store_rows):
    """An audit: the contrasts (collapses at their scores, diverged seeds out, two-sided 95 % per depth)
    gave one depth −0.066 beside its decision's −0.023 (trained pairs only), neither saying why."""
    from freezesweep.results.report import render_html

    report = build_report([SweepRows.from_store(store_rows)])
    page = render_html("r", report)
    for title in ("Paired contrasts against full fine-tuning", "Retained quality"):
        section = next(s for s in report.sections if s.title == title)
        assert "Descriptive, not the decision's numbers" in section.paragraphs[0]
        assert "a seed that collapsed at its score (diverged seeds are out)" in (section.paragraphs[0])
        assert "unadjusted for the other depths, methods and looks" in section.paragraphs[0]
        assert html.escape(section.paragraphs[0]) in page
    for heading in ("Paired ok seeds (collapses in)", "95 % CI low, unadjusted"):
        assert html.escape(heading.replace(" %", "\u00a0%")) in page  # a heading's "95 %" never breaks


def test_summary_shows_methods_and_their_own_axes():
    from freezesweep.results.query import summary

    table = summary(pd.DataFrame([r | {"method": r.get("method") or "freeze"} for r in method_rows()]))
    assert list(table.columns[:5]) == ["dataset", "method", "train_size", "frozen_layers", "lora_rank"]
    at_100 = table[table["train_size"] == 100]
    shown = [
        [m, None if pd.isna(k) else int(k), None if pd.isna(r) else int(r)]
        for m, k, r in at_100[["method", "frozen_layers", "lora_rank"]].values
    ]
    assert shown == [
        ["freeze", -1, None],
        ["freeze", 0, None],
        ["freeze", 3, None],
        ["freeze", 6, None],
        ["lora", None, 8],
        ["probe", None, None],
    ]
    freeze_only = summary(pd.DataFrame(known_rows()))
    assert list(freeze_only.columns[:3]) == ["dataset", "train_size", "frozen_layers"]  # as before methods


def test_the_sentence_pairs_paired_numbers_and_says_the_collapses(tmp_path):
    """k = 3's seed 3 collapsed (exactly the majority baseline) and k = 0's seed 4 failed: the scores in
    the sentence are means over the seeds where both trained — the same seeds as the difference. Before:
    score_k and score_0 were each arm's mean over its own seeds, beside a difference over others."""
    store = ResultStore(str(tmp_path), "s")
    accs = {0: [0.80, 0.85, 0.90, 0.84, None], 3: [0.798, 0.847, 0.899, 0.5, 0.95]}
    for k, values in accs.items():
        for seed, acc in enumerate(values):
            store.write_row(row(k=k, seed=seed, acc=acc, status="failed" if acc is None else "ok", cost=COST_100[k]))
    decision = build_report([SweepRows.from_store(store)]).decisions.iloc[0]
    assert (decision["score_k"], decision["score_0"]) == pytest.approx((np.mean([0.798, 0.847, 0.899]), 0.85))
    assert decision["collapsed"] == "1/4" and decision["pairs"] == 3
    assert (
        "on the same 3 seeds" in decision["sentence"]
        and "1 of 4 seeds collapsed (answered one class everywhere, or scored at most 10 % of the way"
        in decision["sentence"]
    )


def test_the_cost_rows_panels_keep_their_labels_to_themselves(store_rows):
    """Seen in Chromium at 1280 px: the cost row's four panels overlapped their neighbours' y-labels."""
    from freezesweep.results.figures import cost_figure

    fig = cost_figure(build_report([SweepRows.from_store(store_rows)]).costs)
    renderer = fig.canvas.get_renderer()
    fig.canvas.draw()
    row = sorted(fig.axes, key=lambda ax: ax.get_position().x0)
    for left, right in zip(row, row[1:]):
        assert left.get_tightbbox(renderer).x1 <= right.get_tightbbox(renderer).x0


def test_a_group_where_freezing_is_shown_to_cost_says_to_fine_tune_every_layer(tmp_path):
    """Every depth of the sequence is shown worse: the answer is final (no seed could change it), so the
    sentence says what to do instead of asking for seeds."""
    store = ResultStore(str(tmp_path), "s")
    for k, accs in {0: [0.80, 0.85, 0.90], 2: [0.70, 0.74, 0.81]}.items():
        for seed, acc in enumerate(accs):
            store.write_row(row("s", n=100, k=k, seed=seed, acc=acc, cost=(1000, 1.0, 10.0)))
    (decision,) = build_report([SweepRows.from_store(store)]).decisions.to_dict("records")
    assert decision["worse"] == "k=2" and pd.isna(decision["frozen_layers"])
    assert decision["sentence"] == (
        "d, n = 100: fine-tune every layer: freezing costs more than 0.01 here — the least frozen depth (k=2) is "
        "shown worse than full fine-tuning by more than the tolerance, when it trains or in mean with its collapses "
        "(95 % family-wise) (worse than full fine-tuning: k=2)."
    )


def test_a_depth_that_stopped_on_an_estimate_is_no_claim_that_freezing_costs(tmp_path):
    """k = 2's upper bound at a last look's level is below −0.01 (it runs no more seeds), but Holm does not
    show it worse (t = −6.2 against 6.96): the sentence says what stopped it, and claims nothing."""
    store = ResultStore(str(tmp_path), "s")
    x = 0.01117  # the differences' spread: −0.05 ± x, a t of (−0.05 + 0.01) / (x / √3) ≈ −6.2
    for k, accs in {0: [0.80, 0.85, 0.90], 2: [0.80 - 0.05 - x, 0.85 - 0.05, 0.90 - 0.05 + x]}.items():
        for seed, acc in enumerate(accs):
            store.write_row(row("s", n=100, k=k, seed=seed, acc=acc, cost=(1000, 1.0, 10.0)))
    (decision,) = build_report([SweepRows.from_store(store)]).decisions.to_dict("records")
    assert decision["undecided"] == "k=2" and decision["worse"] == "" and pd.isna(decision["frozen_layers"])
    assert decision["sentence"].startswith(
        "d, n = 100: fine-tune every layer: no k is shown within 0.01 of full fine-tuning, and the least frozen "
        "depth (k=2) is undecided (its seeds so far put it well below −0.01 when it trains; an estimate, not a claim)"
    )
    assert "costs more" not in decision["sentence"]


def test_a_fixed_grid_with_a_failed_cell_says_so_not_that_it_is_running(tmp_path):
    """Before: a fixed grid whose last cell failed for good said "the grid is still running here" forever."""
    from freezesweep.orchestrator import api

    cells, store = _stored_fixed_grid(tmp_path, 3)
    for cfg in cells:
        k, seed = cfg.frozen_layers, cfg.seed
        failed = dict(status="failed", error="CUDA out of memory") if (k, seed) == (3, 2) else {}
        store.write_row(row(k=k, seed=seed, acc=ACC_100[k][seed], trial_id=cfg.trial_id) | failed)
    (sentence,) = api.decide("s", store=str(tmp_path)).frame["sentence"]
    assert sentence.startswith(
        "d, n = 100: the grid is not complete here: 1 cell failed, which `freezesweep resume` runs again "
        "(5 of 6 cells in): a fixed grid is decided once"
    )
    from freezesweep.orchestrator.spec import SpecError

    with pytest.raises(SpecError, match="tolerance: -0.01 is not above 0"):  # "worse by more than -0.01"
        api.decide("s", store=str(tmp_path), tolerance=-0.01)


def test_a_fixed_grid_waits_for_its_other_methods_cells_too(tmp_path):
    """The probe's claims are the group's (Holm's family holds them): decided before its cells are in, the
    group would be looked at twice."""
    from freezesweep.orchestrator import api

    cells, store = _stored_fixed_grid(tmp_path, 3, methods=["freeze", "probe"])
    for cfg in cells:
        k, seed = cfg.frozen_layers, cfg.seed
        if cfg.method == "freeze":
            store.write_row(row(k=k, seed=seed, acc=ACC_100[k][seed], trial_id=cfg.trial_id))
    (sentence,) = api.decide("s", store=str(tmp_path)).frame["sentence"]
    assert sentence.startswith(
        "d, n = 100: the grid is not all in here yet (6 of 9 cells in: running now, or interrupted"
    ), sentence
    for cfg in (c for c in cells if c.method == "probe"):
        store.write_row(row(k=None, seed=cfg.seed, acc=0.7, trial_id=cfg.trial_id, method="probe"))
    (sentence,) = api.decide("s", store=str(tmp_path)).frame["sentence"]
    assert sentence.startswith("d, n = 100: freeze the embeddings and the first 3 layers (k = 3)"), sentence
    assert "worse than full fine-tuning: probe" in sentence or "undecided: probe" in sentence


def test_a_fixed_grid_answers_the_tolerance_its_spec_asked_and_no_other(tmp_path):
    """Before: `report --tolerance` read a fixed grid at any tolerance after its rows were seen, each making
    another depth the first false claim (a review's simulation: 2.4 % false "within" at one tolerance, 4.3 %
    at two, 8.7 % at five, against 2.25 %). The spec's `tolerance:` is the question; side by side,
    each sweep answers its own."""
    from freezesweep.orchestrator import api
    from freezesweep.orchestrator.spec import SpecError

    for name, asked in (("s", 0.05), ("t", None)):
        cells, store = _stored_fixed_grid(tmp_path, 3, name, **({"tolerance": asked} if asked else {}))
        for cfg in cells:
            k, seed = cfg.frozen_layers, cfg.seed
            store.write_row(row(name, k=k, seed=seed, acc=ACC_100[k][seed], trial_id=cfg.trial_id))
    (sentence,) = api.decide("s", store=str(tmp_path)).frame["sentence"]
    assert "0.05 tolerance" in sentence or "within 0.05" in sentence, sentence
    assert api.decide("s", store=str(tmp_path), tolerance=0.05).frame["sentence"][0] == sentence
    with pytest.raises(SpecError, match=r"asked tolerance 0.05 \(its spec's `tolerance:`.*voids the confidence"):
        api.decide("s", store=str(tmp_path), tolerance=0.01)
    (default,) = api.decide("t", store=str(tmp_path)).frame["sentence"]
    assert "0.01" in default
    # side by side, each answers its own question
    both = api.decide(["s", "t"], store=str(tmp_path)).frame.set_index("sweep")["sentence"]
    assert (both["s"], both["t"]) == (f"s · {sentence}", f"t · {default}")


def test_several_sweeps_price_each_open_group_under_its_sweeps_name(tmp_path):
    """A walk-through: `report s3 s4` named each decision "s3 · glue/sst2, n = 40: …" and its price
    "glue/sst2, n = 40: a new settle sweep …", whose sweep a reader could not tell."""
    from freezesweep.orchestrator import api

    for name in ("s", "t"):
        cells, store = _stored_fixed_grid(tmp_path, 3, name, tolerance=0.001)
        for cfg in cells:
            k, seed = cfg.frozen_layers, cfg.seed
            store.write_row(row(name, k=k, seed=seed, acc=ACC_100[k][seed], trial_id=cfg.trial_id, wall_time_s=5.0))
    decisions = api.decide(["s", "t"], store=str(tmp_path)).frame
    lines = api.budget_prices(decisions, ["s", "t"], str(tmp_path))
    assert [line.split(": ")[0] for line in lines] == ["s · d, n = 100", "t · d, n = 100"]
    assert [s.split(": ")[0] for s in decisions["sentence"]] == ["s · d, n = 100", "t · d, n = 100"]
    (alone,) = api.budget_prices(decisions[decisions["sweep"] == "s"], "s", str(tmp_path))
    assert alone.startswith("d, n = 100: a new settle sweep")  # one sweep: as before


def test_an_open_fixed_grid_group_is_priced_as_the_settle_sweep_it_asks_for(tmp_path):
    """Before: only a settle sweep's open group was priced; a fixed grid's said "`freezesweep plan` prices it"
    and the report printed no price (docs/report.md says the CLI prices it)."""
    from freezesweep.orchestrator import api

    cells, store = _stored_fixed_grid(tmp_path, 3, tolerance=0.001)
    for cfg in cells:
        k, seed = cfg.frozen_layers, cfg.seed
        store.write_row(row(k=k, seed=seed, acc=ACC_100[k][seed], trial_id=cfg.trial_id, wall_time_s=COST_100[k][1]))
    decisions = api.decide("s", store=str(tmp_path)).frame
    budget = int(decisions["decided_at_seeds"][0])
    (line,) = api.budget_prices(decisions, "s", str(tmp_path))
    # k = 0 at 10 s, k = 3 at 6 s a trial: the budget's seeds of both arms, at most
    hours = budget * (10.0 + 6.0) / 3600
    assert line == (
        f"d, n = 100: a new settle sweep with settle.max_seeds {budget} runs at most {2 * budget} trials for this "
        f"size, about {hours:,.2f} trial-hours at the measured times (`freezesweep plan` on its spec prices the whole sweep)"
    )


@pytest.mark.parametrize("seeds", [1, 3])
def test_full_fine_tuning_at_the_constant_predictor_on_every_seed_is_said_in_good_grammar(tmp_path, seeds):
    """Before: "all 1 seeds of full fine-tuning predicted one class … 1 seeds cannot show it"."""
    store = ResultStore(str(tmp_path), "s")
    for seed in range(seeds):
        for k in (0, 2):
            store.write_row(row(k=k, seed=seed, acc=MAJORITY))
    (decision,) = build_report([SweepRows.from_store(store)]).decisions.to_dict("records")
    said = "the one seed" if seeds == 1 else f"all {seeds} seeds"
    shows = "it shows, but one seed" if seeds == 1 else f"they show, but {seeds} seeds"
    assert decision["sentence"].startswith(
        f"d, n = 100: {said} of full fine-tuning collapsed (answered one class everywhere, or scored at most "
        "10 % of the way from the constant "
        f"predictor's score to a perfect one): nothing learned as "
        f"far as {shows} cannot show it at 95 % family-wise (a new grid of "
    )
    # a walk-through: the fixed grid's hint, alone of them, did not say its seeds must be new ones
    assert "seeds, every seed collapsed, would, under a new name and another split_seed" in (decision["sentence"])
    # the budget it names is the table's too (a docs walk-through: the sentence said 8, "Seeds to decide" –)
    assert f"(a new grid of {decision['decided_at_seeds']} seeds, every seed collapsed" in decision["sentence"]


def test_an_open_settle_group_with_rounds_left_says_to_go_on_not_to_start_anew(tmp_path):
    """A walk-through: a settle sweep read mid-run (or stopped) was told "a new settle sweep with
    settle.max_seeds 8", below its own budget of 10, which its rounds were still running."""
    from freezesweep.results.settle import SettleRule

    store = ResultStore(str(tmp_path), "s")
    for k, accs in {0: [0.80, 0.85, 0.90], 2: [0.795, 0.835, 0.905]}.items():
        for seed, acc in enumerate(accs):
            store.write_row(row(k=k, seed=seed, acc=acc, cost=(1000, 1.0, 10.0)))
    settle = (SettleRule(max_seeds=10), 4, {})
    (decision,) = decisions([SweepRows.from_store(store, rule=settle)]).to_dict("records")
    assert decision["learned"] == "undecided"  # at its first look: whether full fine-tuning learns is open
    assert (
        "this sweep's own rounds go on, up to settle.max_seeds 10 seeds per arm (`freezesweep resume`"
        in (decision["sentence"])
    )
    assert "a new settle sweep" not in decision["sentence"] and pd.isna(decision["decided_at_seeds"])
    at_budget = (SettleRule(max_seeds=3), 1, {})  # its budget spent: a new sweep is the next step
    (spent,) = decisions([SweepRows.from_store(store, rule=at_budget)]).to_dict("records")
    assert "own rounds go on" not in spent["sentence"] and "a new settle sweep" in spent["sentence"]


def test_the_other_methods_in_every_state_of_the_answer(tmp_path):
    """A diff review: a probe "not tested" (whether full fine-tuning learns still open) crashed the report
    (sorted as a depth); a probe near its boundary left the depths without a budget ("these seeds cannot
    say how many would")."""
    store = ResultStore(str(tmp_path / "open"), "s")
    for seed, a in enumerate([0.49, 0.535, 0.52]):
        store.write_row(row(k=0, seed=seed, acc=a, method="freeze"))
        store.write_row(row(k=2, seed=seed, acc=a, method="freeze"))
        store.write_row(row(k=None, seed=seed, acc=a, method="probe", trial_id=f"p{seed}"))
    (record,) = decisions([SweepRows.from_store(store)]).to_dict("records")
    assert record["learned"] == "undecided" and record["not_tested"] == "k=2, probe"
    store = ResultStore(str(tmp_path / "near"), "s")
    full, k2, probe = [0.80, 0.85, 0.90, 0.82, 0.88], [-0.004, -0.012, 0.004, -0.010, 0.002], [0, -0.02, -0.005, -0.018]
    for seed, a in enumerate(full):
        store.write_row(row(k=0, seed=seed, acc=a, method="freeze"))
        store.write_row(row(k=2, seed=seed, acc=a + k2[seed], method="freeze"))
        acc = a + (probe + [-0.008])[seed]
        store.write_row(row(k=None, seed=seed, acc=acc, method="probe", trial_id=f"p{seed}"))
    (record,) = decisions([SweepRows.from_store(store)]).to_dict("records")
    budget = record["decided_at_seeds"]  # 9 without the probe; its claims' share of α makes it 10
    assert record["undecided"] == "k=2, probe" and budget == 10
    assert f"{budget} seeds per arm would decide it" in record["sentence"]


def test_a_settle_group_with_a_failed_seed_or_rounds_left_is_priced_by_no_new_sweep(tmp_path):
    """A diff review: its resume runs the failed seed again (and looks at 5), yet the sentence asked for a
    new settle sweep of 20 seeds; a group with rounds left still had a new sweep's budget to price."""
    from freezesweep.results.settle import SettleRule

    store = ResultStore(str(tmp_path), "s")
    for seed, (a, b) in enumerate(zip([0.80, 0.85, 0.90, 0.82, 0.88], [0.80, 0.83, 0.915, 0.815, None])):
        store.write_row(row(k=0, seed=seed, acc=a))
        store.write_row(row(k=2, seed=seed, acc=b, status="ok" if b else "failed"))
    rule = SettleRule(max_seeds=5)
    (record,) = decisions([SweepRows.from_store(store, rule=(rule, rule.looks, {}))]).to_dict("records")
    assert "this sweep's own rounds go on, up to settle.max_seeds 5" in record["sentence"]
    assert record["decided_at_seeds"] is None or pd.isna(record["decided_at_seeds"])


def test_collapses_its_own_rounds_cannot_show_ask_for_a_new_sweep(tmp_path):
    """A diff review: "8 seeds … would; this sweep's own rounds go on, up to settle.max_seeds 6"."""
    from freezesweep.results.settle import SettleRule

    store = ResultStore(str(tmp_path), "s")
    for seed in range(3):
        store.write_row(row(k=0, seed=seed, acc=MAJORITY))
    said = {}
    for most in (6, 10):
        rule = SettleRule(max_seeds=most)
        (record,) = decisions([SweepRows.from_store(store, rule=(rule, rule.looks, {}))]).to_dict("records")
        said[most] = record["sentence"]
    assert "a new settle sweep with settle.max_seeds 8" in said[6] and "own rounds go on" not in said[6]
    assert "own rounds go on, up to settle.max_seeds 10" in said[10]


def test_a_depth_whose_seeds_stopped_says_why_beside_the_advice(tmp_path):
    """A walk-through: "(undecided: k=6 (-0.236 when trained))", where the decision had why it runs no more
    seeds (docs/settle.md promises the sentence says it)."""
    store = ResultStore(str(tmp_path), "s")
    x = 0.01117  # as in the test above: hopeless by its own bound, not worse by Holm's
    scores = {0: [0.80, 0.85, 0.90], 2: [0.801, 0.851, 0.899], 6: [0.75 - x, 0.80, 0.85 + x]}
    for k, accs in scores.items():
        for seed, acc in enumerate(accs):
            store.write_row(row(k=k, seed=seed, acc=acc, cost=(1000, 1.0, 10.0)))
    (decision,) = decisions([SweepRows.from_store(store)]).to_dict("records")
    assert decision["frozen_layers"] == 2 and decision["undecided"] == "k=6"
    assert (
        "(undecided: k=6 (-0.050 when trained: its seeds so far put it well below −0.01 when it trains; an "
        "estimate, not a claim))" in (decision["sentence"])
    )


def test_a_grid_without_a_frozen_depth_says_so(tmp_path):
    """The review: a grid of full fine-tuning alone (k = 0 beside LoRA, say) read "the least frozen depth
    () is undecided"."""
    store = ResultStore(str(tmp_path), "s")
    for seed, acc in enumerate([0.80, 0.85, 0.90]):
        store.write_row(row(k=0, seed=seed, acc=acc))
    (decision,) = build_report([SweepRows.from_store(store)]).decisions.to_dict("records")
    assert decision["sentence"].startswith(
        "d, n = 100: fine-tune every layer: the grid has no frozen depth to compare with full fine-tuning"
    )


def test_a_sweep_of_several_models_is_decided_per_model_and_named_apart(tmp_path):
    """A walk-through: fs.decide on a sweep with a `models:` axis gave Decision(sweep='s · m1', …), no
    `model` anywhere, and `d.sweep == 's'` was False. The API's tables name the sweep and the model apart;
    what the report prints still names each model ("s · m1 · d, n = 100: …"); each model is priced apart."""
    from freezesweep.orchestrator import api

    cells, store = _stored_fixed_grid(tmp_path, 3, model=None, models=["m1", "m2"], tolerance=0.001)
    for cfg in cells:
        k, seed = cfg.frozen_layers, cfg.seed
        acc = ACC_100[k][seed] - (0.01 if cfg.model == "m2" else 0.0)
        store.write_row(
            row(k=k, seed=seed, acc=acc, model=cfg.model, trial_id=cfg.trial_id, wall_time_s=COST_100[k][1])
        )
    decided = api.decide("s", store=str(tmp_path))
    assert [(d.sweep, d.model, d.record["model"]) for d in decided] == [("s", "m1", "m1"), ("s", "m2", "m2")]
    assert list(decided.frame.columns[:3]) == ["sweep", "model", "dataset"]
    assert [d.sentence.split(": ")[0] for d in decided] == ["s · m1 · d, n = 100", "s · m2 · d, n = 100"]
    report = api.report("s", tmp_path / "out", store=str(tmp_path))
    assert report.decisions[["sweep", "model"]].values.tolist() == [["s", "m1"], ["s", "m2"]]
    for table in (report.contrasts, report.retained, report.costs, report.appendix):
        assert set(table["sweep"]) == {"s"} and set(table["model"]) == {"m1", "m2"}, table.columns
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "s · m1 · d, n = 100: " in markdown and "s · m2 · d, n = 100: " in markdown  # printed as before
    lines = api.budget_prices(decided.frame, "s", str(tmp_path))  # before: none (no sweep was named 's')
    assert [line.split(": ")[0] for line in lines] == ["m1 · d, n = 100", "m2 · d, n = 100"]
    assert all("for this size and model" in line for line in lines)


def test_a_single_model_sweep_names_its_model_too(tmp_path, store_rows):
    """One model: the same columns, the sentences unchanged (no sweep or model prefix); rows that name no
    model (stored before the column) decide for model None."""
    from freezesweep.orchestrator.api import Decisions
    from freezesweep.results.report import decisions

    named = ResultStore(str(tmp_path / "named"), "s")
    for r in known_rows():
        named.write_row({**r, "model": "m"})
    for store, model in ((named, "m"), (store_rows, None)):
        frame = decisions([SweepRows.from_store(store)])
        assert set(frame["sweep"]) == {"s"} and list(frame.columns[:2]) == ["sweep", "model"]
        assert all(s.startswith("d, n = ") for s in frame["sentence"])
        assert {d.model for d in Decisions.of(frame)} == {model}


def test_an_arm_that_mostly_collapses_is_given_the_budget_its_mean_would_decide_at(tmp_path):
    """k = 2 collapsed on 3 of 5 seeds, its 2 trained pairs 0.012 below: too few pairs to price "worse when it
    trains", but its mean with the collapses (about 0.2 below, where full fine-tuning trained on all 5) prices
    it. Before: no budget (fewer than 3 trained pairs gave none, whatever the mean said)."""
    store = ResultStore(str(tmp_path), "s")
    full = [0.85, 0.87, 0.86, 0.84, 0.88]
    arm = [MAJORITY, MAJORITY, MAJORITY, full[3] - 0.012, full[4] - 0.012]
    for seed, (f, a) in enumerate(zip(full, arm)):
        store.write_row(row(k=0, seed=seed, acc=f))
        store.write_row(row(k=2, seed=seed, acc=a))
    (decision,) = decisions([SweepRows.from_store(store)]).to_dict("records")
    assert decision["learned"] == "learned" and decision["undecided"] == "k=2"
    assert decision["decided_at_seeds"] > 5
    assert f"{decision['decided_at_seeds']} seeds per arm would decide" in decision["sentence"]
