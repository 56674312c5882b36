"""Many runs of one scenario: strategy comparison, field sweeps, timeout tuning, and the benchmarks."""
