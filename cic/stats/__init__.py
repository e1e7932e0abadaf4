"""The exact statistics core (numpy + scipy only): bounds, searches, calibration, the split protocol,
simulation, baselines, the serving gate, drift tests and risk–coverage curves.

Nothing here loads a model or a service, so `import cic` stays instant and safe in a serving process.
"""
