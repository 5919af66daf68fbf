"""A generation read as it decodes: the serving layer's side of ``Backend.stream``.

``TokenStream.open`` waits for the first step, so the weight version is known before anything is
sent and whatever fails before the first token is an ordinary error. ``steps`` then yields each
step, checking that every step and the final output carry that one version (the backend leases it
for the whole generation), and sets ``output``, the ``GenerateOutput`` that ``generate`` would have
returned. Every wait on the backend goes through the serving layer's ``guard``: its deadline, and
engine failures as 503.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from .backends.base import BackendError, GenerateOutput, Streamed, StreamStep

Item = StreamStep | GenerateOutput
Guard = Callable[[Awaitable[Any]], Awaitable[Any]]


class TokenStream:
    def __init__(
        self,
        items: Streamed,
        first: Item,
        guard: Guard,
        on_output: Callable[[GenerateOutput], None],
    ) -> None:
        self._items, self._first, self._guard, self._on_output = items, first, guard, on_output
        self.output: GenerateOutput | None = None

    @classmethod
    async def open(cls, items: Streamed, guard: Guard, on_output: Callable[[GenerateOutput], None]) -> TokenStream:
        try:
            first = await guard(anext(items))
        except BaseException:
            await items.aclose()
            raise
        return cls(items, first, guard, on_output)

    @property
    def weight_version(self) -> int:
        return self._first.weight_version

    async def steps(self) -> AsyncGenerator[StreamStep, None]:
        """Each decoding step as it arrives; ``output`` is set once the last one has been read."""
        async with contextlib.aclosing(self._items):
            item = self._first
            while isinstance(item, StreamStep):
                self._check(item)
                yield item
                item = await self._guard(anext(self._items))
        self._check(item)
        self.output = item
        self._on_output(item)

    async def aclose(self) -> None:
        """Stop the generation (a reader that leaves early); the backend stops decoding."""
        await self._items.aclose()

    def _check(self, item: Item) -> None:
        if item.weight_version != self.weight_version:
            raise BackendError(
                f"the backend changed weights within a stream: version {self.weight_version}, "
                f"then {item.weight_version}"
            )
