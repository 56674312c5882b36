"""What a run's journal says: the checks, invariants, goodput, the hotspot, the faults table, summary,
JUnit, figures.
"""
