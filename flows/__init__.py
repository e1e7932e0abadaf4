"""Prefect flows: the CIC pipeline end to end, calibration of stored results, ingest of production records and
scheduled recalibration."""
