"""Whether a change kept behaviour: study runs' results and a plain-sum federation's bundle, byte for byte.

    python benchmarks/same_results.py record OUT [--only NAME,...]   # with the interpreter of the tree to record
    python benchmarks/same_results.py compare BEFORE AFTER [--again BEFORE2]

``record`` runs, with whichever fedfair the interpreter imports (another tree's ``.venv/bin/python``, or this
one's with ``PYTHONPATH`` at an exported tree, records that tree), 23 short study runs
(:func:`fedfair.research.runs.execute`, as ``fedfair reproduce`` runs them: every method of the study on Adult;
FedSRCVaR under secure aggregation, also with an MLP and on RAND HIE; FedSRCVaR with drift correction, server Adam,
an MLP, float64 and on RAND HIE; AFL on RAND HIE) and one ``fedfair launch --no-secure-aggregation`` federation of
three processes over gRPC and mutual TLS, with a fixed seed. Every run is seeded, so each result is a function of
the code alone; the files written are what that function returned, less what a machine's clock puts in:

- ``runs/NAME.json``: the run's result as the study caches it (sorted keys), without ``cpu_seconds``;
- ``bundle/tensors.bin``: the bundle's tensors' bytes in name order, with each one's name, dtype and shape in
  ``bundle/metadata.json``, beside the bundle's metadata without ``provenance.created`` (its writing time).

``compare`` runs ``cmp`` over the two folders' files and prints each that differs or is missing from one; it exits
1 when any does. With ``--again``, a second record of BEFORE's tree, a file both records of that tree hold and that
differs between them is reported apart, not compared: it is no function of the code alone (see :data:`RUNS` for
what is left out for that reason). A record takes about 20 CPU seconds in its own process (one torch thread) beside
the federation's processes, and 1.5 to 2.5 minutes of wall time on a loaded 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from fedfair.research.method_names import METHOD_NAMES

ROUNDS = "5"
COMMON = ("--dataset", "adult", "--rounds", ROUNDS, "--seed", "0")
FEDSRCVAR = ("--method", "fedsrcvar", "--epsilon", "0.1", "--rho", "0.3")
RUNS: dict[str, tuple[str, ...]] = {
    **{method: ("--method", method) for method in METHOD_NAMES},
    "fedsrcvar-secure": (*FEDSRCVAR, "--secure-aggregation"),
    "fedsrcvar-secure-mlp": (*FEDSRCVAR, "--secure-aggregation", "--model", "mlp"),
    "fedsrcvar-secure-rand-hie": (*FEDSRCVAR, "--secure-aggregation", "--dataset", "rand-hie"),
    "fedsrcvar-scaffold": (*FEDSRCVAR, "--drift-correction", "scaffold", "--local-steps", "3"),
    "fedsrcvar-adam": (*FEDSRCVAR, "--server-adam-lr", "0.01"),
    "fedsrcvar-mlp": (*FEDSRCVAR, "--model", "mlp"),
    "fedsrcvar-float64": (*FEDSRCVAR, "--dtype", "float64"),
    "fedsrcvar-rand-hie": (*FEDSRCVAR, "--dataset", "rand-hie"),
    "afl-rand-hie": ("--method", "afl", "--dataset", "rand-hie"),
    "fedsrcvar-test-split": (*FEDSRCVAR,),
}
"""Name -> `fedfair simulate` flags beyond COMMON (a later --dataset wins); every run is judged on validation rows
but the last, which is judged on the test rows. Left out, as no function of the code alone: DP noise, which comes
from the OS's CSPRNG (two records of b3f19e8e differed for DP-SGD, distributed DP, and TERM and PropFair under it),
and FedSRCVaR with drift correction under secure aggregation, whose encoding rounds stochastically under a key from
the OS (`fedfair.secagg.encode`): one of seven records of b3f19e8e differed from the other six, by about 3e-11 in
its risks. The other secure runs gave the same bytes in every record so far."""

LAUNCH = ("launch", "--no-secure-aggregation", "--no-fedavg", "--seed", "0", "--rounds", "3", "--collaborators", "3")


def record(out: Path, only: frozenset[str]) -> None:
    """Write every run's result (those named in `only`, if any) and the federation's bundle under `out`."""
    import torch

    from fedfair.research.runs import Run, execute

    torch.set_num_threads(1)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    for name, flags in RUNS.items():
        if only and name not in only:
            continue
        split = "test" if name.endswith("test-split") else "validation"
        result = execute(Run((*COMMON, *flags), split))
        result.pop("cpu_seconds")
        (out / "runs" / f"{name}.json").write_text(json.dumps(result, sort_keys=True))
        print(f"{name}: worst risk {result.get('worst_risk')}", flush=True)
    if only and "bundle" not in only:
        return
    with tempfile.TemporaryDirectory() as folder:
        workdir = Path(folder) / "launch"
        fedfair = Path(sys.executable).parent / "fedfair"
        subprocess.run([str(fedfair), *LAUNCH, "--workdir", str(workdir)], check=True, stdout=subprocess.DEVNULL)
        keep_bundle(workdir / "aggregator" / "output" / "model_bundle.pt", out / "bundle")
    print(f"recorded under {out}")


def keep_bundle(path: Path, out: Path) -> None:
    """The bundle at `path` as `out`/tensors.bin and `out`/metadata.json, its writing time left out."""
    import torch

    payload = torch.load(path, map_location="cpu", weights_only=True)
    metadata: dict[str, Any] = json.loads(payload["metadata"])
    metadata["provenance"].pop("created")
    tensors = payload["state_dict"]
    metadata["tensors"] = {name: [str(tensors[name].dtype), list(tensors[name].shape)] for name in sorted(tensors)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "metadata.json").write_text(json.dumps(metadata, sort_keys=True))
    (out / "tensors.bin").write_bytes(
        b"".join(tensors[name].contiguous().numpy().tobytes() for name in sorted(tensors))
    )


def compare(before: Path, after: Path, again: Path | None) -> int:
    """Print each file that differs between the two records; 1 if any does, else 0.

    With `again`, a second record of `before`'s tree (of some runs, or all), a file that both hold and that differs
    between them is not a function of the code (randomness a run draws from the OS): it is reported apart and not
    held against `after`.
    """
    names = sorted(
        {str(path.relative_to(root)) for root in (before, after) for path in root.rglob("*") if path.is_file()}
    )
    repeated = [name for name in names if again is not None and (before / name).is_file() and (again / name).is_file()]
    unrepeatable = [name for name in repeated if again is not None and not _same(before / name, again / name)]
    compared = [name for name in names if name not in unrepeatable]
    different = [name for name in compared if not _same(before / name, after / name)]
    print(f"{len(compared) - len(different)} of {len(compared)} files byte-identical")
    for name in different:
        missing = [str(root) for root in (before, after) if not (root / name).is_file()]
        print(f"  differs: {name}" if not missing else f"  missing from {missing[0]}: {name}")
    for name in unrepeatable:
        print(f"  not compared, differs between two records of {before}'s tree: {name}")
    return 1 if different else 0


def _same(one: Path, other: Path) -> bool:
    """Whether both files exist and `cmp` finds them byte-identical."""
    return one.is_file() and other.is_file() and subprocess.run(["cmp", "-s", str(one), str(other)]).returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("record", help="record this interpreter's fedfair")
    one.add_argument("out", type=Path)
    one.add_argument("--only", default="", help="comma-separated run NAMEs and/or 'bundle' (default: all)")
    both = commands.add_parser("compare", help="cmp two records")
    both.add_argument("before", type=Path)
    both.add_argument("after", type=Path)
    both.add_argument("--again", type=Path, default=None, help="a second record of BEFORE's tree: what is repeatable")
    args = parser.parse_args()
    if args.command == "record":
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        record(args.out, frozenset(name for name in args.only.split(",") if name))
    else:
        sys.exit(compare(args.before, args.after, args.again))


if __name__ == "__main__":
    main()
