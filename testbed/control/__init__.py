"""The control plane of one run, from start to verdict: the runner around it, the controller's
training loop, fault injection, checkpoint commit and the safeguards."""
