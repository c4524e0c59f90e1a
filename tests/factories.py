"""Objects many tests build: one trial's result as the store takes it."""

from freezesweep.trials.config import EvalPoint, TrialConfig, TrialResult


def trial_result(seed=0, status="ok", acc=0.8, train_size=50):
    """A finished trial of SST-2 (or one with ``status``, its error "boom"), as the store writes it."""
    cfg = TrialConfig(
        dataset="glue/sst2", model="m", train_size=train_size, frozen_layers=2, seed=seed, precision="fp32"
    )
    if status != "ok":
        return TrialResult(trial_id=cfg.trial_id, config=cfg, status=status, error="boom")
    curve = (EvalPoint(2, 0.5, acc - 0.1, 0.6), EvalPoint(4, 1.0, acc, 0.5))
    return TrialResult(
        trial_id=cfg.trial_id,
        config=cfg,
        status="ok",
        best_val_accuracy=acc,
        best_step=4,
        best_epoch=1.0,
        final_val_accuracy=acc,
        majority_baseline=0.509,
        eval_curve=curve,
        train_loss_curve=((2, 0.7), (4, 0.6)),
        trainable_params=10,
        total_params=20,
        train_indices=(1, 5, 9),
        versions={"torch": "x"},
    )
