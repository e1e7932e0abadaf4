"""Prefect flows: the CIC pipeline end to end, calibration, scheduled recalibration."""
