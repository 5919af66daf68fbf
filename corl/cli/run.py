def run() -> None:
    """Not built yet."""
    raise SystemExit("not built yet")
