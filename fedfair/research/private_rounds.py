"""What a baseline under distributed DP keeps across its rounds besides the model.

TERM's, PropFair's and Delta-FL's private runs alike: the task's round callback, the sampled history, and at the
end the sites' privacy reports beside the secure sum's noise.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from fedfair.core import server
from fedfair.privacy.learner import PrivateLearner
from fedfair.research.task import Task
from fedfair.simulation.federation import history_sample
from fedfair.simulation.rounds import SimulationResult, round_record
from fedfair.simulation.secure import SecureSum


class PrivateRounds:
    """One private run's bookkeeping: call :meth:`applied` after each round, :meth:`result` once at the end."""

    def __init__(self, task: Task, template: nn.Module) -> None:
        self.task, self.template = task, template
        self.pooled = history_sample(task.federation) if task.options.record_every else None
        self.history: list[dict[str, float]] = []

    def applied(self, state: server.ServerState) -> None:
        """After a round: the task's callback, and a history row every `record_every` rounds and at the last."""
        if self.task.on_round is not None:
            self.task.on_round(state)
        every, last = self.task.options.record_every, self.task.training.rounds
        if self.pooled is not None and (state.round % every == 0 or state.round == last):
            self.history.append(round_record(self.template, state, self.pooled, None))

    def result(
        self, state: server.ServerState, trainers: Sequence[PrivateLearner], summed: SecureSum | None
    ) -> SimulationResult:
        """The run's result: its model, history, every site's privacy report and the noise the secure sum added."""
        reports = {trainer.name: trainer.report().to_dict() for trainer in trainers}
        noise = summed.noise_report() if summed is not None else {}
        return SimulationResult(state=state, model=self.template, history=self.history, privacy=reports, noise=noise)
