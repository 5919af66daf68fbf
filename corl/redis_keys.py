"""Every Redis key name of a run, in one place: ``corl:{run}:<type>:<id>``."""

from __future__ import annotations


def _k(run: str, *parts: object) -> str:
    return ":".join(["corl", run, *map(str, parts)])


def batches_stream(run: str, member: str) -> str:
    """Graded batches for one member's trainer (stream, consumer group ``trainer``)."""
    return _k(run, "batches", member)


TRAINER_GROUP = "trainer"


def trainer_state(run: str, member: str) -> str:
    """Durable trainer record: applied batch ids, weight version (hash)."""
    return _k(run, "trainer", member)


# --- aggregator -----------------------------------------------------------------------------------


def round_state(run: str) -> str:
    """Durable round record (hash): ``next_round``, ``cursor`` (prompt source position), ``reliability``."""
    return _k(run, "rounds", "state")


def batch_marker(run: str, batch_id: str) -> str:
    """Set once when a graded batch is appended: a retried round adds no duplicate (string, TTL)."""
    return _k(run, "batchmark", batch_id)


def round_stats(run: str) -> str:
    """Per-round diagnostics, one entry per round, field ``stats`` (stream, MAXLEN ~)."""
    return _k(run, "stats", "rounds")


def posted_prompts(run: str) -> str:
    """Prompts posted to ``POST /v1/prompts``, read in order from the round cursor (list)."""
    return _k(run, "prompts", "posted")


def graders(run: str) -> str:
    """Registered external graders: name -> JSON record {mode, url, token_sha256} (hash)."""
    return _k(run, "graders", "registry")


def grader_tokens(run: str) -> str:
    """sha256(token) -> grader name (hash); tokens themselves are never stored."""
    return _k(run, "graders", "tokens")


def grading_task(run: str, task_id: str) -> str:
    """One pull-mode grading task (hash, TTL past its deadline)."""
    return _k(run, "gtask", task_id)


def grading_queue(run: str, grader: str) -> str:
    """Task ids waiting for a pull grader (list, TTL)."""
    return _k(run, "gqueue", grader)


def grading_leases(run: str, grader: str) -> str:
    """Task ids leased to a pull grader, scored by lease expiry (sorted set, TTL)."""
    return _k(run, "gleases", grader)


def grading_results(run: str, round_: int) -> str:
    """Scores of one round's pull tasks: ``{task_id}:{grader}`` -> score, written with HSETNX (hash, TTL)."""
    return _k(run, "gresults", round_)


def grader_rate(run: str, grader: str, window: int) -> str:
    """Request counter of one grader in one rate-limit window (string, TTL)."""
    return _k(run, "grate", grader, window)


# --- trainer --------------------------------------------------------------------------------------


def trainer_applied(run: str, member: str) -> str:
    """Batch ids whose step is in a durable checkpoint, added atomically with their XACK (set)."""
    return _k(run, "trainer", member, "applied")


def trainer_dropped(run: str, member: str) -> str:
    """Batch ids dropped as stale (generated too many versions ago), added with their XACK (set)."""
    return _k(run, "trainer", member, "dropped")


def graders_seen(run: str) -> str:
    """Grader name -> unix time of its last authenticated request (hash): only live pull graders get tasks."""
    return _k(run, "graders", "seen")


def heldout_accuracy(run: str) -> str:
    """Latest held-out accuracy per member, as the run's evaluator (``corl serve evaluator``, or ``corl
    run``'s monitor) measured it: hash member -> ``HeldoutAccuracy`` JSON ``{accuracy, weight_version,
    at}``, with a TTL. The aggregator's stats and dashboard read it."""
    return _k(run, "eval", "heldout")


# --- experiment tracking --------------------------------------------------------------------------


def tracking_run(run: str) -> str:
    """The run's identity in experiment trackers, claimed with HSETNX by whichever process comes first
    (hash: ``key`` -> run key, ``mlflow:<uri>`` -> MLflow run id). Durable, like the round record: a
    resumed run goes on in the same tracker runs."""
    return _k(run, "tracking", "run")


# --- the harvesting gateway -----------------------------------------------------------------------


def harvest_pool(run: str) -> str:
    """Harvested conversations, newest last, field ``prompt`` a ``HarvestedPrompt`` (stream, MAXLEN
    gateway.harvest.max_prompts, trimmed by age to its retention_s); the ``harvest`` prompt source reads it."""
    return _k(run, "harvest", "pool")


def harvest_seen(run: str, digest: str) -> str:
    """Set when a conversation (its redacted text's sha256) is harvested: a repeat within the retention
    window is not stored again (string, TTL retention_s)."""
    return _k(run, "harvest", "seen", digest)


def harvest_stats(run: str) -> str:
    """Run-wide harvest counters (hash): ``harvested``, ``redacted`` (conversations with a redaction),
    ``dropped:<reason>``, ``trained_on`` (harvested prompts in committed rounds). Durable, like the round
    record; the gateway's and the aggregator's /metrics count the same events per process."""
    return _k(run, "harvest", "stats")
