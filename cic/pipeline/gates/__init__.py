"""Gates: their lifecycle (find, promote, confirm, withdraw), the rows they are stored as, their certificates
re-checked before serving, the serving state said the same way everywhere, system and anytime gates, and answering
with a live gate."""
