"""One pipeline run: preflight, progress, the stored calibration of a run's groups, what a run returns and how it
reads."""
