"""The embedded default: every service of a run as local processes on one machine."""
