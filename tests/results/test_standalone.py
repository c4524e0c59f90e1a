"""results/ stands alone: the store, queries, lock and report import neither torch nor the trial package."""

import subprocess
import sys

from tests.conftest import REPO

BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'transformers') or name.startswith('freezesweep.trials'):
            raise ImportError(f'blocked import of {name}')
sys.meta_path.insert(0, Block())
"""


def test_results_imports_without_torch_or_trials(tmp_path):
    code = (
        BLOCKER
        + f"""
import pyarrow as pa
import freezesweep.results.lock, freezesweep.results.stats, freezesweep.results.decision, freezesweep.results.figures
import freezesweep.results.report
from freezesweep.results import query
from freezesweep.results.store import SCHEMA, ResultStore
store = ResultStore({str(tmp_path)!r}, "s")
row = {{name: None for name in SCHEMA.names}} | {{"trial_id": "abc", "status": "ok", "best_val_accuracy": 0.5,
       "dataset": "d", "train_size": 1, "frozen_layers": 0, "seed": 0}}
store.write_row(row)
print(query.summary(store.read())["mean"].tolist(), sorted(t for t, s in store.statuses().items() if s == 'ok'))
print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch' or m.startswith('freezesweep.trials')))
"""
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["[0.5] ['abc']", "[]"]


def test_the_blocker_blocks():
    """The check above means something only if the blocker really stops a torch import."""
    done = subprocess.run(
        [sys.executable, "-c", BLOCKER + "import freezesweep.trials.config"], capture_output=True, text=True, cwd=REPO
    )
    assert done.returncode != 0 and "blocked import of freezesweep.trials" in done.stderr
