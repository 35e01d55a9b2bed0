"""The aggregator's live status page: served by its monitoring endpoint, rendered in headless Chromium.

The folder is tests/runtime/test_report.py's run, written with the aggregator's own writers; the page
is fetched from a real endpoint on loopback, as an operator's browser would, and its values are
checked against the round log and the events.
"""

from __future__ import annotations

import html
import re
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.observe.events import EventLog
from fedfair.runtime.observe.federation_metrics import start_monitoring
from fedfair.runtime.observe.status_page import REFRESH_SECONDS, status_page
from fedfair.runtime.observe.endpoint import MonitoringSettings
from fedfair.runtime.report.verdicts import estimate_text, mean_interval, noised, worst_interval
from fedfair.runtime.observe.status import Estimate, FederationState, Site, Waiting, federation_state
from tests.runtime.test_monitoring import get
from tests.runtime.test_report import chromium, write_run


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    output = tmp_path / "output"
    write_run(output)
    events = EventLog(output)
    events.emit("connect", name="site-a")
    return output


def test_the_page_states_the_rounds_the_estimate_and_each_site(folder: Path) -> None:
    page = status_page(federation_state(folder))
    final = read_round_log(folder)[-1]["evaluation"]
    low, high = worst_interval(final)
    assert f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}">' in page
    assert "<script" not in page and "http" not in page.replace('http-equiv="refresh"', "")  # nothing fetched
    assert "Round 5 of 5: 4 applied, 1 aborted." in page
    # The console's form, naming the round the figures are from.
    shown = estimate_text(
        (final["worst_risk"], low, high),
        (final["mean_risk"], *mean_interval(final)),
        noised=noised(final),
        round_number=5,
    )
    assert f'<p id="estimate" class="estimate">{html.escape(shown)}</p>' in page
    row = page.split('id="site-site-c"')[1].split("</tr>")[0]
    assert "<td>3</td><td>1</td>" in row  # 3 contributions, 1 dropout
    assert '<span class="yes">yes</span>' in page.split('id="site-site-a"')[1].split("</tr>")[0]


ATTRIBUTE = re.compile(r"""\s*([^\s"'>/=]+)(?:\s*=\s*(?:"[^"]*"|'[^']*'|([^\s"'>]+)))?""")
"""One attribute of a start tag's raw text; group 2 is its value when written without quotes."""


class Tags(HTMLParser):
    """Every start tag of a page: (tag, attributes as parsed) and the attributes written without quotes."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.unquoted: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        raw = (self.get_starttag_text() or "").removesuffix(">").removesuffix("/")
        rest = raw[1 + len(tag) :]
        while rest.strip():
            match = ATTRIBUTE.match(rest)
            assert match is not None and match.end() > 0, raw
            if match.group(2) is not None:
                self.unquoted.append(f"{match.group(1)}={match.group(2)} in {raw}>")
            rest = rest[match.end() :]


def tags_of(page: str) -> Tags:
    parser = Tags()
    parser.feed(page)
    parser.close()
    return parser


def test_the_tag_reader_finds_an_unquoted_attribute() -> None:
    assert tags_of("<p class=x id=\"a\" title='b'>").unquoted == ["class=x in <p class=x id=\"a\" title='b'>"]


def test_every_attribute_the_page_writes_is_quoted_whatever_the_names(folder: Path) -> None:
    hostile = "site \"a\" <b> 'c' x=y"
    state = FederationState(
        folder=str(folder),
        federation_id='fed "1"',
        plan_digest="ab" * 32,
        rounds_planned=5,
        running=True,
        last_round=3,
        last_status="aborted",
        last_reason='too few "sites"',
        last_seconds=1.5,
        last_stage_seconds={"STAGE_TRAIN": 1.0},
        held_up_by={hostile: 2.0},
        estimate=Estimate(3, 0.2, 0.1, 0.3, 0.15, 0.1, 0.2, noised=True),
        sites={
            hostile: Site(False, 1, 2, "dropped", 1.5, 2.0),
            "site-b": Site(True, 3, 0, "applied", None, None),
        },
        waiting=Waiting(4, "the quorum", 1, 2, (hostile,), 30.0, 0.0),
    )
    for page in (status_page(state), status_page(federation_state(folder))):
        tags = tags_of(page)
        assert tags.unquoted == []
        assert len(tags.tags) > 20
    ids = [attributes.get("id") for _, attributes in tags_of(status_page(state)).tags]
    assert f"site-{hostile}" in ids  # the name survives escaping as one attribute value
    assert {"phase", "rounds", "waiting", "estimate", "last", "held", "stages", "sites"} <= set(ids)


def browse(url: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """Headless Chromium on a loopback `url`."""
    assert url.startswith("http://127."), url
    command = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *flags, url]
    return subprocess.run(command, capture_output=True, text=True, check=True, timeout=120)


@pytest.mark.slow
def test_the_served_page_renders_in_chromium_with_the_logs_values(folder: Path, tmp_path: Path) -> None:
    chromium()
    endpoint = start_monitoring(folder, MonitoringSettings("127.0.0.1:0"), EventLog(folder))
    try:
        assert get(endpoint.url + "/")[0] == 200
        shot = tmp_path / "status.png"
        browse(endpoint.url + "/", "--window-size=1000,900", f"--screenshot={shot}")
        dom = browse(endpoint.url + "/", "--dump-dom").stdout
    finally:
        endpoint.stop()
    pixels = matplotlib.image.imread(shot)[..., :3]
    assert pixels.shape[:2] == (900, 1000)
    colours = {tuple(pixel) for pixel in (pixels[::3, ::3] * 255).round().astype(int).reshape(-1, 3)}
    assert len(colours) > 20  # text, badges, row colours: not a blank page
    badge = np.array([0x1F, 0x77, 0xB4]) / 255  # the "finished" badge
    assert (np.abs(pixels - badge).max(axis=-1) < 0.02).sum() > 50
    final = read_round_log(folder)[-1]["evaluation"]
    estimate = re.search(r"<p id=\"?estimate\"?[^>]*>(.*?)</p>", dom, re.S)
    assert estimate is not None and f"worst-group risk {final['worst_risk']:.2f}" in html.unescape(estimate.group(1))
    assert re.search(r'id="phase">finished<', dom)
    assert 'id="site-site-c"' in dom and "url=" not in dom
