"""`fedfair plan show` says which check a plan's secure sums get, from the library's own rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfair import cli
from fedfair.runtime.plan import sum_check
from fedfair.runtime.plan.sum_check import sum_check_lines
from fedfair.secagg import config as secagg_config
from fedfair.secagg.config import RESUMMED_WORDS
from tests.runtime.harness import new_workspace
from tests.secagg.helpers import make_config


def test_a_small_model_is_re_summed_by_every_site_and_a_leaver_costs_no_round(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace = new_workspace(
        tmp_path, ("site-a", "site-b", "site-c"), secure_aggregation={"enabled": True, "max_colluding": 0}
    )
    assert cli.main(["plan", "show", "--plan", str(workspace.plan)]) == 0
    out = capsys.readouterr().out
    assert "sums re-summed by every site (sound up to max_colluding = 0 colluders)" in out, out
    assert f"every site re-sums up to d = {RESUMMED_WORDS // 3 - 1:,} at n = 3" in out, out
    assert "leaves before its tag of a sum costs no round" in out, out


def test_above_the_bound_sites_re_check_each_other_and_a_leavers_round_alone_is_re_summed() -> None:
    """One soundness at every size: up to max_colluding colluders, re-summed below the bound and re-checked above."""
    largest = RESUMMED_WORDS // 10 - 1
    below = sum_check_lines(make_config(10, dimension=largest, max_colluding=1))[0]
    assert "sums re-summed by every site (sound up to max_colluding = 1 colluders)" in below, below
    above = sum_check_lines(make_config(10, dimension=largest + 1, max_colluding=1))
    assert above[0].startswith(
        "training sums: sums re-checked, each site's masked input by 2 other sites (sound up to max_colluding = 1 "
        "colluders; a site downloads 2 masked inputs"
    ), above
    alone = sum_check_lines(make_config(10, dimension=largest + 1, max_colluding=0))[0]
    assert alone.startswith("training sums: tags (sound up to max_colluding = 0 colluders: the aggregator alone)")
    assert "costs no round: that round alone is re-summed by every other site" in above[1], above
    assert f"{10 * (largest + 2):,} words, are sent with the tags" in above[1], above


def test_on_a_secagg_plus_graph_a_leaver_voids_its_round_though_every_site_re_sums() -> None:
    lines = sum_check_lines(make_config(6, neighbours=3, threshold=3))
    assert "sums re-summed by every site" in lines[0] and "voids that round" in lines[1], lines


def test_no_re_check_is_promised_where_the_plan_allows_no_colluder(monkeypatch: pytest.MonkeyPatch) -> None:
    # The re-check red team's finding 3: with max_colluding = 0 above the bound nothing re-checks.
    monkeypatch.setattr(secagg_config, "RESUMMED_WORDS", 0)
    monkeypatch.setattr(sum_check, "RESUMMED_WORDS", 0)
    alone, colluders = make_config(3, max_colluding=0), make_config(4, max_colluding=1)
    assert not alone.rechecked and colluders.rechecked
    line = sum_check.sum_check_lines(alone)[0]
    assert "tags (sound up to max_colluding = 0 colluders: the aggregator alone)" in line
    assert "re-checks" not in line and line.endswith("checks the tags (no colluder to re-check against)")
    assert sum_check.sum_check_lines(colluders)[0].endswith("and above that re-checks")


def test_plan_show_states_the_soundness_the_input_bound_gets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """init's plan with an auditor: B = 2^20 (update_norm 1, weight 1, 20 bits) takes 151 range tests at 2^-64 a try
    (docs/security.md's table), against the field's limit of 2^43.4 at the model's d."""
    assert cli.main(["init", str(tmp_path / "fed"), "--sites", "a,b,c", "--auditor", "audit-co"]) == 0
    capsys.readouterr()
    assert cli.main(["plan", "show", "--plan", str(tmp_path / "fed" / "aggregator" / "plan.toml")]) == 0
    out = capsys.readouterr().out
    assert "input bound: two verifiers" in out, out
    assert "input bound soundness: 151 range tests a try" in out and "at most 2^-64." in out, out
    assert "B^2 = 2^40.0 (encoded scale), the field's limit at d = " in out and " 2^43.4" in out, out
