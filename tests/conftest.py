"""Shared fixtures: tiny in-process models saved as HF folders, a tiny learnable dataset, the real
GLUE Parquet files when the checkout has ``shared/`` beside it, and a real S3 API (moto's server)."""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

import pandas as pd
import pyarrow.fs as pafs
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
# The repository's folders installed as freezesweep.<folder> (pyproject.toml's package-dir).
FOLDERS = ("orchestrator", "trials", "results", "cluster")


def product_modules() -> dict[str, Path]:
    """Every module of the package by its import name, from the source tree: ``freezesweep`` and each
    folder's modules as ``freezesweep.<folder>.<module>``."""
    found = {}
    for folder in ("freezesweep", *FOLDERS):
        for path in sorted((REPO / folder).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            parts = parts if folder == "freezesweep" else ("freezesweep", *parts)
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _find_glue_dir() -> Path | None:
    for candidate in (os.environ.get("FREEZESWEEP_DATA_DIR"), REPO.parent / "shared" / "data" / "glue"):
        if candidate and (Path(candidate) / "sst2" / "train.parquet").is_file():
            return Path(candidate)
    return None


GLUE_DIR = _find_glue_dir()
needs_glue = pytest.mark.skipif(GLUE_DIR is None, reason="real GLUE Parquet files (shared/data/glue) not present")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    # Token caches and Ray results of tests never touch the user's home.
    monkeypatch.setenv("FREEZESWEEP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture(scope="session")
def glue_dir() -> Path:
    if GLUE_DIR is None:
        pytest.skip("real GLUE Parquet files (shared/data/glue) not present")
    return GLUE_DIR


@pytest.fixture(scope="session")
def minilm_tokenizer():
    from freezesweep.trials.model import load_tokenizer

    return load_tokenizer(MINILM)


def tiny_encoder(tokenizer, **changes) -> dict:
    """A BERT-shaped config's sizes for ``tokenizer``'s vocabulary: 2 layers, hidden 32 (seconds a trial)."""
    sizes = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    return dict(vocab_size=len(tokenizer), **sizes, max_position_embeddings=128) | changes


def save_tiny(path: Path, config, tokenizer) -> str:
    """The base model only, like a real pretrained checkpoint: the classifier head is new in every
    trial, initialised from the trial's seed."""
    from transformers import AutoModel

    import torch

    torch.manual_seed(0)
    AutoModel.from_config(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def lacking(model: str, path, name: str) -> str:
    """A copy of the checkpoint at ``model`` without its weight ``name``: loading it initialises that
    weight anew, from the trial's seed (as a checkpoint of another architecture variant would)."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(model, path)
    weights = load_file(path / "model.safetensors")
    assert weights.pop(name, None) is not None, sorted(weights)
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    return str(path)


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory, minilm_tokenizer) -> str:
    from transformers import BertConfig

    config = BertConfig(**tiny_encoder(minilm_tokenizer))
    return save_tiny(tmp_path_factory.mktemp("tiny-bert"), config, minilm_tokenizer)


@pytest.fixture(scope="session")
def tiny_roberta(tmp_path_factory, minilm_tokenizer) -> str:
    from transformers import RobertaConfig

    config = RobertaConfig(
        vocab_size=len(minilm_tokenizer),
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=140,
        pad_token_id=minilm_tokenizer.pad_token_id,
    )
    return save_tiny(tmp_path_factory.mktemp("tiny-roberta"), config, minilm_tokenizer)


def make_toy_dataset(
    folder: Path,
    n_train: int = 240,
    n_val: int = 60,
    fmt: str = "csv",
    seed: int = 0,
    text_column: str = "sentence",
    label_column: str = "label",
) -> Path:
    """A learnable sentiment toy task: the label is which word list the sentence draws from."""
    rng = random.Random(seed)
    good, bad = ["great", "lovely", "superb", "fine", "happy"], ["awful", "bad", "poor", "dull", "sad"]
    filler = ["the", "movie", "was", "a", "plot", "and", "really", "story", "it", "quite"]

    def rows(n):
        out = []
        for _ in range(n):
            label = int(rng.random() < 0.6)  # imbalanced on purpose: the majority is 0.6
            words = rng.sample(filler, 4) + [rng.choice(good if label else bad)]
            rng.shuffle(words)
            out.append({text_column: " ".join(words), label_column: label})
        return pd.DataFrame(out)

    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("validation", n_val)):
        df = rows(n)
        if fmt == "csv":
            df.to_csv(folder / f"{split}.csv", index=False)
        elif fmt == "jsonl":
            df.to_json(folder / f"{split}.jsonl", orient="records", lines=True)
        else:
            df.to_parquet(folder / f"{split}.parquet")
    return folder


def make_toy_pair_dataset(
    folder: Path, n_train: int = 160, n_val: int = 40, regression: bool = False, seed: int = 0
) -> Path:
    """A learnable sentence-pair toy task (Parquet, GLUE's column names): the label is whether the second
    sentence carries the first one's sentiment (classification), or a 0-5 score of how much of it it
    carries (regression: float labels)."""
    rng = random.Random(seed)
    good, bad = ["great", "lovely", "superb", "fine", "happy"], ["awful", "bad", "poor", "dull", "sad"]
    filler = ["the", "movie", "was", "a", "plot", "and", "really", "story", "it", "quite"]

    def sentence(words: list[str]) -> str:
        return " ".join(rng.sample(filler, 3) + words)

    def rows(n):
        out = []
        for _ in range(n):
            first = rng.choice([good, bad])
            agree = rng.randint(0, 5)  # how many of the second sentence's 5 mood words match the first's
            second = [rng.choice(first) for _ in range(agree)] + [
                rng.choice(bad if first is good else good) for _ in range(5 - agree)
            ]
            label = float(agree) + (rng.random() - 0.5) * 0.2 if regression else int(agree >= 3)
            out.append({"sentence1": sentence([rng.choice(first)]), "sentence2": sentence(second), "label": label})
        return pd.DataFrame(out)

    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("validation", n_val)):
        rows(n).to_parquet(folder / f"{split}.parquet")
    return folder


@pytest.fixture(scope="session")
def toy_pairs(tmp_path_factory) -> str:
    return str(make_toy_pair_dataset(tmp_path_factory.mktemp("toy-pairs")))


@pytest.fixture(scope="session")
def toy_scores(tmp_path_factory) -> str:
    return str(make_toy_pair_dataset(tmp_path_factory.mktemp("toy-scores"), regression=True))


@pytest.fixture(scope="session")
def toy_dataset(tmp_path_factory) -> str:
    return str(make_toy_dataset(tmp_path_factory.mktemp("toy")))


@pytest.fixture
def tiny_trial(tiny_bert, toy_dataset):
    """A TrialConfig that runs in about a second on CPU (fp32: the same numbers on every CPU)."""
    from freezesweep.trials.config import TrialConfig

    return TrialConfig(
        dataset=toy_dataset,
        model=tiny_bert,
        train_size=48,
        frozen_layers=0,
        seed=0,
        epochs=2,
        learning_rate=3e-3,
        eval_batch_size=32,
        num_threads=1,
        precision="fp32",
    )


@pytest.fixture
def write_spec(tmp_path, tiny_bert, toy_dataset):
    """Write a tiny sweep spec (tiny model, toy data) with overrides; returns its path."""

    def write(name: str = "tiny", **overrides) -> Path:
        spec = {
            "name": name,
            "model": tiny_bert,
            "datasets": [toy_dataset],
            "train_sizes": [24, 48],
            "frozen_layers": [0, 2],
            "seeds": [0],
            # fp32: the same numbers on every CPU (one test sweeps with precision auto)
            "training": {"epochs": 2, "learning_rate": 0.003, "eval_batch_size": 32, "precision": "fp32"},
            "resources": {"cpus_per_trial": 1, "max_failures": 1},
            "store": str(tmp_path / "store"),
        }
        for key, value in overrides.items():
            if isinstance(value, dict) and isinstance(spec.get(key), dict):
                spec[key] = {**spec[key], **value}
            else:
                spec[key] = value
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(spec))
        return path

    return write


# --- a real S3 API for the store, its lock and Ray's storage: moto's server on a free loopback port ---
FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3:
    def __init__(self):
        self.port = free_port()
        self.server = None
        self.uri = f"s3://sweeps/store?endpoint_override=127.0.0.1:{self.port}&scheme=http&region=us-east-1"

    def start(self):
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()

    def stop(self):
        if self.server is not None:
            self.server.stop()
            self.server = None


@pytest.fixture
def s3(monkeypatch):
    pytest.importorskip("moto")
    for key, value in FAKE_AWS.items():
        monkeypatch.setenv(key, value)
    server = S3()
    server.start()
    fs, _ = pafs.FileSystem.from_uri(server.uri + "&allow_bucket_creation=true")
    fs.create_dir("sweeps")  # the bucket
    yield server
    server.stop()


# --- a real MLflow tracking server (sqlite backend) on a free loopback port, for the session ----------
@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """The server's tracking URI, once its health endpoint answers (a bounded wait, never a fixed sleep)."""
    import subprocess
    import sys
    import time
    import urllib.request

    pytest.importorskip("mlflow")
    folder, port = tmp_path_factory.mktemp("mlflow"), free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            f"sqlite:///{folder / 'mlflow.db'}",
            "--default-artifact-root",
            str(folder / "artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(folder / "server.log", "w"),
        start_new_session=True,
    )  # its own group: the server's workers end with it
    uri, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 180
    try:
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the MLflow server did not start: {(folder / 'server.log').read_text()[-3000:]}")
                time.sleep(0.5)  # the poll's interval, not a wait standing in for readiness
        yield uri
    finally:
        import os
        import signal

        os.killpg(server.pid, signal.SIGKILL)  # a throwaway sqlite database: no graceful shutdown to wait for
        server.wait(timeout=60)


# --- a sweep's stored rows, however they are laid out (single-row files or compacted parts) ---------
# The default suite's Ray sweeps are one of each kind: every Ray Tune run, and every retry of a dead trial,
# starts its trial processes afresh, ~13 s of imports each on 2 cores (torch, transformers, Ray Tune). The
# others (retries, trial arrays through Ray, Ctrl-C, resume from elsewhere, ...) wait for `make test-slow`
# (docs/testing.md), which CI runs too.
ray_sweeps = pytest.mark.slow


def count_rows(results_dir: Path) -> int:
    """Rows in a results folder now (files a compaction moves away meanwhile are skipped)."""
    import pyarrow.parquet as pq

    total = 0
    for path in results_dir.glob("*.parquet"):
        try:
            total += pq.read_metadata(path).num_rows
        except (FileNotFoundError, OSError):
            continue
    return total


def rows_by_id(results_dir: Path) -> dict[str, tuple]:
    """trial_id → (finished_at, best_val_accuracy, status): what must not change once stored."""
    rows = pd.read_parquet(results_dir, columns=["trial_id", "finished_at", "best_val_accuracy", "status"])
    return {r.trial_id: (r.finished_at, r.best_val_accuracy, r.status) for r in rows.itertuples()}


def killed_launch(spec_path: Path, fault: str) -> None:
    """``freezesweep launch SPEC`` in a driver of its own that the driver fault ``fault``
    (orchestrator/driver_faults.py) kills; its embedded Ray is killed with it."""
    import signal
    import subprocess
    import sys

    driver = subprocess.Popen(
        [sys.executable, "-m", "freezesweep.orchestrator.cli", "launch", str(spec_path)],
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "FREEZESWEEP_DRIVER_FAULT": fault},
    )
    driver.wait(timeout=600)
    assert driver.returncode == -signal.SIGKILL, driver.stderr.read()[-3000:]
    os.killpg(driver.pid, signal.SIGKILL)  # its embedded Ray


@pytest.fixture
def worker():
    """A cold worker (trials/worker.py): what a trial keeps for the next one starts empty."""
    from freezesweep.trials.worker import WorkerState

    return WorkerState()


def ok_ids(store) -> set[str]:
    """The cells a store holds an ok row of (what the product asks as ``statuses()``)."""
    return {trial_id for trial_id, status in store.statuses().items() if status == "ok"}
