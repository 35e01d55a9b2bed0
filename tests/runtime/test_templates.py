"""The committed templates are the rendering of fedfair.runtime.plan.templates, and every rendering loads."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

from fedfair.runtime.plan import config_template, template_base, templates
from fedfair.runtime.collaborator.config import parse_collaborator_config
from fedfair.runtime.plan.aggregator_plan import parse_aggregator_plan

REPOSITORY = Path(__file__).resolve().parents[2]
REGENERATE = "regenerate them with `python -m fedfair.runtime.plan.templates --write` from the repository's root"


def test_the_committed_templates_are_the_rendering_of_the_demo() -> None:
    for path, text in templates.committed_templates(REPOSITORY).items():
        assert path.read_text() == text, f"{path} differs from fedfair.runtime.plan.templates; {REGENERATE}"


def test_the_module_lists_stale_templates_and_rewrites_them(tmp_path: Path) -> None:
    for folder in ("aggregator", "collaborator"):
        shutil.copytree(REPOSITORY / folder, tmp_path / folder)
    assert templates.main(["--root", str(tmp_path)]) == 0
    plan = tmp_path / "aggregator" / "plan.toml"
    plan.write_text(plan.read_text().replace("rounds = 50", "rounds = 51"))
    assert templates.main(["--root", str(tmp_path)]) == 1
    assert templates.main(["--root", str(tmp_path), "--write"]) == 0
    assert plan.read_text() == templates.render_plan(template_base.DEMO)


def test_another_federation_renders_a_plan_and_configs_that_load(tmp_path: Path) -> None:
    federation = template_base.Federation(
        federation_id="north-clinics",
        sites=("clinic-1", "clinic-2", "clinic-3", "clinic-4"),
        aggregator="agg.example.org:6000",
        certs="certs",
        max_colluding=1,
    )
    plan = parse_aggregator_plan(tomllib.loads(templates.render_plan(federation)), tmp_path / "plan.toml")
    assert plan.federation_id == "north-clinics" and plan.collaborators == federation.sites
    assert plan.aggregator.address == "0.0.0.0:6000" and plan.aggregator.certs == tmp_path / "certs"
    assert plan.secure_aggregation.max_colluding == 1
    for index, site in enumerate(federation.sites):
        text = config_template.render_collaborator(federation, site)
        config = parse_collaborator_config(tomllib.loads(text), tmp_path / site / "collaborator.toml")
        assert (config.name, config.aggregator, config.federation) == (site, "agg.example.org:6000", "north-clinics")
        assert config.data.index == index and config.certificates.cert == tmp_path / site / "certs" / f"{site}.crt"


def test_a_schema_replaces_the_model_sizes_and_each_site_reads_its_table(tmp_path: Path) -> None:
    schema = '[schema]\nlabel = "y"\nclasses = ["0", "1"]\n\n[[schema.columns]]\nname = "x"\ntype = "numeric"\nrange = [0, 1]\n'
    federation = template_base.Federation("f", ("a", "b"), schema=schema, table="data/t.csv")
    text = templates.render_plan(federation)
    assert text.endswith(schema) and "\nfeatures = " not in text
    plan = parse_aggregator_plan(tomllib.loads(text), tmp_path / "plan.toml")
    assert plan.schema is not None and plan.schema.label == "y"
    config = parse_collaborator_config(
        tomllib.loads(config_template.render_collaborator(federation, "b")), tmp_path / "c.toml"
    )
    assert config.data.csv == tmp_path / "data" / "t.csv" and config.data.dataset is None
