"""A hub model or GLUE task with no local copy asks the hub once, without retries: a machine without
network fails validation at once with the remedy, rather than after huggingface_hub's ~25 s of retries
per file; HF_HUB_OFFLINE reads the cache and says so where it lacks the model."""

import socket

import huggingface_hub
import pytest

from freezesweep.trials import hub, model
from freezesweep.trials.data import DatasetError, load_task


@pytest.fixture
def closed_hub(monkeypatch):
    """Online mode, with the hub's endpoint a loopback port nothing listens on: connection refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # free once closed: nothing listens there
    monkeypatch.setattr(hub, "offline", lambda: False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("FREEZESWEEP_DATA_DIR", raising=False)
    for proxy in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)  # a proxy would answer for the closed port
    model.load_model_config.cache_clear()
    yield
    model.load_model_config.cache_clear()


@pytest.fixture
def config_loads(monkeypatch):
    """Every AutoConfig.from_pretrained call model.py makes, by its keyword arguments."""
    calls = []
    real = model.AutoConfig.from_pretrained

    def spy(path, **kwargs):
        calls.append(kwargs)
        return real(path, **kwargs)

    monkeypatch.setattr(model.AutoConfig, "from_pretrained", spy)
    return calls


def test_an_unreachable_hub_fails_a_model_missing_from_the_cache_at_once(closed_hub, config_loads):
    with pytest.raises(model.ModelError) as caught:
        model.load_model_config("freezesweep-tests/absent-model")
    said = str(caught.value)
    assert "not in this machine's Hugging Face cache" in said
    assert "hub cannot be reached" in said
    assert "hf download freezesweep-tests/absent-model" in said and "local folder" in said
    # Only the cache was read: the load that retries was never started.
    assert config_loads == [{"local_files_only": True}]


def test_offline_reads_the_cache_only_and_names_hf_hub_offline(monkeypatch, config_loads):
    asked = []
    monkeypatch.setattr(hub, "offline", lambda: True)
    monkeypatch.setattr(hub, "hub_problem", lambda *a, **k: asked.append(a))
    model.load_model_config.cache_clear()
    with pytest.raises(model.ModelError, match="HF_HUB_OFFLINE is set"):
        model.load_model_config("freezesweep-tests/absent-offline")
    model.load_model_config.cache_clear()
    assert asked == [] and config_loads == [{"local_files_only": True}]


def test_a_local_folder_is_read_without_asking_the_hub(monkeypatch, tiny_bert, config_loads):
    monkeypatch.setattr(hub, "hub_problem", lambda *a, **k: pytest.fail("the hub was asked for a folder"))
    model.load_model_config.cache_clear()
    assert model.load_model_config(tiny_bert).num_hidden_layers > 0
    model.load_model_config.cache_clear()
    assert config_loads == [{"local_files_only": True}]


def test_an_unreachable_hub_fails_a_glue_task_without_files_before_datasets_retries(closed_hub, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("datasets was asked"))
    with pytest.raises(DatasetError) as caught:
        load_task("glue/sst2")
    said = str(caught.value)
    assert "FREEZESWEEP_DATA_DIR" in said and "hub cannot be reached" in said and "no copy of GLUE cached" in said


def test_an_unreachable_hub_leaves_a_cached_glue_to_datasets(closed_hub, monkeypatch):
    """A machine without network whose `datasets` cache holds GLUE reads it (datasets' own fallback), as before."""
    import datasets

    from freezesweep.trials import data

    asked = []

    def cached_copy(*args, **kwargs):
        asked.append(args)
        raise RuntimeError("read from the cache")  # stands in for the rows: what matters is that it was asked

    monkeypatch.setattr(data, "_glue_cached", lambda: True)
    monkeypatch.setattr(datasets, "load_dataset", cached_copy)
    with pytest.raises(DatasetError, match="read from the cache"):
        load_task("glue/sst2")
    assert asked == [("glue", "sst2")]
