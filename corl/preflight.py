"""Before anything starts: does every member's model exist, and does the run fit this machine?

``corl run``, ``corl eval`` and ``corl experiment`` call ``preflight`` before they start Redis or
any process. Each member's size comes from its ``config.json`` and the headers of its safetensors
files (no weight is read), and each process's memory is estimated from it and the cohort config:

- a model server holds two copies of the weights (the serving slot and the spare a swap loads
  into), with LoRA the initial values of the weights an adapter targets, and the key/value cache
  and logits of one round's samples;
- a trainer holds the weights, the gradients and AdamW's two moments of what it trains (the adapter
  with LoRA, every weight without), a reference copy for a KL term without LoRA, the activations of
  one micro-batch and its logits over the vocabulary (the response positions only: Gemma's 262k
  vocabulary makes these the largest item at large micro-batches).

The figures are estimates of the resident size once every process is up, not bounds: on the
three-family cohort they are within 20% of the servers' resident sizes and a third of the
trainers' peaks, in both directions (``docs/RESULTS.md``); while a server loads, the checkpoint's mapped
pages count as resident too (page cache, not new memory). A run that does not fit is refused
with a table that names each process and its figure; ``--force`` goes on anyway.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from corl.config import CohortConfig, MemberConfig

GB = 1024**3
PROCESS_BASE = int(0.4 * GB)  # a Python process with torch and transformers imported
AGGREGATOR = int(0.4 * GB)  # the aggregator, Redis and the run's own process together
PROMPT_TOKENS = 128  # allowance for a rendered prompt (a few-shot template, a GSM8K problem)
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}  # the config's dtype, as loaded


class PreflightError(ValueError):
    """A member's model is missing or unreadable."""


@dataclass(frozen=True)
class ModelShape:
    """What the estimates need of one member's model, read from its directory."""

    params: int
    bytes_per_param: int  # as loaded (the config's dtype)
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    kv_width: int  # key/value heads x head size
    tied: bool = True  # the LM head is the embedding matrix

    @property
    def linear_params(self) -> int:
        """Parameters outside the embedding matrix and the LM head: what an all-linear adapter targets."""
        return max(self.params - self.vocab * self.hidden * (1 if self.tied else 2), 0)

    def lora_params(self, r: int) -> int:
        """An all-linear rank-``r`` adapter: per layer, r x (in + out) of the attention's four
        projections and the MLP's three."""
        h, i, kv = self.hidden, self.intermediate, self.kv_width
        per_layer = (h + h) + 2 * (h + kv) + (h + h) + 2 * (h + i) + (i + h)
        return r * self.layers * per_layer


def model_shape(model: str | Path) -> ModelShape:
    """The shape of the model in directory ``model``; ``PreflightError`` when it is not one."""
    path = Path(model)
    if not path.is_dir():
        raise PreflightError(f"{model}: no such model directory")
    config_file = path / "config.json"
    files = sorted(path.glob("*.safetensors"))
    if not config_file.is_file() or not files:
        raise PreflightError(f"{model}: not a model directory (needs config.json and *.safetensors)")
    cfg = json.loads(config_file.read_text())
    cfg = {**cfg.get("text_config", {}), **cfg}  # multimodal configs keep the text model's sizes apart

    def first(*keys: str, default: int = 0) -> int:
        return next((int(cfg[k]) for k in keys if isinstance(cfg.get(k), int)), default)

    hidden = first("hidden_size", "n_embd", "d_model")
    heads = first("num_attention_heads", "n_head", default=1)
    head_dim = first("head_dim", default=hidden // max(heads, 1))
    params = sum(_header_params(f) for f in files)
    return ModelShape(
        params=params,
        bytes_per_param=_DTYPE_BYTES.get(str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32"), 4),
        vocab=first("vocab_size"),
        hidden=hidden,
        intermediate=first("intermediate_size", "n_inner", default=4 * hidden),
        layers=first("num_hidden_layers", "n_layer", "num_layers"),
        kv_width=first("num_key_value_heads", default=heads) * head_dim,
        tied=bool(cfg.get("tie_word_embeddings", True)),
    )


def _header_params(file: Path) -> int:
    """Parameters in a safetensors file, from its JSON header alone."""
    try:
        with file.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
    except (OSError, ValueError, struct.error) as err:
        raise PreflightError(f"{file}: not a readable safetensors file ({err})") from None
    return sum(math.prod(entry["shape"]) for name, entry in header.items() if name != "__metadata__")


@dataclass(frozen=True)
class Need:
    """One process's estimated resident memory, with the items that make it up."""

    process: str
    items: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.items.values())


def server_need(member: MemberConfig, shape: ModelShape, cfg: CohortConfig) -> Need:
    rc, b = cfg.rounds, shape.bytes_per_param
    rows = rc.prompts_per_round * rc.samples_per_prompt
    seq = PROMPT_TOKENS + cfg.sampling().max_tokens
    items = {
        "runtime": PROCESS_BASE,
        "weights x2": 2 * shape.params * b,
        "kv cache": rows * seq * shape.layers * 2 * shape.kv_width * b,
        "logits": rows * shape.vocab * 4 * 3,
    }
    if cfg.training.lora is not None and member.role == "trained":
        items["adapter's initial weights"] = shape.linear_params * b
    return Need(f"server {member.name}", items)


def trainer_need(member: MemberConfig, shape: ModelShape, cfg: CohortConfig) -> Need:
    tc, b = cfg.training, shape.bytes_per_param
    response = cfg.sampling().max_tokens
    micro = tc.micro_batch_size or cfg.rounds.prompts_per_round * cfg.rounds.samples_per_prompt
    trained = shape.params if tc.lora is None else shape.lora_params(tc.lora.r)
    if tc.gradient_checkpointing:  # every row runs its own prompt; a layer's input is kept per token
        tokens, per_token = micro * (PROMPT_TOKENS + response), 2 * shape.hidden * b
    else:  # a micro-batch's prompt runs once (trainer/losses.py)
        tokens, per_token = PROMPT_TOKENS + micro * response, (8 * shape.hidden + shape.intermediate) * b
    items = {
        "runtime": PROCESS_BASE,
        "weights": shape.params * b,
        "gradients + AdamW": trained * b * 3 + (trained * b if tc.lora is not None else 0),
        "activations": tokens * shape.layers * per_token,
        "logits": micro * (response + 1) * shape.vocab * 4 * 4,  # logits, float copy, log-softmax, gradient
    }
    if tc.beta > 0 and tc.lora is None:
        items["reference weights"] = shape.params * b
    if tc.lora is None and tc.weight_transfer == "broadcast":  # the CPU copy a version is sent and written from
        items["broadcast snapshot"] = shape.params * b
    return Need(f"trainer {member.name}", items)


def disk_need(cfg: CohortConfig, shapes: dict[str, ModelShape]) -> int:
    """Bytes the weights store and the checkpoints reach: ``keep_versions`` published versions and
    two checkpoints (weights or adapter, and AdamW's moments) per trained member."""
    tc, total = cfg.training, 0
    for m in cfg.members:
        if m.role != "trained":
            continue
        s = shapes[m.name]
        published = (s.params if tc.lora is None else s.lora_params(tc.lora.r)) * s.bytes_per_param
        total += tc.keep_versions * published + 2 * 3 * published
    return total


@dataclass(frozen=True)
class Report:
    needs: list[Need]
    memory_available: int
    disk_needed: int
    disk_available: int

    @property
    def memory_needed(self) -> int:
        return sum(n.total for n in self.needs) + AGGREGATOR

    @property
    def fits(self) -> bool:
        return self.memory_needed <= self.memory_available and self.disk_needed <= self.disk_available


def check(cfg: CohortConfig, run_dir: Path, *, trainers: bool = True, memory_available: int | None = None) -> Report:
    """Every member's model must exist (``PreflightError`` names the first that does not); the
    processes of a run (``trainers=False``: servers only, as ``corl eval`` starts) are estimated."""
    endpoint_keys(cfg)
    sandbox_ready(cfg)
    served = cfg.served_members()  # an outside endpoint runs elsewhere: it needs nothing of this machine
    shapes = {m.name: model_shape(m.model_path()) for m in served}
    needs = [server_need(m, shapes[m.name], cfg) for m in served]
    if trainers:
        needs += [trainer_need(m, shapes[m.name], cfg) for m in served if m.role == "trained"]
    return Report(
        needs=needs,
        memory_available=machine_memory() if memory_available is None else memory_available,
        disk_needed=disk_need(cfg, shapes) if trainers else 0,
        disk_available=shutil.disk_usage(_existing(run_dir)).free,
    )


def sandbox_ready(cfg: CohortConfig) -> None:
    """A task that runs programs needs the sandbox's jail here (``PreflightError`` says what is missing),
    unless the config allows the insecure launcher."""
    from corl.sandbox import SandboxUnavailable, require_sandbox
    from corl.tasks import get_task

    if not get_task(cfg.task.name).runs_code or cfg.sandbox.allow_insecure:
        return
    try:
        require_sandbox()
    except SandboxUnavailable as err:
        raise PreflightError(str(err)) from None


def endpoint_keys(cfg: CohortConfig) -> None:
    """Every outside endpoint's ``api_key_env`` variable is set (``PreflightError`` naming the first that
    is not): the aggregator reads the keys when it starts."""
    for m in cfg.members:
        if m.endpoint is not None:
            try:
                m.endpoint.api_key()
            except KeyError as err:
                raise PreflightError(f"member {m.name}: {err.args[0]}") from None


def machine_memory() -> int:
    """Memory a new run can use now: ``MemAvailable``, or the cgroup's limit less its usage when
    that is lower (a container given less than the machine has)."""
    available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit != "max":
            available = min(available, int(limit) - used)
    except (OSError, ValueError):
        pass
    return available


def _existing(path: Path) -> Path:
    path = path.resolve()
    while not path.exists():
        path = path.parent
    return path


def gb(n: int) -> str:
    return f"{n / GB:.1f} GB"


def table_rows(report: Report) -> Sequence[tuple[str, str, str]]:
    """(process, estimate, its two largest items) per process, then the totals."""
    rows = []
    for n in report.needs:
        top = sorted(n.items.items(), key=lambda kv: -kv[1])[:2]
        rows.append((n.process, gb(n.total), ", ".join(f"{k} {gb(v)}" for k, v in top)))
    rows.append(("aggregator, Redis, this process", gb(AGGREGATOR), ""))
    mem_ok = report.memory_needed <= report.memory_available
    rows.append(
        (
            "memory, all processes",
            gb(report.memory_needed),
            f"available {gb(report.memory_available)}" + ("" if mem_ok else ": DOES NOT FIT"),
        )
    )
    disk_ok = report.disk_needed <= report.disk_available
    rows.append(
        (
            "disk, weights store + checkpoints",
            gb(report.disk_needed),
            f"free {gb(report.disk_available)}" + ("" if disk_ok else ": DOES NOT FIT"),
        )
    )
    return rows
