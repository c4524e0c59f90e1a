"""The CPU's stand-in for a CUDA graph (trials/cpu_graphs.py): what a replay reads and what it does not
run, as PyTorch's CUDA graphs notes say a real one does, so the graphed paths' CPU tests can fail where
only a GPU used to show it."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call, stack_module_state, vmap

from freezesweep.trials.cpu_graphs import REFUSED, record


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(16, 4, generator=generator), torch.randint(0, 2, (16,), generator=generator)


def _step(model, optimizer, x, y):
    """Forward, backward, clipping and an AdamW step (``_trained_pair``'s: fused, capturable, its learning
    rate a tensor)."""
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05, foreach=True)
    optimizer.step()
    return loss.detach()


def _trained_pair():
    """A model and its AdamW after one eager step (the optimizer's state exists, as before a capture),
    and a deep copy of both to run eagerly beside it."""
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=torch.tensor(0.05), fused=True, capturable=True)
    x, y = _data()
    _step(model, optimizer, x, y)
    optimizer.zero_grad(set_to_none=True)
    return (model, optimizer), copy.deepcopy((model, optimizer)), (x, y)


def test_a_capture_updates_nothing_and_each_replay_is_the_eager_step():
    """The capture computes nothing that lasts (weights and AdamW's moments and step counts as before
    it); each replay is one more eager step, bit for bit, the learning rate read from its tensor as the
    schedule filled it since."""
    (model, optimizer), (eager_model, eager_optimizer), (x, y) = _trained_pair()
    before = copy.deepcopy((model.state_dict(), optimizer.state_dict()["state"]))
    replay, loss = record(lambda: _step(model, optimizer, x, y))
    for p in model.parameters():
        p.grad = None  # what the caller does after a capture (trials/graphs.py StepGraphs.reset)
    after = (model.state_dict(), optimizer.state_dict()["state"])
    assert all(torch.equal(before[0][n], after[0][n]) for n in before[0])
    assert all(torch.equal(before[1][i][k], after[1][i][k]) for i in before[1] for k in before[1][i])
    replayed, eager = [], []
    for lr in (0.05, 0.02, 0.01):
        optimizer.param_groups[0]["lr"].fill_(lr)
        eager_optimizer.param_groups[0]["lr"].fill_(lr)
        replay()
        replayed.append(loss.clone())
        eager.append(_step(eager_model, eager_optimizer, x, y))
        eager_optimizer.zero_grad(set_to_none=False)
    assert torch.equal(torch.stack(replayed), torch.stack(eager))
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), eager_model.parameters()))
    assert len(set(torch.stack(replayed).tolist())) == 3  # the steps moved the weights


def test_a_replay_runs_no_python_so_what_python_held_at_the_capture_stays():
    """A Python number is frozen at its capture's value, and a tensor the code swapped for a new one
    since is read stale, the old one: what a real replay does, and what running the step's Python
    again would have hidden."""
    weights = {"w": torch.ones(3)}
    scale = [2.0]
    replay, (out,) = record(lambda: (weights["w"] * scale[0],))
    scale[0] = 5.0
    weights["w"].add_(1.0)  # in place: the replay reads it
    replay()
    assert out.tolist() == [4.0, 4.0, 4.0]  # (1 + 1) x 2: the new weight, the old scale
    met, weights["w"] = weights["w"], torch.full((3,), 10.0)  # swapped: the replay still reads the one it met
    replay()
    assert out.tolist() == [4.0, 4.0, 4.0] and met.tolist() == [2.0, 2.0, 2.0]  # (kept alive: next test)


def test_a_replay_of_a_tensor_the_program_let_go_fails():
    """A graph holds only the memory of what it read from outside: once the program drops a tensor
    and every view of its memory, a GPU's replay reads freed memory; here it fails, naming it. A view
    the program dropped while keeping its memory alive is read as it was."""
    base = torch.arange(6.0)
    batch = {"rows": base[2:5], "scale": torch.full((3,), 2.0)}  # a view, and a tensor of its own
    replay, (out,) = record(lambda: (batch["rows"] * batch["scale"],))
    del batch["rows"]  # its memory lives on in base
    base.add_(1.0)
    replay()
    assert out.tolist() == [6.0, 8.0, 10.0]
    del batch["scale"]  # its memory with it
    with pytest.raises(
        RuntimeError, match=r"a replay reads a tensor freed since its capture \(\(3,\), torch.float32\)"
    ):
        replay()


@pytest.mark.parametrize(
    "read",
    [lambda t: t.sum().item(), lambda t: bool(t.sum() > 0), lambda t: t.nonzero(), lambda t: t + torch.tensor(3.0)],
    ids=["item", "bool", "nonzero", "host-data"],
)
def test_a_host_read_in_a_capture_fails_as_a_cuda_capture_does(read):
    t = torch.ones(3)
    with pytest.raises(RuntimeError, match=REFUSED):
        record(lambda: read(t))


def test_inside_a_capture_libraries_are_told_the_stream_is_capturing():
    """transformers asks ``torch.cuda.is_current_stream_capturing()`` to leave out its host read of the
    padding mask (``is_tracing``); the answer is True inside and what it was after."""
    asked, seen = torch.cuda.is_current_stream_capturing, []
    record(lambda: seen.append(torch.cuda.is_current_stream_capturing()) or torch.ones(1) * 2)
    assert seen == [True] and torch.cuda.is_current_stream_capturing is asked  # (a CPU build's raises)


def test_an_operator_that_may_alias_but_copied_is_refreshed_at_each_replay():
    """``contiguous`` of a transposed tensor, ``to`` another dtype, ``reshape`` of a non-contiguous one
    copy (their schemas say they may alias): each replay writes their new values, or the operators
    after them read the capture's. Inference mode: composite operators reach the recording whole."""
    w = torch.arange(6.0).reshape(2, 3)
    with torch.inference_mode():
        w = w.clone()
        replay, (a, b, c) = record(lambda: (w.t().contiguous() * 1, w.to(torch.float64) * 1, w.t().reshape(6) * 1))
        w.mul_(-1)
    replay()  # (outside inference mode: the replay runs in its capture's)
    assert torch.equal(a, -torch.arange(6.0).reshape(2, 3).t())
    assert b.dtype == torch.float64 and b.sum().item() == -15.0 and c.sum().item() == -15.0


def test_members_under_vmap_replay_as_they_step_eagerly():
    """Stacked members (torch.func, as a trial array's, trials/array.py): forward and backward under
    ``vmap`` recorded below it; a replay is the eager step."""
    members = [_model(seed) for seed in range(3)]
    params, buffers = stack_module_state(members)
    base = copy.deepcopy(members[0]).to("meta")
    x, y = _data()

    def losses(p):
        logits = vmap(lambda q, xb: functional_call(base, (q, buffers), (xb,)), in_dims=(0, None))(p, x)
        return torch.stack([F.cross_entropy(logit, y) for logit in logits])

    def step(p):
        total = losses(p)
        grads = torch.autograd.grad(total.sum(), list(p.values()))
        with torch.no_grad():
            for value, grad in zip(p.values(), grads):
                value.sub_(0.1 * grad)
        return total.detach()

    params = {n: v.detach().clone().requires_grad_() for n, v in params.items()}
    eager = {n: v.detach().clone().requires_grad_() for n, v in params.items()}
    replay, out = record(lambda: step(params))
    for _ in range(2):
        replay()
        expected = step(eager)
        assert torch.equal(out, expected) and len(set(out.tolist())) == 3
    assert all(torch.equal(params[n], eager[n]) for n in params)


def test_random_draws_are_drawn_anew_at_each_replay():
    """Dropout in a graph draws new masks at each replay (a CUDA graph's generator offsets advance)."""
    x = torch.ones(1000)
    replay, out = record(lambda: F.dropout(x, 0.5, training=True))
    first = out.clone()
    replay()
    assert not torch.equal(out, first) and set(out.unique().tolist()) <= {0.0, 2.0}
