"""Inference backends behind the model server; see ``base.Backend``."""

from __future__ import annotations

from .base import Backend


def create_backend(kind: str, *, model_dir: str, name: str, initial_version: int = 0, **options: object) -> Backend:
    """Build a backend by name; engines are imported only when chosen.

    Every backend takes ``(model_dir, name, initial_version, **options)``; options are engine
    specific (``device``, ``num_threads`` for transformers; ``gpu_memory_utilization`` etc. for vLLM).
    """
    if kind == "transformers":
        from .transformers import TransformersBackend

        return TransformersBackend(model_dir=model_dir, name=name, initial_version=initial_version, **options)  # type: ignore[arg-type]
    if kind == "vllm":
        from .vllm import VLLMBackend  # type: ignore[import-not-found,unused-ignore]

        return VLLMBackend(model_dir=model_dir, name=name, initial_version=initial_version, **options)  # type: ignore[no-any-return,arg-type,unused-ignore]
    raise ValueError(f"unknown backend {kind!r}; known: transformers, vllm")
