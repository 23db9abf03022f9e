"""What a loader hands the engine: ModelSource (config, tokenizer, weight iterators) and the
error a loader raises. A leaf: the loaders and the dispatcher import it, it imports none."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from backend.tokenizer import Tokenizer
from backend.weights.config import ModelConfig

WeightIterator = Callable[[], Iterator[tuple[str, torch.Tensor]]]

class ModelLoadError(ValueError):
    """The model named on the command line cannot be found or read; the message says why."""


@dataclass
class ModelSource:
    name: str            # the model id /v1/models shows
    config: ModelConfig
    tokenizer: Tokenizer
    # HF tensor names, CPU tensors, q/k in HF layout. None = synthetic: keep the random init.
    weights: WeightIterator | None
    # A quantised file's own codes (GroupQuantized for its Q8_0/Q4_0/Q4_1 tensors, tensors
    # for the rest), read straight from the file; what `--weights-dtype int8|int4|auto` loads.
    packed_weights: WeightIterator | None = None
    # "int4" / "int8" when most of the file's linear weights are in such a code form (what
    # `--weights-dtype auto` keeps), else None.
    weight_quantization: str | None = None
    # The same for the output projection (the token embedding where the head is tied): what
    # `--lm-head-dtype auto` keeps when the layers are quantised.
    head_quantization: str | None = None
