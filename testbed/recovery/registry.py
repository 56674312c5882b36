"""The recovery strategies: each a registered object naming what it does, and how.

A strategy is a policy: the in-place cures it tries on a failed step, in
order (op retry, step retry, an elastic shrink; each leaves the step failed
when it does not apply), and how it goes back when none cured it (a restart
from storage, hot spares, in-memory replicas). Its traits tell the rest of
the run what it needs: each step's starting state kept in memory, hot spare
processes, in-memory replicas by default.

Strategies are found by name in :data:`testbed.core.registry.STRATEGIES`: the
ones below (this module is declared as the package's entry point of group
``testbed.recovery_strategies``, so the scenario can check a name without
importing this layer; a new strategy is an edit of this module alone), any
another installed package declares under that group, and any a program
registers (:func:`register_strategy`). Nothing outside this module compares a
strategy's name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from testbed.actors.outcome import Outcome
from testbed.core.registry import STRATEGIES
from testbed.recovery import elastic, replica, restart, retry
from testbed.recovery.context import Phase, RecoveryContext
from testbed.recovery.record import Recovery

Outcomes = dict[int, Outcome]
#: an in-place cure: the step's outcomes after it (unchanged when it does not apply)
Cure = Callable[[RecoveryContext, Phase, int, Outcomes], Outcomes]
#: going back: a recovery from saved state
GoBack = Callable[[RecoveryContext, Phase, int, Outcomes], Recovery]


@dataclass(frozen=True)
class Strategy:
    """A recovery strategy: its cures in place, how it goes back, and what it needs."""

    name: str
    description: str
    go_back: GoBack = restart.restart
    cures: tuple[Cure, ...] = ()
    #: standby NPU processes in each supernode (``policy.recovery.spares_per_supernode``)
    hot_spares: bool = False
    #: in-memory replicas every step unless ``policy.checkpoint.replica_every`` says otherwise
    replicas_by_default: bool = False
    #: each step's starting state kept in memory (a step retry or a shrink runs the step again)
    step_snapshot: bool = False

    def cure(self, ctx: RecoveryContext, phase: Phase, step: int, out: Outcomes) -> Outcomes:
        """The step's outcomes after the cures in place, in order, stopping once it succeeds."""
        for cure in self.cures:
            if all(o.ok for o in out.values()):
                break
            out = cure(ctx, phase, step, out)
        return out


def register_strategy(strategy: Strategy) -> Strategy:
    """Make ``strategy`` available to scenarios by its name."""
    STRATEGIES.register(strategy.name, strategy)
    return strategy


def strategy(name: str) -> Strategy:
    """The strategy ``policy.recovery.strategy`` names."""
    found: Strategy = STRATEGIES[name]
    return found


RESTART = register_strategy(
    Strategy("restart", "re-create lost NPUs, re-link, load the newest committed checkpoint, recompute")
)
OP_RETRY = register_strategy(
    Strategy(
        "op_retry",
        "re-run a failed collective after a hold (HCCL_OP_RETRY_ENABLE); restart if that fails",
        cures=(retry.op_retry,),
    )
)
STEP_RETRY = register_strategy(
    Strategy(
        "step_retry",
        "re-run the whole failed step from its starting state kept in memory; else restart",
        cures=(retry.step_retry,),
        step_snapshot=True,
    )
)
LADDER = register_strategy(
    Strategy(
        "ladder",
        "op retry, then step retry, then restart, as MindCluster's recovery ladder",
        cures=(retry.op_retry, retry.step_retry),
        step_snapshot=True,
    )
)
HOT_SPARE = register_strategy(
    Strategy(
        "hot_spare",
        "a standby NPU process of the same supernode takes the lost rank (spare_s, not restart_s)",
        go_back=restart.hot_spare,
        hot_spares=True,
    )
)
REPLICA = register_strategy(
    Strategy(
        "replica",
        "restart lost NPUs and restore every rank from in-memory replicas held in another supernode",
        go_back=replica.replica,
        replicas_by_default=True,
    )
)
ELASTIC = register_strategy(
    Strategy(
        "elastic",
        "drop the lost rank's data-parallel replica and train on; it rejoins after replace_s",
        cures=(elastic.shrink_if_able,),
        step_snapshot=True,
    )
)
