"""Programs that break the protocol or misbehave: the resume audit's bad inputs."""
