"""A cell's identity is an explicit, pinned list of fields; seeds are paired across k and n."""

import dataclasses

import pytest
import torch

from freezesweep.trials.config import CELL_AXES, IDENTITY_FIELDS, LATER_FIELDS, MACHINE_FIELDS, SEED_FIELDS, TrialConfig
from freezesweep.trials.run import initial_model

ROBERTA = dict(model="roberta-base", precision="fp16")
MINILM = "sentence-transformers/all-MiniLM-L6-v2"

# Pinned on 2026-11-21. If one of these changes, every stored sweep would be orphaned: add new
# TrialConfig fields to LATER_FIELDS (hashed only off their default) instead of changing these.
PINNED = [
    (
        TrialConfig(dataset="glue/sst2", train_size=50, frozen_layers=-1, seed=0, **ROBERTA),
        "391b1373105cc5f1",
        1999490700,
    ),
    (
        TrialConfig(
            dataset="glue/cola", model="roberta-base", train_size=1000, frozen_layers=4, seed=3, precision="bf16"
        ),
        "4e42c6279a0afd10",
        450755240,
    ),
    (
        TrialConfig(
            dataset="glue/sst2",
            model=MINILM,
            train_size=200,
            frozen_layers=3,
            seed=1,
            precision="fp32",
            max_eval_examples=256,
        ),
        "cdf58680b43fc8cb",
        1747764429,
    ),
]


@pytest.mark.parametrize("cfg,trial_id,seed", PINNED)
def test_pinned_ids_and_seeds(cfg, trial_id, seed):
    assert (cfg.trial_id, cfg.derived_seed) == (trial_id, seed)


def test_every_field_is_classified():
    """A new field must be declared identity (LATER_FIELDS) or machine use: nothing is hashed by accident
    and nothing that changes results is left out by accident."""
    fields = [f.name for f in dataclasses.fields(TrialConfig)]
    classified = list(IDENTITY_FIELDS) + list(LATER_FIELDS) + list(MACHINE_FIELDS)
    assert sorted(classified) == sorted(fields) and len(set(classified)) == len(classified)
    assert set(CELL_AXES) <= set(IDENTITY_FIELDS) | set(LATER_FIELDS) and set(SEED_FIELDS) <= set(IDENTITY_FIELDS)
    cfg = PINNED[0][0]
    for name, default in LATER_FIELDS.items():
        assert getattr(cfg, name) == default  # the dataclass default is the one rows were made with


def test_later_fields_key_only_off_their_default():
    cfg = PINNED[0][0]
    assert dataclasses.replace(cfg, method="freeze", eval_at_end=False).trial_id == cfg.trial_id
    assert dataclasses.replace(cfg, eval_at_end=True).trial_id != cfg.trial_id
    assert dataclasses.replace(cfg, method="lora").trial_id != cfg.trial_id


def test_pairs_and_metric_selection_key_only_off_their_defaults():
    """Rows made before select_metric existed picked by accuracy: that default keeps their ids (and SST-2's
    official metric is accuracy, so a new SST-2 sweep keeps them too); another metric is another cell."""
    cfg = PINNED[0][0]
    assert dataclasses.replace(cfg, select_metric="accuracy", text_pair_column=None).trial_id == cfg.trial_id
    assert dataclasses.replace(cfg, select_metric="matthews").trial_id != cfg.trial_id
    assert dataclasses.replace(cfg, text_pair_column="sentence2").trial_id != cfg.trial_id
    assert dataclasses.replace(cfg, select_metric="matthews").derived_seed == cfg.derived_seed  # still paired


def test_machine_fields_are_not_identity():
    cfg = PINNED[0][0]
    moved = dataclasses.replace(
        cfg,
        data_dir="/data",
        cache_dir="/c",
        checkpoint_dir="/ck",
        checkpoint_every_epochs=1.0,
        num_threads=8,
        device="cuda:1",
        eval_batch_size=512,
    )
    assert moved.trial_id == cfg.trial_id


def test_ints_in_float_fields_hash_as_floats():
    cfg = PINNED[0][0]
    assert dataclasses.replace(cfg, epochs=10, warmup_epochs=1, weight_decay=0).trial_id == cfg.trial_id


def test_auto_precision_is_never_hashed():
    with pytest.raises(ValueError, match="resolve precision 'auto'"):
        _ = dataclasses.replace(PINNED[0][0], precision="auto").trial_id


def test_seeds_are_paired_across_frozen_layers_and_train_sizes():
    cfg = PINNED[0][0]
    for other in (
        dataclasses.replace(cfg, frozen_layers=8),
        dataclasses.replace(cfg, train_size=1000),
        dataclasses.replace(cfg, learning_rate=1e-4),
    ):
        assert other.derived_seed == cfg.derived_seed and other.trial_id != cfg.trial_id
    for other in (
        dataclasses.replace(cfg, seed=1),
        dataclasses.replace(cfg, split_seed=1),
        dataclasses.replace(cfg, dataset="glue/cola"),
        dataclasses.replace(cfg, model="bert-base-uncased"),
    ):
        assert other.derived_seed != cfg.derived_seed


def _head(cfg) -> dict[str, torch.Tensor]:
    model = initial_model(cfg, num_labels=2)
    return {n: p.detach().clone() for n, p in model.named_parameters() if n.startswith("classifier")}


def test_same_seed_different_k_and_n_start_from_the_same_head(tiny_trial):
    head = _head(tiny_trial)
    assert head  # the tiny BERT has a freshly initialised classifier
    for other in (dataclasses.replace(tiny_trial, frozen_layers=2), dataclasses.replace(tiny_trial, train_size=24)):
        assert all(torch.equal(head[n], p) for n, p in _head(other).items())
    reseeded = _head(dataclasses.replace(tiny_trial, seed=1))
    assert not torch.equal(head["classifier.weight"], reseeded["classifier.weight"])
