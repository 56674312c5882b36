"""The base every layer stands on: the error types, units, seeded random streams and the journal."""
