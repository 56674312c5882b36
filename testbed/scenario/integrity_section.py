"""``policy.integrity``: the silent-data-corruption detectors a job runs and what a detection does,
each field declared once (:mod:`testbed.scenario.fields`)."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.scenario.fields import choice, flag, integer, number, section


@dataclass(frozen=True)
class ValidatorPolicy:
    """``policy.integrity.validators``: NaN/Inf and spike checks on the loss and each rank's local
    gradient norm (Megatron's rule: a value ten times the recent ones is a spike)."""

    spike_factor: float = number(10.0, 1.0, 1e12, "a value this many times its recent median is a spike")
    window: int = integer(5, 1, 10_000, "recent healthy steps the median is taken over")


@dataclass(frozen=True)
class HashPolicy:
    """``policy.integrity.hash``: a hash of every rank's parameters, compared across the data-parallel
    replicas (Megatron's cross-replica check); a checkpoint of a step whose hash agreed is verified."""

    every: int = integer(10, 1, doc="steps between hashes")


@dataclass(frozen=True)
class ReplayPolicy:
    """``policy.integrity.replay``: a step the validators suspect is run again from its start, in place
    (Megatron's rerun): a different result means the first was a transient fault; the same result,
    run again on another NPU (``elsewhere``), means a persistent fault of the first NPU if it differs
    there, else a correct result (a false alarm). Every step keeps a snapshot of its start to replay
    from (``bytes / hbm_Bps`` each step)."""

    elsewhere: bool = flag(True, "when the step reproduces, run it again on another NPU")


@dataclass(frozen=True)
class StrikePolicy:
    """``policy.integrity.strikes``: an NPU attributed ``count`` times within ``window`` steps is
    excluded and its rank taken by a new NPU (Ascend's three strikes; Meta's lemon detection)."""

    count: int = integer(3, 1, 1000, "attributions that exclude an NPU")
    window: int = integer(100, 1, doc="steps the attributions must fall within")


#: what a detection does: go back to a checkpoint (``rollback``), or only journal it (``report``)
ON_DETECT = ("rollback", "report")
#: which checkpoint a rollback restores: the newest a hash vouched for, or the newest before the
#: detected step
RESTORE_FROM = ("verified", "newest")


@dataclass(frozen=True)
class IntegrityPolicy:
    """``policy.integrity``: detectors of silent data corruption and what a detection does."""

    validators: ValidatorPolicy | None = section(
        ValidatorPolicy, "NaN/Inf and spike validators (off when absent)", present_is_on=True
    )
    hash: HashPolicy | None = section(
        HashPolicy, "cross-replica parameter hash (off when absent)", present_is_on=True
    )
    replay: ReplayPolicy | None = section(
        ReplayPolicy, "replay a step the validators suspect (off when absent)", present_is_on=True
    )
    checksums: bool = flag(
        False, "an end-to-end checksum on every collective payload; a corrupted one is sent again"
    )
    on_detect: str = choice("rollback", lambda: ON_DETECT, "integrity action", "what a detection does")
    restore: str = choice(
        "verified", lambda: RESTORE_FROM, "checkpoint choice", "which checkpoint a rollback restores"
    )
    strikes: StrikePolicy | None = section(
        StrikePolicy, "exclude an NPU attributed this often (off when absent)", present_is_on=True
    )
    max_rollbacks: int = integer(10, 1, doc="rollbacks before the run is aborted")
    skip_batches: bool = flag(
        False,
        "a rollback also skips the batches the abandoned steps trained on (PaLM's remedy for a "
        "suspect stretch of data)",
    )
