"""The job model: what a team's training job costs in time, memory and checkpoint bytes (docs/job.md)."""
