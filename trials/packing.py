"""Training batches without their padding: every real token of a batch in one row.

A training batch is ``batch_size`` random rows padded to its longest, and every linear layer computes
the padding too: on SST-2's short sentences about two thirds of a batch is padding (measured with
MiniLM's tokenizer at n = 200: 606 positions for 216 tokens per batch). Packed, the batch is one row of
its real tokens; a block-diagonal attention mask keeps each sequence attending to its own tokens
only, position ids restart at each sequence's start, and the head reads each sequence's first token
(trials/first_token.py). The same rows in the same batch, the same function of the same weights:
only the padding is not computed (dropout draws masks for real tokens only: the same distribution,
fewer draws). Measured on one CPU core, MiniLM-L6, nothing frozen: 0.30 -> 0.17 s per step.

Whether a model qualifies is measured, not assumed: once per (model, class) and process, packed and
padded logits on a real batch in fp32 must agree to float rounding (position ids, the 4D mask and the
head's token all have to be right); otherwise the trial trains padded. Evaluation stays padded: its
batches are sorted by length (~7 % padding), and packing 64 rows would multiply the attention's work.

How training batches reach the model is decided once per trial (``training_feed``): a ``PaddedFeed``
or a ``PackedFeed``, both with ``gather`` (the batch built on the device from the train subset there,
trials/tokens.py ``DeviceRows``: nothing copied from the host, no host sync), ``prepare`` (the same
from a host batch, for checks and the memory probe) and ``logits``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from freezesweep.trials import first_token
from freezesweep.trials.eval_cache import eval_mode
from freezesweep.trials.first_token import Reader
from freezesweep.trials.oom import is_oom
from freezesweep.trials.tokens import Batch, DeviceRows, collate_rows, non_blocking_to
from freezesweep.trials.worker import FeedKey


@dataclass(frozen=True)
class Packed:
    input_ids: torch.Tensor  # [1, tokens]
    position_ids: torch.Tensor  # [1, tokens]
    sequence: torch.Tensor  # [tokens]: the batch row each token comes from
    first_tokens: torch.Tensor  # [rows]: where each row's first token is
    labels: torch.Tensor
    token_type_ids: torch.Tensor | None = None

    def to(self, device: torch.device) -> "Packed":
        asynchronous = non_blocking_to(device)  # never towards the host (trials/tokens.py Batch.to)
        return dataclasses.replace(
            self,
            **{
                f.name: None
                if getattr(self, f.name) is None
                else getattr(self, f.name).to(device, non_blocking=asynchronous)
                for f in dataclasses.fields(self)
            },
        )

    def model_inputs(self) -> dict[str, torch.Tensor]:
        inputs = {
            "input_ids": self.input_ids,
            "position_ids": self.position_ids,
            "attention_mask": packed_mask(self.sequence),
        }
        if self.token_type_ids is not None:
            inputs["token_type_ids"] = self.token_type_ids
        return inputs


def packed_mask(sequence: torch.Tensor) -> torch.Tensor:
    """A packed row's attention mask, ``[1, 1, tokens, tokens]``, from each token's sequence id:
    additive, as the model's own masks for eager attention are (SDPA takes it too), 0 within a
    sequence, the float minimum across sequences. Out of place, so that ``vmap`` takes batched ids
    (packed slots: trials/array.py ``PackedSlots``)."""
    same = sequence[:, None] == sequence[None, :]
    return torch.where(same, 0.0, torch.finfo(torch.float32).min)[None, None]


def pack(batch: Batch, position_offset: int) -> Packed:
    """``batch``'s real tokens in one row (right-padded rows: each row's tokens come first)."""
    real = batch.attention_mask.bool()
    lengths = real.sum(1)
    positions = torch.arange(real.shape[1]).expand_as(real)
    rows = torch.arange(real.shape[0])[:, None].expand_as(real)
    return Packed(
        input_ids=batch.input_ids[real][None],
        position_ids=(positions[real] + position_offset)[None],
        sequence=rows[real],
        first_tokens=torch.cumsum(lengths, 0) - lengths,
        labels=batch.labels,
        token_type_ids=None if batch.token_type_ids is None else batch.token_type_ids[real][None],
    )


def pack_rows(rows: DeviceRows, positions, on_device: torch.Tensor, position_offset: int) -> Packed:
    """``pack(collate(...))`` of these rows, built on the device from the train subset there
    (``positions`` in the subset on the host, ``on_device`` the same on the device). The token count
    comes from the host's lengths: ``repeat_interleave`` told its output size reads nothing back."""
    total = int(rows.host_lengths[positions].sum())
    lengths = rows.lengths[on_device]
    first = torch.cumsum(lengths, 0) - lengths
    sequence = torch.repeat_interleave(torch.arange(len(positions), device=lengths.device), lengths, output_size=total)
    column = torch.arange(total, device=lengths.device) - first[sequence]
    index = rows.starts[on_device][sequence] + column
    return Packed(
        input_ids=rows.tokens[index][None],
        position_ids=(column + position_offset)[None],
        sequence=sequence,
        first_tokens=first,
        labels=rows.labels[on_device],
        token_type_ids=None if rows.token_types is None else rows.token_types[index][None],
    )


def position_offset(model: nn.Module) -> int:
    """Where position ids start: 0 (BERT), or after the padding index (RoBERTa numbers positions
    from ``padding_idx + 1``; its embeddings keep that index)."""
    padding_idx = getattr(getattr(getattr(model, "base_model", model), "embeddings", None), "padding_idx", None)
    return padding_idx + 1 if isinstance(padding_idx, int) else 0


class PaddedFeed:
    def prepare(self, batch: Batch) -> Batch:
        return batch

    def gather(self, rows: DeviceRows, positions, on_device: torch.Tensor, pad_id: int) -> Batch:
        return collate_rows(rows, positions, on_device, pad_id)

    def length(self, lengths) -> int:
        """A batch's width, from its rows' lengths."""
        return int(max(lengths))

    def logits(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return model(**batch.model_inputs()).logits


@dataclass(frozen=True)
class PackedFeed:
    reader: Reader  # the last layer's narrowing, pointed at the packed row's first tokens
    offset: int

    def prepare(self, batch: Batch) -> Packed:
        return pack(batch, self.offset)

    def gather(self, rows: DeviceRows, positions, on_device: torch.Tensor, pad_id: int) -> Packed:
        return pack_rows(rows, positions, on_device, self.offset)

    def length(self, lengths) -> int:
        """A packed batch's token count, from its rows' lengths."""
        return int(sum(lengths))

    def logits(self, model: nn.Module, packed: Packed) -> torch.Tensor:
        self.reader.rows = packed.first_tokens
        try:
            return model(**packed.model_inputs()).logits
        finally:
            self.reader.rows = None  # evaluation batches are padded: position 0 again


def training_feed(
    model: nn.Module,
    batch: Batch,
    key: FeedKey,
    verdicts: dict,
    narrow: bool = True,
    packed: bool = True,
    narrow_evaluation: bool = True,
) -> tuple[Reader | None, PaddedFeed | PackedFeed]:
    """The last layer's reader (None: the model runs in full) and how training batches are fed,
    each only where ``batch`` (a few training rows, on the model's device) shows it exact; the
    verdicts are measured once per ``key`` (they depend on the architecture only) into ``verdicts``
    (the worker's: trials/worker.py)."""
    if key not in verdicts:
        verdicts[key] = _verdicts(model, batch)
    narrows, packs = verdicts[key]
    if not (narrow and narrows):
        return None, PaddedFeed()
    reader = Reader(narrow_evaluation)
    return reader, PackedFeed(reader, position_offset(model)) if packed and packs else PaddedFeed()


def _verdicts(model: nn.Module, batch: Batch) -> tuple[bool, bool]:
    """(narrowing exact, packing exact) for this model; a check that raises is a "no" to both."""
    try:
        narrows = first_token.narrowing_agrees(model, batch)
        return narrows, narrows and _packing_agrees(model, batch)
    except Exception as exc:  # a model these feeds cannot serve runs in full, never a failed trial
        if is_oom(exc):
            raise  # the trial's to handle (trials/oom.py)
        return False, False


@torch.no_grad()
def _packing_agrees(model: nn.Module, batch: Batch) -> bool:
    feed = PackedFeed(Reader(), position_offset(model))
    packed = feed.prepare(batch.to(torch.device("cpu"))).to(batch.input_ids.device)
    with eval_mode(model):
        padded = model(**batch.model_inputs()).logits
        try:
            with first_token.narrowed(model, feed.reader):
                unpadded = feed.logits(model, packed)
        except Exception as exc:  # a model that takes no 4D mask or position ids
            if is_oom(exc):
                raise
            return False
    return first_token.logits_agree(padded, unpadded)


# --- the padding mask prebuilt (CUDA graphs, a GPU's evaluations) ------------------------------------
def mask_as(mask: torch.Tensor, form: str) -> torch.Tensor:
    """The padding mask ``[width, rows, tokens]`` (or one for all, ``[rows, tokens]``) as the model takes
    it batched: as it is ("2d": the decoders and DeBERTa build theirs without asking its values), or
    additive ``[width, rows, 1, 1, tokens]`` (``[rows, 1, 1, tokens]``) ("4d": BERT's mask-building
    branches on the values, which ``vmap`` refuses)."""
    if form == "2d":
        return mask
    return torch.zeros(mask.shape, device=mask.device).masked_fill(mask == 0, torch.finfo(torch.float32).min)[
        ..., None, None, :
    ]


class AdditiveMaskFeed(PaddedFeed):
    """A padded feed that hands the model its padding mask additive and 4-D (``mask_as``'s "4d", one
    mask for every member), so that none of the model's own mask building runs in the step: a CUDA graph
    captures it. transformers 5.17's eager mask makes a host tensor, which a capture refuses (a padded
    array's capture failed so on an H200, 2026-11-29: docs/speed.md). Only where the model gives the
    same logits so (an array's ``slots_mask_form`` "4d", an evaluation's ``evaluation_feed``)."""

    def logits(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        inputs = batch.model_inputs()
        return model(**inputs | {"attention_mask": mask_as(inputs["attention_mask"], "4d")}).logits


def widened(batch: Batch, tokens: int, pad_id: int) -> Batch:
    """``batch`` padded on the right (masked) to ``tokens`` tokens, as a slot's batch is, or to
    show that a check's batch is masked."""

    def grown(t: torch.Tensor | None, value: int) -> torch.Tensor | None:
        return None if t is None else torch.nn.functional.pad(t, (0, tokens - t.shape[1]), value=value)

    return Batch(
        grown(batch.input_ids, pad_id),
        grown(batch.attention_mask, 0),
        batch.labels,
        token_type_ids=grown(batch.token_type_ids, 0),
    )


def evaluation_feed(model: nn.Module, batch: Batch, pad_id: int, key: FeedKey, verdicts: dict) -> PaddedFeed:
    """How an evaluation that gets its mask prebuilt (trials/run.py ``prebuilt_mask``: a graphed one, or
    one on a GPU) feeds the model its padded batches: ``AdditiveMaskFeed`` where the model gives the
    same logits on ``batch`` padded wider (in fp32, in eval mode) with its mask prebuilt as with the
    plain mask, else as they are. transformers' own mask building reads the mask on the host (SDPA's
    ``padding_mask.all()``, a sync per batch) or makes a host tensor (5.17's eager mask): a capture
    refuses both. Measured once per ``key`` into ``verdicts`` (the worker's), on ``batch``'s device."""
    verdict = (key, "additive_mask")
    if verdict not in verdicts:
        verdicts[verdict] = _additive_mask_agrees(model, widened(batch, batch.input_ids.shape[1] + 1, pad_id))
    return AdditiveMaskFeed() if verdicts[verdict] else PaddedFeed()


@torch.no_grad()
def _additive_mask_agrees(model: nn.Module, batch: Batch) -> bool:
    with eval_mode(model):
        plain = model(**batch.model_inputs()).logits
        try:
            prebuilt = AdditiveMaskFeed().logits(model, batch)
        except Exception as exc:  # a model that takes no 4-D mask: its evaluations feed the plain one
            if is_oom(exc):
                raise
            return False
    return first_token.logits_agree(plain, prebuilt)
