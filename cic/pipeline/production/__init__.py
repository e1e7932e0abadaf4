"""Production: ingest of labelled traffic (records, changes, journal), the windows and the nightly recalibration of
single and system gates, the anytime-valid monitor and the alerts it raises."""
