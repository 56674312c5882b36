"""For tests and CI: chaos drills, Hypothesis strategies, the state machine, the pytest plugin, the suite."""
