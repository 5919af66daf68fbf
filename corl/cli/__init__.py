"""The ``corl`` command. Each subcommand lives in its own module and imports heavy code lazily."""

from __future__ import annotations

import typer

from . import (
    cohort,
    data,
    evaluate,
    experiment,
    plan,
    proto,
    run,
    secrets,
    serve,
    serve_aggregator,
    serve_evaluator,
    serve_gateway,
    serve_sandbox,
    train,
)

app = typer.Typer(help="Peer-rewarded cohort training.", no_args_is_help=True, add_completion=False)
app.add_typer(cohort.app, name="cohort", help="Build and inspect cohorts.")
serve.app.command("aggregator", help="Run the reward aggregator of a run.")(serve_aggregator.aggregator)
serve.app.command("evaluator", help="Read a run's held-out accuracy through its servers.")(serve_evaluator.evaluator)
serve.app.command("sandbox", help="Run untrusted programs for services whose host refuses the jail.")(
    serve_sandbox.sandbox
)
serve.app.command("gateway", help="Forward agents' OpenAI calls to the members and harvest them.")(
    serve_gateway.gateway
)
app.add_typer(serve.app, name="serve", help="Run a service (model server, aggregator, evaluator, gateway).")
app.add_typer(proto.app, name="proto", help="The wire contract's exported schemas.")
app.add_typer(secrets.app, name="secrets", help="Check or make deployment secrets.")
app.command("eval", help="Evaluate every member of a cohort on the task's held-out split.")(evaluate.eval_cohort)
app.add_typer(data.app, name="data", help="Show what the config's task source yields; import logged agent traffic.")
app.command("train", help="Run one member's trainer.")(train.train)
app.command("run", help="Run the whole loop on this machine (embedded default).")(run.run)
app.command("plan", help="Show which GPUs each process of a run gets on one node.")(plan.plan_command)
app.command("experiment", help="Compare reward modes on the same starting cohort.")(experiment.experiment)
app.command("experiment-table", help="Combine experiments' results into one table.")(experiment.experiment_table)
app.command("experiment-guard", help="Replay the collapse guard on finished runs.")(experiment.experiment_guard)
app.command("experiment-answers", help="A run's greedy answers before and after, as the reader grades them.")(
    experiment.experiment_answers
)


def main() -> None:
    app()
