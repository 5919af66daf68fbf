"""A published LoRA adapter as weight deltas: ``W = W0 + scale * B @ A`` per targeted weight.

The transformers backend merges an adapter into its spare copy by resetting the targeted weights to
the initial ones and adding each delta in place: no module is wrapped or unwrapped, and the
untargeted weights (embeddings: most of a small model with a large vocabulary) are not touched.
The adapter's config is read by PEFT; adapters that are more than plain LoRA (DoRA, extra trained
modules, per-layer ranks, biases) are refused with the reason.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from collections.abc import Mapping, Set
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from .base import WeightLoadError

ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PREFIX = "base_model.model."


@dataclass(frozen=True)
class Delta:
    a: torch.Tensor  # (r, in)
    b: torch.Tensor  # (out, r)
    scale: float
    transposed: bool  # the weight is stored (in, out): GPT-2's Conv1D

    def merge_into(self, weight: torch.Tensor, initial: torch.Tensor) -> None:
        """``weight`` := ``initial`` + scale * B @ A, in place. An adapter trained in float32 on a
        bfloat16 member is summed in float32 and rounded once, into the weight's dtype."""
        if weight.dtype != self.a.dtype:
            delta = self.b @ self.a
            weight.copy_(initial.to(delta.dtype).add_(delta.T if self.transposed else delta, alpha=self.scale))
            return
        weight.copy_(initial)
        if self.transposed:
            weight.addmm_(self.a.T, self.b.T, alpha=self.scale)
        else:
            weight.addmm_(self.b, self.a, alpha=self.scale)


def read_adapter(
    path: str | Path, shapes: Mapping[str, tuple[int, ...]], stored_in_out: Set[str] = frozenset()
) -> dict[str, Delta]:
    """The deltas of the adapter in ``path``, keyed by the model's state-dict names; every one is
    checked against ``shapes`` (the serving model's). ``stored_in_out``: the weights kept as
    (in, out) (``transposed_weights``)."""
    from peft import LoraConfig

    path = Path(path)
    try:
        cfg = LoraConfig.from_pretrained(str(path))
    except Exception as err:  # noqa: BLE001 - peft raises many types for a bad config
        raise WeightLoadError(f"unreadable adapter config: {err}", field="uri") from None
    extras = {
        "use_dora": bool(getattr(cfg, "use_dora", False)),
        "modules_to_save": bool(cfg.modules_to_save),
        "rank_pattern": bool(cfg.rank_pattern),
        "alpha_pattern": bool(cfg.alpha_pattern),
        "bias": cfg.bias != "none",
    }
    if any(extras.values()):
        sets = [k for k, v in extras.items() if v]
        raise WeightLoadError(f"only plain LoRA adapters are served; this one sets {sets}")
    scale = cfg.lora_alpha / (math.sqrt(cfg.r) if cfg.use_rslora else cfg.r)
    try:
        tensors = load_file(path / ADAPTER_WEIGHTS)
    except Exception as err:  # noqa: BLE001 - any parse failure is a bad file
        raise WeightLoadError(f"{ADAPTER_WEIGHTS} is not a readable safetensors file: {err}") from None
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        module, sep, part = key.removeprefix(_PREFIX).rpartition(".lora_")
        if not sep or part not in ("A.weight", "B.weight"):
            raise WeightLoadError(f"adapter tensor {key!r} is not a LoRA A or B matrix")
        pairs.setdefault(module, {})[part[0]] = tensor.float()
    deltas: dict[str, Delta] = {}
    for module, ab in pairs.items():
        name = f"{module}.weight"
        if set(ab) != {"A", "B"}:
            raise WeightLoadError(f"adapter module {module!r} lacks its {'B' if 'A' in ab else 'A'} matrix")
        if name not in shapes:
            raise WeightLoadError(f"adapter targets {name!r}, which the serving model does not have")
        transposed = name in stored_in_out
        out_in = (ab["B"].shape[0], ab["A"].shape[1])
        if ab["B"].shape[1] != ab["A"].shape[0] or tuple(shapes[name]) != (out_in[::-1] if transposed else out_in):
            raise WeightLoadError(f"adapter for {name!r} is {out_in} (out, in); the model's weight is {shapes[name]}")
        deltas[name] = Delta(ab["A"], ab["B"], scale, transposed)
    if not deltas:
        raise WeightLoadError("the adapter has no LoRA matrices")
    return deltas


def transposed_weights(model: torch.nn.Module) -> frozenset[str]:
    """State-dict names of the weights a model keeps as (in, out): transformers' ``Conv1D`` (GPT-2)."""
    from transformers.pytorch_utils import Conv1D

    return frozenset(f"{n}.weight" for n, m in model.named_modules() if isinstance(m, Conv1D))


def merged_directory(model_dir: str, adapter_dir: str, prefix: str) -> str:
    """The model directory's initial weights with the adapter merged (PEFT, float32, on the CPU), saved
    as safetensors alone in a new temporary directory (named ``prefix``...): a full-weights update for
    a server that cannot apply adapters itself (vLLM without LoRA support for the architecture)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    try:
        merged = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
    except Exception as err:  # noqa: BLE001 - peft raises many types for a mismatched adapter
        raise WeightLoadError(f"adapter does not fit the serving model: {err}") from None
    out = tempfile.mkdtemp(prefix=prefix)
    try:
        merged.save_pretrained(out)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    for extra in os.listdir(out):  # only the tensors matter to a reload
        if not extra.endswith(".safetensors"):
            os.remove(os.path.join(out, extra))
    return out
