"""The attack rows' shared pieces: one way to rewrite a class's methods, and a wait bounded by the sites (issue 79)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from attacks import site_processes  # noqa: E402 -- benchmarks/ is not a package
from attacks.rewrites import rewritten  # noqa: E402
from fedfair.runtime.local.processes import Child  # noqa: E402


class Base:
    def inherited(self) -> str:
        return "base"


class Server(Base):
    def finish(self) -> str:
        return "honest"


def test_a_rewrite_holds_while_open_and_is_put_back_however_the_block_ends() -> None:
    with pytest.raises(RuntimeError), rewritten(Server, finish=lambda self: "forged", inherited=lambda self: "forged"):
        assert (Server().finish(), Server().inherited()) == ("forged", "forged")
        raise RuntimeError("the row broke")
    assert (Server().finish(), Server().inherited()) == ("honest", "base")
    assert "inherited" not in vars(Server)  # deleted, not shadowed by the base's function


@pytest.mark.parametrize(("name", "said"), [("_finish", "is private"), ("finished", "has no finished")])
def test_a_private_or_absent_method_is_refused_before_anything_changes(name: str, said: str) -> None:
    with pytest.raises(ValueError, match=said), rewritten(Server, **{name: lambda self: "forged"}):
        pass
    assert not hasattr(Server, name)


def test_an_aggregator_outliving_its_sites_is_waited_for_a_bounded_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(site_processes, "AFTER_LAST_SITE_SECONDS", 1.0)
    sink = open("/dev/null", "w")  # noqa: SIM115 -- closed below, after the children
    aggregator = Child("aggregator", [sys.executable, "-c", "import time; time.sleep(60)"], sink=sink)
    sites = {name: Child(name, [sys.executable, "-c", "raise SystemExit(2)"], sink=sink) for name in ("a", "b")}
    try:
        started = time.monotonic()
        assert site_processes.wait_while_sites_run(aggregator, sites, 60.0) is None
        waited = time.monotonic() - started
        assert waited < 30.0  # the sites' exit plus one second, not the 60 s budget (stretched by load)
        done = Child("aggregator", [sys.executable, "-c", "raise SystemExit(0)"], sink=sink)
        assert site_processes.wait_while_sites_run(done, sites, 60.0) == 0
    finally:
        aggregator.kill()
        sink.close()
