"""Model building and sampling shared by the cohort builder, the serving backends and evaluation."""
