"""Each dataset's client split and model in the paper (or for its stand-in), for `fedfair reproduce`."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class PaperSplit:
    """How the paper (or its stand-in) splits a dataset into clients, and the model it trains."""

    partition: str
    clients: int
    model: str | None = None
    """The paper's model for this dataset; None: the profile's."""

    @property
    def flags(self) -> tuple[str, ...]:
        """The split's `fedfair simulate` flags.

        None for simulate's own default (race, 3 clients), so the runs of Adult and Census-Income keep their
        cache keys.
        """
        if (self.partition, self.clients) == ("race", 3):
            return ()
        return ("--partition", self.partition, "--clients", str(self.clients))

    def describe(self) -> str:
        """The split for a table caption: ``by race (3 clients)``."""
        return f"by {self.partition} ({self.clients} clients)"


PAPER_SPLITS = {
    "adult": PaperSplit("race", 3),
    "census-income": PaperSplit("race", 3),
    "rand-hie": PaperSplit("site", 6, "logreg"),
    "mnist": PaperSplit("class", 10, "mlp"),
}
"""Each dataset's split in `reproduce`: Adult and Census-Income (the stand-in for ACS Employment)
by race into White / Black / Other; RAND HIE, the stand-in for eICU's hospitals, by its 6 sites with
eICU's logistic regression; MNIST one digit per client with the MLP. `--partition previous_state
--clients 51` gives Census-Income's 51 sites (data/README.md says why that column)."""


def paper_split(dataset: str, partition: str | None = None, clients: int | None = None) -> PaperSplit:
    """`dataset`'s client split: its paper split unless `partition` or `clients` say otherwise."""
    default = PAPER_SPLITS.get(dataset, PaperSplit("iid", 3))
    return replace(
        default,
        partition=default.partition if partition is None else partition,
        clients=default.clients if clients is None else clients,
    )
