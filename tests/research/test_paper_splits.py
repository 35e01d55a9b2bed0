"""Each dataset's paper split: its simulate flags (none for simulate's default) and its model."""

from __future__ import annotations

from fedfair.research.methods import METHODS
from fedfair.research.paper_splits import PAPER_SPLITS, PaperSplit, paper_split


def test_each_dataset_has_its_paper_split() -> None:
    assert paper_split("adult").flags == () and paper_split("census-income").flags == ()
    assert paper_split("rand-hie").flags == ("--partition", "site", "--clients", "6")
    assert paper_split("mnist").flags == ("--partition", "class", "--clients", "10")
    assert paper_split("census-income", "previous_state", 51).flags == (
        "--partition", "previous_state", "--clients", "51",
    )  # fmt: skip
    assert PAPER_SPLITS["rand-hie"].model == "logreg" and PAPER_SPLITS["mnist"].model == "mlp"
    # A split without the groups FedMinMax is told (one digit per client) leaves FedMinMax out.
    assert not METHODS["fedsrcvar"].needs_groups and METHODS["fedminmax"].needs_groups
    assert paper_split("census-income", "previous_state", 51).describe() == "by previous_state (51 clients)"
    assert paper_split("nobody's") == PaperSplit("iid", 3)
