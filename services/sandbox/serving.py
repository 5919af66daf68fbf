"""The sandbox service's serving layer: programs run in this host's jail, a bounded number at a time."""

from __future__ import annotations

import asyncio
from dataclasses import fields

from corl.proto import RunProgramRequest, RunProgramResponse
from corl.sandbox import Limits
from corl.sandbox.runner import run_here
from corl.services.errors import UnavailableError
from corl.services.http import ServiceMetricSet

from .settings import SandboxSettings

PROGRAM_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class SandboxMetrics(ServiceMetricSet):
    def __init__(self) -> None:
        super().__init__("corl_sandbox")
        self.programs = self.counter("programs", "Programs run, by how they ended.", "status")
        self.seconds = self.histogram("program_seconds", "Wall time of one program.", buckets=PROGRAM_BUCKETS)
        self.waiting = self.gauge("programs_waiting", "Programs waiting for a free slot.")


class SandboxServing:
    def __init__(self, settings: SandboxSettings, metrics: SandboxMetrics):
        self.settings, self.metrics = settings, metrics
        self._slots = asyncio.Semaphore(settings.max_concurrent)
        self._waiting = 0

    async def run(self, req: RunProgramRequest) -> RunProgramResponse:
        if self._waiting >= self.settings.max_queued:
            raise UnavailableError(f"{self._waiting} programs are waiting already: retry later")
        limits = Limits(**{f.name: getattr(req.limits, f.name) for f in fields(Limits) if f.name != "uid"})
        self._waiting += 1
        self.metrics.waiting.set(self._waiting)
        try:
            await self._slots.acquire()
        finally:
            self._waiting -= 1
            self.metrics.waiting.set(self._waiting)
        try:
            res = await asyncio.to_thread(run_here, req.source, limits)  # never another service
        finally:
            self._slots.release()
        self.metrics.programs.labels(res.status).inc()
        self.metrics.seconds.observe(res.seconds)
        return RunProgramResponse(
            status=res.status, returncode=res.returncode, stdout=res.stdout, stderr=res.stderr, seconds=res.seconds
        )
