"""The transformers backend's in-place LoRA merge gives PEFT's own ``merge_and_unload`` weights,
swap after swap (each adapter relative to the initial weights, a changed target set reset), for
``Linear`` (Llama) and ``Conv1D`` (GPT-2) layers, tied embeddings included; and it refuses adapters
that are more than plain LoRA."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from corl.models.tokenizer import build_char_tokenizer
from corl.services.model.backends.base import WeightLoadError
from corl.services.model.backends.transformers import TransformersBackend
from corl.weights_store import digest

ARCH = {
    "gpt2": dict(n_embd=32, n_layer=2, n_head=2, n_positions=64),
    "llama": dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, tie_word_embeddings=True
    ),
}
TARGETS = {"gpt2": (["c_attn", "c_fc"], ["c_proj"]), "llama": (["q_proj", "down_proj"], ["v_proj", "up_proj"])}


def _model_dir(family: str, root: Path) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM

    tok = build_char_tokenizer()
    torch.manual_seed(0)
    cfg = AutoConfig.for_model(family, vocab_size=len(tok), **ARCH[family])
    d = root / family
    AutoModelForCausalLM.from_config(cfg).save_pretrained(d)
    tok.save_pretrained(d)
    return d


def _adapter(model_dir: Path, out: Path, targets: list[str], seed: int, **extra: object):  # type: ignore[no-untyped-def]
    """A random adapter (B non-zero) and PEFT's merge of it into the initial weights."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False, **extra)  # type: ignore[arg-type]
    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), cfg)
    peft_model.save_pretrained(out)
    return peft_model.merge_and_unload().state_dict()


@pytest.mark.parametrize("family", sorted(ARCH))
def test_swaps_match_peft_merge(family: str, tmp_path: Path) -> None:
    model_dir = _model_dir(family, tmp_path)
    backend = TransformersBackend(str(model_dir), "m", num_threads=1)
    backend._start_sync()
    first, second = TARGETS[family]
    # v1, v2 fill both slots; v3 lands in v1's slot with other targets; v4 goes back to the first set.
    plan = [(first, 1), (first, 2), (second, 3), (first, 4)]
    for version, (targets, seed) in enumerate(plan, start=1):
        path = tmp_path / f"v{version}"
        expected = _adapter(model_dir, path, targets, seed)
        backend._load_sync(version, str(path), "lora", digest(path))
        served = backend._active.model.state_dict()  # type: ignore[union-attr]
        assert backend.weight_version == version
        assert served.keys() == expected.keys()
        for name, tensor in expected.items():
            torch.testing.assert_close(served[name], tensor, rtol=1e-5, atol=1e-6, msg=f"v{version} {name}")


def test_adapters_beyond_plain_lora_are_refused_and_serving_goes_on(tmp_path: Path) -> None:
    model_dir = _model_dir("llama", tmp_path)
    backend = TransformersBackend(str(model_dir), "m", num_threads=1)
    backend._start_sync()
    before = {k: v.clone() for k, v in backend._active.model.state_dict().items()}  # type: ignore[union-attr]
    path = tmp_path / "dora"
    _adapter(model_dir, path, ["q_proj"], 0, use_dora=True)
    with pytest.raises(WeightLoadError, match="only plain LoRA.*use_dora"):
        backend._load_sync(1, str(path), "lora", digest(path))
    assert backend.weight_version == 0
    for name, tensor in backend._active.model.state_dict().items():  # type: ignore[union-attr]
        assert torch.equal(tensor, before[name]), name


@pytest.mark.parametrize("transposed", [False, True])
def test_a_float32_adapter_merges_into_a_bfloat16_weight_rounded_once(transposed: bool) -> None:
    from corl.services.model.backends.adapters import Delta

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 16, generator=g), torch.randn(8, 4, generator=g)
    initial = torch.randn(8, 16, generator=g).to(torch.bfloat16)
    product = b @ a
    if transposed:
        initial = initial.T.contiguous()
        product = product.T
    weight = torch.empty_like(initial)
    Delta(a=a, b=b, scale=0.5, transposed=transposed).merge_into(weight, initial)
    assert weight.dtype == torch.bfloat16
    assert torch.equal(weight, (initial.float() + 0.5 * product).to(torch.bfloat16))
