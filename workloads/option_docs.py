"""What each option of the testbed's workloads means, with its unit (the scenario schema and docs say it)."""

from __future__ import annotations

#: the ``mlp`` workload's options
MLP: dict[str, str] = {
    "layers": "blocks (layers) of the model",
    "inputs": "input features of each sample",
    "batch": "samples per step over every replica",
    "samples": "samples in the seeded dataset",
    "lr": "peak learning rate",
    "min_lr": "learning rate at the end of the cosine decay",
    "warmup": "steps of linear warm-up",
    "weight_decay": "AdamW's weight decay",
    "dropout": "dropout probability (per-rank RNG)",
    "clip": "gradient clipping by global norm",
    "hidden": "hidden width of each layer",
    "workspace_min_kib": "KiB: the smallest workspace a step takes in device memory (0: none)",
    "workspace_max_kib": "KiB: the largest workspace, reached by the last step (a curriculum)",
    "keep_kib": "KiB every step leaves behind in device memory (pins the cached blocks around it)",
}

#: the ``transformer`` workload's options
TRANSFORMER: dict[str, str] = {
    "layers": "blocks (layers) of the model",
    "inputs": "input features of each sample",
    "batch": "samples per step over every replica",
    "samples": "samples in the seeded dataset",
    "lr": "peak learning rate",
    "min_lr": "learning rate at the end of the cosine decay",
    "warmup": "steps of linear warm-up",
    "weight_decay": "AdamW's weight decay",
    "dropout": "dropout probability (per-rank RNG)",
    "clip": "gradient clipping by global norm",
    "d_model": "model width",
    "outputs": "output features",
    "ffn": "a dense block's hidden width (cut by TP)",
    "moe_every": "every n-th block is a mixture of experts (0: none)",
    "experts": "experts of a MoE block (cut by EP)",
    "top_k": "experts each token is routed to",
    "expert_ffn": "an expert's hidden width",
    "router_skew": "a logit added to expert 0's gate (a skewed router)",
    "micro_batches": "micro-batches per replica and step (the 1F1B pipeline's)",
    "zero": "1: the distributed optimizer (reduce-scatter and allgather of the gradients)",
}
