"""The files of a federation rehearsed on one machine: a CA, certificates, a plan, one config per site."""

from __future__ import annotations

import json
import secrets
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedfair import pki
from fedfair.pki.roster import PlanPin, Roster, pins_from_folders, write_manifest
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan, shared_content
from fedfair.runtime.plan.input_bound import TWO_VERIFIERS


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
"""Where Linux keeps the ports it hands out to outgoing connections."""

LISTENING_FLOOR = 10_000
"""The lowest port :func:`free_port` picks: above the well-known and most registered services' ports."""


def free_port() -> int:
    """A loopback port nobody listens on right now (the aggregator binds it a moment later).

    Picked below the kernel's ephemeral range when it leaves room: a port from that range can be handed to any
    outgoing connection (every gRPC dial takes one) between this probe and the aggregator's bind, a port below it
    only to another listener. Falls back to a port the kernel picks.
    """
    low = 32_768
    if EPHEMERAL_RANGE.is_file():
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    if low - LISTENING_FLOOR <= 1_000:
        return _kernel_port()  # too few ports below the range to find a free one by chance
    for _ in range(64):
        port = LISTENING_FLOOR + secrets.randbelow(low - LISTENING_FLOOR)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))  # refused while anyone holds it, gRPC's SO_REUSEPORT listeners too
            except OSError:
                continue
            return port
    return _kernel_port()


def _kernel_port() -> int:
    """A free loopback port the kernel picks (from its ephemeral range)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def listening(port: int, seconds: float) -> bool:
    """Whether something listens on loopback's `port` within `seconds` (a server started a moment ago)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.2)
    return False


def toml_text(sections: Mapping[str, Mapping[str, Any]]) -> str:
    """Tables of strings, numbers, booleans, lists (of inline tables too) and inline tables as TOML.

    JSON spells all but the inline tables the same way.
    """
    lines: list[str] = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines.extend(f"{key} = {_toml_value(value)}" for key, value in values.items() if value is not None)
        lines.append("")
    return "\n".join(lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{json.dumps(key)} = {_toml_value(item)}" for key, item in value.items()) + " }"
    if isinstance(value, list):  # a list of inline tables (a [schema]'s columns) is no JSON
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    return json.dumps(value)


@dataclass(frozen=True)
class Workspace:
    """The files of a local federation."""

    root: Path
    certs: Path
    plan: Path
    configs: dict[str, Path]
    output: Path
    address: str
    auditor: Path | None = None
    """The auditor's auditor.toml where the plan bounds every input (two verifiers); None otherwise."""


def site_names(count: int) -> list[str]:
    """The institutions' names: site-a, site-b, ... up to 26 of them, site-1, site-2, ... beyond."""
    return [f"site-{chr(ord('a') + index)}" if count <= 26 else f"site-{index + 1}" for index in range(count)]


def make_workspace(
    root: Path,
    names: Sequence[str],
    *,
    plan: Mapping[str, Mapping[str, Any]] | None = None,
    data: Mapping[str, Mapping[str, Any]] | None = None,
    port: int | None = None,
    device: str = "cpu",
    manifest: bool = False,
    auditor: str | None = None,
) -> Workspace:
    """Certificates, a plan and one config per collaborator under `root`.

    `plan` holds sections to merge into the plan (e.g. {"training": {"rounds": 20}});
    `data` per collaborator name replaces its [data] section (default: part i of
    Adult split by race). With `manifest`, a federation manifest (`manifest.toml`) pins
    every certificate and the plan, as careful institutions run: the plan and every
    config name it, its min_round_size is the plan's quorum. With `auditor` (and `manifest`,
    which must pin it), the plan declares the two-verifier input bound with that auditor,
    whose certificate is issued beside the others, and its folder holds its ``auditor.toml``
    (`fedfair auditor start --config` runs it).
    """
    if auditor and not manifest:
        raise ValueError(f"an auditor ({auditor!r}) is pinned by the federation's manifest: pass manifest=True")
    root.mkdir(parents=True, exist_ok=True)
    certs = root / "certs"
    pki.init_ca(certs)
    pki.issue(certs, "aggregator", "aggregator", hosts=["localhost", "127.0.0.1"])
    for name in names:
        pki.issue(certs, "collaborator", name)
    if auditor:
        pki.issue(certs, "auditor", auditor)
    address = f"127.0.0.1:{port or free_port()}"
    output = root / "aggregator" / "output"
    sections: dict[str, dict[str, Any]] = {
        "federation": {"id": "fedfair-launch", "collaborators": list(names)},
        "aggregator": {"address": address, "name": "aggregator", "certs": str(certs), "output": str(output)},
    }
    for section, values in (plan or {}).items():
        sections.setdefault(section, {}).update(values)
    if auditor:
        sections.setdefault("secure_aggregation", {}).update(input_bound=TWO_VERIFIERS, auditor=auditor)
    sources = {
        name: (data or {}).get(name, {"dataset": "adult", "partition": "race", "index": index})
        for index, name in enumerate(names)
    }
    if "influence" not in sections:
        seed = int(sections.get("training", {}).get("seed", 0))
        sizes = declared_sizes(sources, seed)
        if sizes is not None:
            sections["influence"] = {"weights": "declared", "sizes": sizes}
    plan_path = root / "aggregator" / "plan.toml"
    plan_path.parent.mkdir(parents=True, exist_ok=True)
    manifest_path = root / "manifest.toml"
    if manifest:  # named before it is written: a plan with an auditor is read only beside its manifest
        sections["aggregator"]["manifest"] = str(manifest_path)
    plan_path.write_text(toml_text(sections))
    if manifest:
        colluding = int(sections.get("secure_aggregation", {}).get("max_colluding", 0))
        write_pinned_manifest(manifest_path, plan_path, certs, colluding)  # the bound the plan states
    configs = {}
    for index, name in enumerate(names):
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        source = sources[name]
        config = {
            "collaborator": {
                "name": name,
                "aggregator": address,
                "aggregator_name": "aggregator",
                "federation": "fedfair-launch",
                "device": device,
            },
            "certificates": {"dir": str(certs)},
            "data": dict(source),
        }
        if manifest:
            config["collaborator"]["manifest"] = str(manifest_path)
        configs[name] = folder / "collaborator.toml"
        configs[name].write_text(toml_text(config))
    auditor_config = None
    if auditor:
        auditor_config = root / auditor / "auditor.toml"
        auditor_config.parent.mkdir(parents=True, exist_ok=True)
        settings = {"name": auditor, "aggregator": address, "manifest": str(manifest_path), "folder": "."}
        auditor_config.write_text(toml_text({"auditor": settings, "certificates": {"dir": str(certs)}}))
    return Workspace(root, certs, plan_path, configs, output, address, auditor_config)


def declared_sizes(sources: Mapping[str, Mapping[str, Any]], seed: int) -> dict[str, int] | None:
    """Each institution's training rows when every [data] names a partitioned dataset; None otherwise.

    The rows are counted as the collaborator will split them (its plan's seed and collaborator count).
    They are what the institutions of a workspace declare in [influence] sizes, so the weights
    are Algorithm 1's b_k and agreed, not claimed.
    """
    # Imported here: the datasets are needed only to count rows, not to write a workspace of CSV tables.
    from fedfair.datasets import DATASETS, Dataset, load_dataset, partition

    if not all("dataset" in source and "csv" not in source for source in sources.values()):
        return None
    sizes: dict[str, int] = {}
    loaded: dict[str, Dataset] = {}
    for name, source in sources.items():
        key = str(source["dataset"])
        if key not in loaded:
            loaded[key] = load_dataset(key)
        dataset = loaded[key]
        info = DATASETS.get(key)
        scheme = source.get("partition") or (info.default_partition if info is not None else "iid")
        parts = int(source.get("parts") or len(sources))
        splits = partition(dataset, scheme, parts, seed=seed, alpha=float(source.get("alpha") or 0.5))
        sizes[name] = len(splits[int(source.get("index") or 0)].train_index)
    return sizes


def write_pinned_manifest(path: Path, plan_path: Path, certs: Path, max_colluding: int = 0) -> str:
    """The manifest of the certificates in `certs` with the plan at `plan_path` pinned; its digest."""
    plan = load_aggregator_plan(plan_path, check_manifest=False)
    pins = tuple(pins_from_folders([certs]))
    plan_pin = PlanPin(shared_content(plan))
    return write_manifest(
        path, Roster(plan.federation_id, pins, max_colluding, plan.quorum.min_collaborators, plan_pin)
    )
