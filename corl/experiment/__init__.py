"""``corl experiment``: the same starting cohort trained under each reward mode, through the real services."""
