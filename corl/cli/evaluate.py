def eval_cohort() -> None:
    """Not built yet."""
    raise SystemExit("not built yet")
