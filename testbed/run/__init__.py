"""One run from start to verdict: the controller's training loop and the runner around it."""
