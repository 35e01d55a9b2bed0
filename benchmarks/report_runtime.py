"""The benchmark page's sections on the runtime: start-up, round cost, secure aggregation, a large
federation, the attack suite.

Each function turns one result file's JSON into a `Section`; a row states only what the JSON holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from report_plots import round_cost
from report_tables import Plot, Section, count, fixed, milliseconds, percent, ratio, table

HELP_TARGET_SECONDS = 0.5
"""What a `--help` may take (issue 43); the start-up table says which commands meet it."""

DEMO_TARGET_LINES = 60
"""What `make demo` may print (issue 43): fewer lines than this."""

LOAD_TARGET_SECONDS = 2.0
"""What loading the bundled Adult dataset may take (issue 63 moved this target out of the test suite)."""


def startup_bench(name: str, document: Mapping[str, Any]) -> Section:
    """One row per `--help` against its target, a sentence per dataset load, and one on `make demo`."""
    repeats = document.get("repeats")
    lines = [
        f"`fedfair ... --help` in a fresh interpreter, the median of {repeats or 'several'} interleaved runs "
        f"(target: {HELP_TARGET_SECONDS:g} s each, importing none of torch, opacus, grpc, pandas). Wall time is "
        "what a person waits on this shared machine; CPU time is what the command itself costs.",
        "",
        "| command | wall (s) | CPU (s) | within target | heavy modules imported |",
        "|---|---|---|---|---|",
    ]
    heavy = document.get("heavy_modules", {})
    for command, seconds in document.get("help_seconds", {}).items():
        words = "fedfair --help" if command == "fedfair" else f"fedfair {command} --help"
        met = "yes" if seconds["wall"] <= HELP_TARGET_SECONDS else f"no (CPU {seconds['cpu']:.2f} s)"
        imported = ", ".join(heavy.get(command, [])) or "none"
        lines.append(f"| `{words}` | {seconds['wall']:.2f} | {seconds['cpu']:.2f} | {met} | {imported} |")
    for dataset, seconds in document.get("load_seconds", {}).items():
        met = "within" if seconds["wall"] <= LOAD_TARGET_SECONDS else "over"
        lines += [
            "",
            f'`load_dataset("{dataset}")` took {seconds["wall"]:.2f} s ({seconds["cpu"]:.2f} s of CPU), {met} '
            f"its target of {LOAD_TARGET_SECONDS:g} s.",
        ]
    demo = document.get("demo")
    if isinstance(demo, Mapping):
        lines += [
            "",
            f"`make demo` (`fedfair launch --keep`) printed **{demo['lines']} lines** in {demo['seconds']:g} s "
            f"(target: under {DEMO_TARGET_LINES} lines), exit status {demo['exit_status']}.",
        ]
    return Section(
        "Start-up: command help and the first federation",
        "How long a person waits for each command's help, against the target, and how much the demo prints.",
        lines,
    )


def demo_seeds(name: str, document: Mapping[str, Any]) -> Section:
    """One row per seed of `make demo`: both models' exact worst-group risk, and the private estimate's interval."""
    runs = document["seeds"]
    rows = [
        (
            str(run["seed"]),
            fixed(run["fedsrcvar_worst"], 4),
            fixed(run["fedavg_worst"], 4),
            f"{run['private_worst']:.3f} ({run['private_low']:.3f} to {run['private_high']:.3f})",
            "yes" if run["covered"] else "no",
            f"{run['closing_lines']} / {run['widest_line']}",
        )
        for run in runs
    ]
    verdict = "below FedAvg's on every seed" if document["fedsrcvar_lower_on_every_seed"] else "not below on every seed"
    body = table(
        ["seed", "FedSRCVaR (exact)", "FedAvg (exact)", "private estimate (95%)", "covers exact", "lines / widest"],
        rows,
    ) + [
        "",
        f"FedSRCVaR's worst-group risk is {verdict}, by {document['mean_margin']:.3f} on average; the private "
        f"estimate's interval covers the exact figure in {document['coverage']:.0%} of the seeds.",
    ]
    return Section(
        "`make demo` over seeds: FedSRCVaR against FedAvg, measured alike",
        "Each seed runs `fedfair launch --seed S`: both models evaluated exactly on the same held-out rows of the "
        "sites, beside the federation's private estimate (noised secure sums) with its 95% interval, and the "
        "closing console's size (target: at most 15 lines of at most 120 characters).",
        body,
    )


def allocator_ab(name: str, document: Mapping[str, Any]) -> Section:
    """One row per allocator arm: a round's CPU at d = 10^6 (10 sites) and the peak memory at d = 10^7 (3 sites).

    Each figure is the median over the repetitions, with their lowest and highest in brackets: the spread a
    shared machine puts on it.
    """
    medians, readings, cpu_large = document["medians"], document["readings"], document["cpu_at_d1e7"]

    def spread(configuration: str, arm: str, digits: int) -> str:
        values, median = readings[configuration][arm], medians[configuration][arm]
        return f"{fixed(median, digits)} ({fixed(min(values), digits)}-{fixed(max(values), digits)})"

    rows = [
        (arm, spread("cpu", arm, 3), spread("memory", arm, 0), fixed(cpu_large[arm], 2)) for arm in document["arms"]
    ]
    return Section(
        "The allocator setting: a round's CPU against a federation's peak memory",
        "Secure rounds through the runtime, parties as threads of one process, each arm in a fresh process and "
        f"the arms interleaved in each of {document['repetitions']} repetitions (medians, lowest-highest in "
        "brackets): this tree, which leaves glibc's thresholds as they are (a model state of 64 MiB or more, a "
        "site's chain or the aggregator's, lives in a file and is read a span at a time; sites encode and tag "
        "their update a piece at a time and hand freed memory back once a round), against earlier commits' code "
        "as it stood (named by commit; up to 3687e85 every party fixed glibc's mmap threshold at 4 MiB). Goals: "
        "at d = 10^6, "
        "10 sites, a round's CPU at most the code before the setting (19c2d03); at d = 10^7, 3 sites, a peak of "
        "at most 1,200 MB.",
        table(
            ["arm", "CPU per round, d = 10^6, n = 10 (s)", "peak, d = 10^7, n = 3 (MB)", "CPU per round, d = 10^7 (s)"],
            rows,
        ),
    )


def verify_bench(name: str, document: Mapping[str, Any]) -> Section:
    """One row per (n, d, word): a party's verification CPU over its runtime round's and its secure steps'."""
    rows = [
        (
            count(row["n"]),
            count(row["d"]),
            count(row["modulus_bits"]),
            milliseconds(row["verify_cpu_s"]),
            milliseconds(row["runtime_party_cpu_s"]) if "runtime_party_cpu_s" in row else "n/a",
            percent(row.get("verify_vs_runtime_party_cpu")),
            milliseconds(row["round_cpu_s"]),
            percent(row["verify_ratio"]),
            count(row["extra_upload_bytes"]),
        )
        for row in document["results"]
    ]
    return Section(
        "Verified aggregation: a party's verification CPU against a secure runtime round",
        f"{document['what']}; clock: {document['clock']}; goal: {document['goal_ratio']:.0%} of a runtime round. "
        "Numerator (verify): the party's VERIFY steps (its tags; every survivor's tags and signatures checked; where "
        "n (d + 1) <= 2^22 words, here n = 3 at d = 10^6, also its re-sum of every survivor's masked input, the check "
        "sound against colluding survivors, whose own goal is 10% (verify_soundness_cost below)) and "
        "the copy of its input it keeps. Denominator (runtime round): the party's CPU in a secure round of the real "
        "runtime, measured in the same run (threads, 16-bit words, training excluded, its verification included). "
        "The last ratio divides by the party's secure-aggregation steps alone (encoding and the six stages).",
        table(
            [
                "n",
                "d",
                "word bits",
                "verify (ms)",
                "runtime round (ms)",
                "verify / runtime round",
                "secagg steps (ms)",
                "verify / secagg steps",
                "extra upload (bytes)",
            ],
            rows,
        ),
    )


def verify_soundness_cost(name: str, document: Mapping[str, Any]) -> Section:
    """One row per (n, d): each candidate check's CPU per party over the runtime round's, in one interleaved run."""
    rows = [
        (
            count(row["n"]),
            count(row["d"]),
            milliseconds(row["runtime_party_cpu_s"]),
            f"{milliseconds(row['resum_cpu_s'])} ({percent(row['resum_vs_round'])})",
            f"{milliseconds(row['recheck_cpu_s'])} ({percent(row['recheck_vs_round'])})",
            f"{row['pedersen_cpu_s']:.3g} s ({ratio(row['pedersen_vs_round'], 1)})"
            + (" extrapolated" if row["pedersen_extrapolated"] else ""),
            milliseconds(row["current_check_cpu_s"]),
        )
        for row in document["results"]
    ]
    return Section(
        "A sum check sound against colluding survivors: its CPU per party against a secure runtime round",
        f"{document['what']}; clock: {document['clock']}; goal: {document['goal_ratio']:.0%} of a runtime round at "
        "d = 10^6, n = 10. Re-sum (shipped up to n (d + 1) = 2^22 words): a site downloads, decrypts, parses, hashes "
        "and adds every survivor's masked input and strips the self masks. Re-check (this prototype; built since, "
        "recheck_cost below): each site redoes "
        f"{document['max_colluding'] + 1} peers' challenge values. Pedersen: two BLS12-381 MSMs of d points "
        f"({1e6 * document['pedersen_cpu_s_per_point']:.2f} µs a point, measured at "
        f"{count(document['pedersen_measured_points'])} points). Current: the tag check's own digest and dots.",
        table(
            [
                "n",
                "d",
                "runtime round (ms)",
                "re-sum (ms, share)",
                "re-check (ms, share)",
                "Pedersen (CPU, × round)",
                "current tag check (ms)",
            ],
            rows,
        ),
    )


def recheck_cost(name: str, document: Mapping[str, Any]) -> Section:
    """One row per (n, d): the built re-check's CPU per party (VERIFY with it less without) over the runtime round's."""
    rows = [
        (
            count(row["n"]),
            count(row["d"]),
            milliseconds(row["runtime_party_cpu_s"]),
            f"{milliseconds(row['party_verify_rechecked_cpu_s'])} / {milliseconds(row['party_verify_tags_alone_cpu_s'])}",
            f"{milliseconds(row['recheck_cpu_s'])} ({percent(row['recheck_vs_round'])})",
            f"{milliseconds(row['server_verify_rechecked_cpu_s'])} / "
            f"{milliseconds(row['server_verify_tags_alone_cpu_s'])}",
            count(row["recheck_download_bytes"]),
        )
        for row in document["results"]
    ]
    return Section(
        "The re-check above the re-sum bound: its CPU per party against a secure runtime round",
        f"{document['what']}; clock: {document['clock']}; goal: {document['goal_ratio']:.0%} of a runtime round. "
        "VERIFY from an in-process round of the real Client and Server (`simulate_round`), max_colluding = 1 (each "
        "party re-checks 2 peers) against max_colluding = 0 (the tags alone), each the least of 2 rounds.",
        table(
            [
                "n",
                "d",
                "runtime round (ms)",
                "party VERIFY, re-checked / tags alone (ms)",
                "re-check (ms, share)",
                "server VERIFY, re-checked / tags alone (ms)",
                "extra download (bytes)",
            ],
            rows,
        ),
    )


def step_overhead(name: str, document: Mapping[str, Any]) -> Section:
    """One row per (model, batch): fedfair's plain local step against a bare PyTorch loop, interleaved."""
    rows = [
        (
            model,
            count(row["batch_size"]),
            fixed(row["fedfair_ms_per_step"], 3),
            fixed(row["bare_ms_per_step"], 3),
            ratio(row["ratio"]),
            ratio(row["median_pair_ratio"]),
        )
        for model, runs in document["rows"].items()
        for row in runs
    ]
    return Section(
        "The plain local step against a bare PyTorch loop",
        f"CPU time ({document['clock']}, {document['torch_threads']} torch thread) of fedfair's plain local step "
        "and a bare eager loop on the same model and batch, in interleaved blocks (target: at most 1.1x).",
        table(["model", "batch", "fedfair (ms)", "bare (ms)", "ratio", "median of paired blocks"], rows),
    )


def round_bench(name: str, document: Mapping[str, Any]) -> Section:
    """Plain beside secure aggregation for every (d, n) measured, and the round cost plotted against n."""
    rows = document["results"]
    processes = any(row["processes"] for row in rows)
    collaborators = "processes" if processes else "threads"
    secure = {(row["dimension"], row["parties"]): row for row in rows if row["secure"]}
    plain = {(row["dimension"], row["parties"]): row for row in rows if not row["secure"]}
    header = ["d", "n", "plain round (s)", "secure round (s)", "round, secure ÷ plain", "party path, plain (s)"]
    header += ["party path, secure (s)", "path, secure ÷ plain"]
    shown = []
    for key in sorted(plain.keys() & secure.keys()):
        bare, masked = plain[key], secure[key]
        shown.append(
            [count(key[0]), str(key[1]), fixed(bare["round_seconds"]), fixed(masked["round_seconds"])]
            + [ratio(masked["ratio_to_plain"]), fixed(bare["party_seconds"]), fixed(masked["party_seconds"])]
            + [ratio(masked["party_ratio_to_plain"])]
        )
    slopes = ", ".join(
        f"{fixed(slope, 2)} at d = {count(int(key.removeprefix('d=')))}"
        for key, slope in document.get("extra_slope", {}).items()
    )
    cpu = round_cpu(plain, secure, processes)
    notes = [
        "",
        f"Median over {document['measured_rounds']} measured rounds after a warm-up, {document['pairs']} "
        "plain-then-secure pair(s) of federations per configuration. The party path is a collaborator's own "
        "work on the round (download, key stages, masking, upload), the median over parties.",
    ]
    if slopes:
        notes += [
            "",
            f"The secure round's extra time grows as n to the power {slopes} (least squares of log(secure - plain) "
            "against log n over n ≥ 10).",
        ]
    notes += cpu
    plot = Plot(
        f"{name}_round_cost.png",
        f"Round wall time against the number of parties, collaborators as {collaborators}",
        partial(round_cost, rows, collaborators),
    )
    return Section(
        f"Round cost against the number of parties (collaborators as {collaborators})",
        "Secure aggregation beside plain aggregation in the real runtime (the aggregator's gRPC server, real "
        f"collaborators, mutual TLS over loopback), local training taken out: {document['what']}.",
        table(header, shown) + notes,
        (plot,),
    )


def round_cpu(
    plain: Mapping[tuple[int, int], Mapping[str, Any]],
    secure: Mapping[tuple[int, int], Mapping[str, Any]],
    processes: bool,
) -> list[str]:
    """round_bench's CPU seconds a round, plain beside secure per (d, n), where the run has them (none: no lines).

    The whole federation's CPU: with threads, the process's (the aggregator's and every party's threads); with
    processes, the aggregator's and every party process's, summed (runs before that figure show none). A party's:
    its handlers' and round job's threads, the median party.
    """
    # Before round_bench named it, a run with threads had the figure as the process's CPU.
    key = "federation_cpu_seconds" if processes else "process_cpu_seconds"
    rows = []
    for point in sorted(plain.keys() & secure.keys()):
        bare, masked = plain[point], secure[point]
        if bare.get(key) is None or masked.get(key) is None:
            continue
        rows.append(
            [count(point[0]), str(point[1]), fixed(bare[key], 2), fixed(masked[key], 2), ratio(masked[key] / bare[key])]
            + [fixed(1000 * bare["party_cpu_seconds"], 1), fixed(1000 * masked["party_cpu_seconds"], 1)]
            + [ratio(masked["party_cpu_seconds"] / bare["party_cpu_seconds"])]
        )
    if not rows:
        return []
    whose = (
        "every party process's and the aggregator's, summed"
        if processes
        else "the process's: every party's and the aggregator's threads"
    )
    header = ["d", "n", "federation CPU, plain (s)", "federation CPU, secure (s)", "CPU, secure ÷ plain"]
    header += ["party CPU, plain (ms)", "party CPU, secure (ms)", "party CPU, secure ÷ plain"]
    return [
        "",
        f"CPU seconds a round, which a host with fewer cores than parties distorts far less than wall time: the whole "
        f"federation's ({whose}), and a party's (its handlers' and round job's threads, the median party):",
        "",
        *table(header, rows),
    ]


def secagg_bench(name: str, document: Mapping[str, Any]) -> Section:
    """The encoder and masks against the raw AES-CTR keystream, per (n, d, dropout)."""
    header = ["n", "d", "dropout (dropped)", "mask step ÷ keystream", "its digest (ms)", "masks alone ÷ keystream"]
    header += ["encode + mask ÷ keystream", "encode + masks alone ÷ keystream", "server unmask (ms)"]
    header += ["whole round (ms)", "upload ÷ float32", "max error (bound)"]
    rows = [
        [str(row["n"]), count(row["d"]), f"{row['dropout']:g} ({row['dropped']})", ratio(row["mask_vs_keystream"])]
        + [milliseconds(row["digest_s"]), ratio(row["masking_vs_keystream"]), ratio(row["client_total_vs_keystream"])]
        + [ratio(row["client_total_less_digest_vs_keystream"]), milliseconds(row["server_unmask_s"])]
        + [milliseconds(row["round_s"]), ratio(row["expansion_vs_float32"], 3)]
        + [f"{row['max_abs_error']:.2g} ({row['error_bound']:.2g})"]
        for row in document["results"]
    ]
    notes = [
        "",
        f"Raw keystream ({document['prg']}): {document['keystream_gbps']:.2f} GB/s on this machine; modulus "
        f"{document['modulus_bits']} bits. A ratio of 1× would mean the step costs no more than drawing the "
        "bytes its masks need; encode + mask is divided by every keystream byte the party consumes (masks and "
        "stochastic-rounding randomness). Every time is the CPU seconds of the thread the round runs on, so "
        "other processes' load does not move the ratios. The mask step ends with the SHA-256 of the masked "
        "input that the party's signed view names (the verified round's check, not masking): its digest "
        "is timed apart, and masks alone is the step without it.",
    ]
    if document.get("skipped"):
        notes.append(f"Skipped: {'; '.join(str(item) for item in document['skipped'])}.")
    return Section(
        "Secure aggregation: the encoder and masks against the raw keystream",
        "One full in-process round of the secure-aggregation state machines per (n parties, d coordinates, "
        "dropout fraction), every message serialised, the decoded sum checked against the plaintext. A party's "
        "masking is timed against the AES-256-CTR keystream it must draw anyway, measured moments apart, in "
        "CPU seconds of the round's thread.",
        table(header, rows) + notes,
    )


def federation_bench(name: str, document: Mapping[str, Any]) -> Section:
    """Memory per process and time per round of a federation launched for real; nothing to compare with."""
    collaborator, aggregator = document["collaborator"], document["aggregator"]
    header = ["process", "RSS (MB)", "PSS (MB)", "USS (MB)", "peak RSS, VmHWM (MB)"]
    rows = [
        ["collaborator, median"] + [fixed(collaborator[key]["median"], 1) for key in ("rss", "pss", "uss", "hwm")],
        ["collaborator, largest"] + [fixed(collaborator[key]["max"], 1) for key in ("rss", "pss", "uss", "hwm")],
        ["aggregator"] + [fixed(aggregator[f"{key}_mb"], 1) for key in ("rss", "pss", "uss", "hwm")],
    ]
    rounds = ", ".join(f"{seconds:g}" for seconds in document["round_seconds"])
    notes = [
        "",
        f"`{document['launched']}`: {document['collaborators_seen']} collaborators seen, "
        f"{document['rounds_completed']} of {document['rounds_planned']} rounds in {document['wall_seconds']:g} s "
        f"(round times {rounds} s; median {document['round_seconds_median']:g} s), exit status "
        f"{document['launch_exit_status']}. Together the processes peaked at "
        f"{count(document['federation_pss_peak_mb'])} MB PSS; the machine's available memory fell by at most "
        f"{count(document['machine']['used_peak_mb'])} MB of {count(document['machine']['total_mb'])} MB. "
        f"Final model: worst-group risk {fixed(document['worst_risk'])}, accuracy {fixed(document['accuracy'])}.",
        "",
        "The JSON measures fedfair alone: it holds no run of another framework to compare with.",
    ]
    return Section(
        f"A {document['collaborators']}-site federation on one machine: memory and round time",
        "The aggregator and every collaborator as separate processes over gRPC and mutual TLS, secure aggregation "
        "on, sampled from /proc while it runs: RSS counts shared pages in every process, PSS divides them among "
        "the processes (the PSS add up), USS is what a process's exit gives back.",
        table(header, rows) + notes,
    )


FLOWER_COST_LABELS = {
    "wall_seconds": "wall",
    "cpu_seconds_total": "CPU, all parties",
    "server_cpu_seconds": "server CPU",
    "site_cpu_seconds_median": "site CPU",
    "client_app_actor_cpu_seconds": "ClientApp actors' CPU",
}
"""The costs flower_bench fits per round, as its table names them."""


def flower_run_row(run: Mapping[str, Any]) -> list[str]:
    """One run of flower_bench: a deployment's parties each, or a simulation's one process tree split in two."""
    if run["bytes_per_round_up"] is None:  # Flower's simulation engine: one tree, no network
        parts = [run["rest_cpu_seconds"], run["client_app_actor_cpu_seconds"]]
        cells = [f"{fixed(parts[0], 1)} (the rest)", f"{fixed(parts[1], 1)} (ClientApp actors, all sites)"]
        cells += ["none: no network", ""]
    else:
        parts = [run["server_cpu_seconds"], *run["site_cpu_seconds_each"]]
        cells = [fixed(parts[0], 1), ", ".join(fixed(seconds, 1) for seconds in parts[1:])]
        cells += [count(run["bytes_per_round_up"]), count(run["bytes_per_round_down"])]
    # Files measured before the total was recorded give it as the sum of their parties'.
    total = run.get("cpu_seconds_total", sum(parts))
    return [run["system"], str(run["rounds"]), fixed(run["wall_seconds"], 1), fixed(total, 1), *cells]


def flower_bench(name: str, document: Mapping[str, Any]) -> Section:
    """fedfair's runtime and the Flower integration (deployment or simulation engine) on one federation,
    interleaved: wall, CPU per party, bytes, the two final models' agreement; with several round counts, each
    system's start-up and cost per round, projected to the issue's 200 rounds."""
    settings, equality = document["settings"], document["equality"]
    header = ["run", "rounds", "wall (s)", "CPU, all parties (s)", "server CPU (s)", "site CPU, each (s)"]
    header += ["site to server per round (B)", "back (B)"]
    rounds = settings["round_counts"]
    c_relative = f" ({equality['c_average_relative']:.3g} relative)" if "c_average_relative" in equality else ""
    notes = [
        "",
        f"{settings['sites']} sites, {' and '.join(map(str, rounds))} rounds of {settings['local_steps']} local "
        f"step, b_k = round({settings['batch_fraction']} n_k), rho {settings['rho']}, epsilon {settings['epsilon']}, "
        f"seed {settings['seed']}; fedfair's sums {'masked' if settings['secure'] else 'plain'}; bytes per round "
        f"include start-up and joining, spread over the rounds. Final model after {equality['rounds']} rounds: the "
        f"suffix-averaged theta differs by {equality['theta_average_relative']:.3g} relative between the two "
        f"systems, c by {equality['c_average_difference']:.3g}{c_relative}; every repeat of a system gave the same "
        f"model: {fixed(equality['repeats_identical'])}.",
    ]
    if "per_round" in document:
        project = document["per_round"]["project"]
        fit_rows = [
            [system, FLOWER_COST_LABELS[cost], fixed(line["start_up"], 1), fixed(line["per_round"], 3)]
            + [count(line[f"at_{project}_rounds"])]
            if line["per_round"] is not None
            else [system, FLOWER_COST_LABELS[cost], "none measured: the shorter runs took longer", "", ""]
            for system, fitted in document["per_round"]["systems"].items()
            for cost, line in fitted.items()
        ]
        notes += [
            "",
            f"Each cost as start-up plus a cost per round (least squares over the runs above), projected to {project} "
            "rounds, the issue's federation, which the deployment engine's rounds make too long to run on this "
            "machine (projected, not measured):",
            "",
            *table(
                ["system", "cost", "start-up (s)", "per round (s)", f"at {project} rounds, projected (s)"], fit_rows
            ),
        ]
    body = table(header, [flower_run_row(run) for run in document["runs"]]) + notes
    if settings.get("engine") == "simulation":
        return Section(
            f"fedfair's runtime beside Flower's simulation engine, {equality['rounds']} rounds",
            "One federation (the Flower example's model and Adult by race) run by fedfair's aggregator and "
            "collaborator processes over TLS and by Flower's simulation engine (a simulating SuperLink, its Ray "
            "backend, `flwr run` of the example) with `fedfair.flower`, each system's repeats interleaved. fedfair's "
            "CPU is each party's process tree; Flower's simulation runs every party in the SuperLink's one process "
            "tree, whose CPU a subreaper collects (with what the kernel drops for Ray's workers, whose raylet "
            "ignores SIGCHLD, sampled from /proc) and /proc sampling splits into Ray's ClientApp actor processes "
            "(one actor a core, each running the ClientApps of whichever sites it is given) and the rest (the "
            "SuperLink, the ServerApp's process, Ray's own daemons and idle workers). fedfair's bytes are counted by "
            "a relay between the sites and the server; a simulation sends none over a network. fedfair's plan "
            "lifts its update bound (`[influence] update_norm` 100): Algorithm 1, as Flower's path runs it, "
            "bounds no update.",
            body,
        )
    return Section(
        "fedfair's runtime beside the Flower integration",
        "One federation (the Flower example's model and Adult by race) run by fedfair's aggregator and collaborator "
        "processes and by Flower's deployment engine (SuperLink, SuperNodes, `flwr run`) with `fedfair.flower`, "
        "both over TLS, each system's repeats interleaved. CPU is each party's whole process tree (a subreaper "
        "collects it; Flower's server includes the ServerApp, each site the ClientApp process it starts per "
        "message); bytes are counted by a relay between the sites and the server, start-up and joining included.",
        body,
    )


def flower_masking(name: str, document: Mapping[str, Any]) -> Section:
    """The secure round of a d = 10^6 update, fedfair's beside Flower's SecAgg+: wall, CPU per party, bytes."""
    settings = document["settings"]
    header = ["system", "n", "round wall (s)", "CPU per site (s)", "server CPU (s)", "sites to server (B)"]
    header += ["server to sites (B)", "bits a coordinate up"]
    rows = [
        [
            run["system"],
            str(run["parties"]),
            fixed(run["round_seconds"], 2),
            fixed(run["party_cpu_seconds"], 2),
            fixed(run["server_cpu_seconds"], 2),
            count(run["bytes_up"]),
            count(run["bytes_down"]) if run["bytes_down"] is not None else "not counted",
            fixed(8 * run["bytes_up"] / (run["parties"] * settings["dimension"]), 1),
        ]
        for run in document["runs"]
    ]
    fedfair_runs = {run["parties"]: run for run in document["runs"] if run["system"] == "fedfair"}
    grids = ", ".join(
        f"n = {parties}: {count(run['levels'])} levels (a step of {2 * settings['clip'] / run['levels']:.3g}), "
        f"threshold {run['threshold']}"
        for parties, run in fedfair_runs.items()
    )
    errors = {
        parties: max(
            run["mean_error"] for run in document["runs"] if run.get("parties") == parties and "mean_error" in run
        )
        for parties in fedfair_runs
    }
    notes = [
        "",
        f"d = {count(settings['dimension'])}, every site's weight {settings['weight']} (both sides' max weight), "
        f"clip {settings['clip']} per unit of weight, sums modulo 2^{settings['modulus_bits']}; the median of "
        f"{settings['measured_rounds']} rounds after a warm-up one, {settings['pairs']} runs of each, interleaved. "
        f"Both sides quantise to the same grid and unmask with the same threshold ({grids}): each tolerates "
        "n - threshold sites dropping after they sent their keys. Flower's unmasked mean was within "
        + ", ".join(f"{error:.3g} (n = {parties})" for parties, error in errors.items())
        + " of the exact mean: within a step, as its stochastic rounding bounds it. This machine is shared: a "
        "round's wall is mostly its wait for the cores (every Flower party is a thread of one interpreter); "
        "compare the CPU and the bytes.",
        "",
        "What each masks: fedfair clips each entry of x_k to [-clip, clip] and encodes b_k x_k in fixed point "
        "(signed, the finest step whose sum of n cannot wrap), in 16-bit words on the wire; Flower scales x_k by "
        "b_k / max_weight, clips each entry to [-clip, clip], rounds it stochastically to its levels and appends its "
        "quantised weight as one more entry, and its masked vector travels as int64 (64 bits a coordinate whatever "
        "the modulus). fedfair's masks are AES-256-CTR keystreams; Flower's are numpy's Mersenne Twister "
        "(`RandomState`, not a cryptographic generator) seeded with the 32-byte key folded to 32 bits "
        "(`pseudo_rand_gen`), so each mask is one of 2^32. fedfair's round is Bonawitz et al.'s active-adversary "
        "form (signed keys and survivor sets, over gRPC and mutual TLS, in its wall and server CPU; a site's CPU is "
        "its handlers' and round job's threads, not gRPC's); Flower's trusts "
        "the server's word on who dropped, and its figures are its protocol code alone (no gRPC, no TLS, no "
        "ClientApp process start-up, which its deployment engine adds to each of SecAgg+'s four messages a round).",
    ]
    return Section(
        "Masking a d = 10^6 update: Flower's SecAgg+ beside fedfair's secure round",
        "One round of secure aggregation of a fixed update (nothing to train) by n sites. fedfair: round_bench's "
        "federation (aggregator, collaborators as processes, gRPC over loopback mutual TLS); wall is the "
        "aggregator's round, CPU per site a collaborator's handlers and round job, server CPU the aggregator's "
        "process, bytes the uploads it received. Flower: its own `SecAggPlusWorkflow` and `secaggplus_mod` "
        "(Flower 1.42, `FedAvg`), each node a thread of one process that receives every message serialised by "
        "Flower's protobuf serde; CPU is each node's and the server's thread, bytes the serialised messages.",
        table(header, rows) + notes,
    )


def attack_matrix(name: str, document: Mapping[str, Any]) -> Section:
    """Attacks handled per way of attacking, the fuzz run's outcome, and every attack not handled."""
    methods: dict[str, list[bool]] = {}
    made = [attack for attack in document["attacks"] if "skipped" not in attack]
    for attack in made:
        methods.setdefault(attack["method"], []).append(bool(attack["handled"]))
    rows = [
        [method, str(len(handled)), str(sum(handled)), str(len(handled) - sum(handled))]
        for method, handled in sorted(methods.items(), key=lambda item: -len(item[1]))
    ]
    fuzz = document["fuzz"]
    statuses = ", ".join(f"{status} {count(number)}" for status, number in fuzz["statuses"].items())
    scenarios = ", ".join(f"{scenario} {seconds:g}" for scenario, seconds in document["scenario_seconds"].items())
    lines = table(["how the attack is made", "attacks", "handled", "not handled"], rows)
    lines += [
        "",
        f"Fuzzing: {count(fuzz['messages'])} mutated messages in {fuzz['seconds']:g} s; {fuzz['crashes']} crashes, "
        f"{fuzz['hangs']} hangs, {fuzz['invalid_rounds_applied']} invalid rounds applied, "
        f"{fuzz['uploads_accepted']} uploads accepted. The server's answers: {statuses}.",
        "",
        f"Seconds per scenario: {scenarios} ({document['seconds']:g} s in all"
        + (", a quick run)." if document["quick"] else ")."),
    ]
    if document["failed"]:
        lines += ["", "Not handled:", ""] + [f"- {attack}" for attack in document["failed"]]
    skipped = [attack for attack in document["attacks"] if "skipped" in attack]
    if skipped:  # neither handled nor failed: the machine lacked what the attack needs
        lines += ["", "Skipped on the measuring machine:", ""]
        lines += [f"- {attack['attack']}: {attack['skipped']}" for attack in skipped]
    earlier = document.get("earlier_provenance")
    if earlier:  # a partial run (--merge) re-measured some rows: say which, and where the rest come from
        lines += [
            "",
            f"Rows without a stamp of their own were measured by `{earlier['command']}` on {earlier['date']}; "
            "these were re-measured by a partial run (`--only ... --merge`), each stamped in the JSON:",
            "",
        ]
        lines += [
            f"- {attack['attack']}: {'handled' if attack['handled'] else 'NOT handled'} "
            f"({attack['measured']['date']}, commit {attack['measured']['commit']})"
            for attack in document["attacks"]
            if "measured" in attack
        ]
    return Section(
        "Attack suite: hostile clients and a cheating aggregator",
        "Attacks on a real federation over loopback, each beside what the design says must happen; an attack "
        "is handled when what was observed is what was expected. Each row's expected and observed outcome is in "
        "the JSON.",
        lines,
    )


def wire_width(name: str, document: Mapping[str, Any]) -> Section:
    """What a round of a large model costs on the wire and in memory at the plan's word size, each row measured."""
    bits = document.get("modulus_bits", 64)
    rows = [
        (
            count(row["dimension"]),
            str(row["parties"]),
            "secure" if row["secure"] else "plain",
            "processes" if row["processes"] else "threads",
            fixed(row["bits_per_coordinate"], 1),
            fixed(row["aggregator_received_bytes"] / 1e6, 0),
            fixed(row["round_seconds"], 2),
            fixed(row["party_cpu_seconds"], 2),
            fixed(row["aggregator_cpu_seconds"] or row["process_cpu_seconds"], 2),
            fixed(row["peak_rss_mb"], 0),
            fixed(row["party_peak_rss_mb"], 0),
            fixed(row.get("party_model_copies"), 1),
            fixed(row.get("party_copies_since_process_start"), 1),
        )
        for row in document["results"]
    ]
    header = ("d", "n", "sums", "parties as", "bits / coordinate", "received (MB)", "round (s)",
              "party CPU (s)", "aggregator CPU (s)", "peak (MB)", "party peak (MB)",
              "party's rounds (model copies)", "since process start (copies)")  # fmt: skip
    ratios = [
        f"Secure ÷ plain at {key}: round {ratio(value['whole_round'])}, a party's CPU {ratio(value['party_cpu'])}."
        for key, value in document.get("ratios", {}).items()
    ]
    return Section(
        f"A large model through the secure sum in {bits}-bit words: bytes, CPU and memory",
        "One training round of a d-parameter update with local training taken out, in the real runtime (gRPC over "
        "loopback mutual TLS): the bits the aggregator received per coordinate, the round's wall time, each "
        "party's and the aggregator's CPU seconds (what a shared 2-core machine distorts least) and the peak "
        "resident memory of the process (threads: every party in it) and of the largest party.",
        [
            *table(header, rows),
            "",
            *ratios,
            *(
                ["The peak with threads counts the aggregator and every party in one process."]
                if any(not row["processes"] for row in document["results"])
                else []
            ),
            *(
                [
                    "A party's rounds are its peak less its resident memory as its first round starts (imports, "
                    "configuration, identity, the plan, the compiled kernels and the update it sends, which stands "
                    "in for the model a real site holds by then), in float32 copies of the model (4 d bytes); the "
                    "last column counts from the process's start instead. n/a where the run did not measure it."
                ]
                if any(row["processes"] for row in document["results"])
                else []
            ),
        ],
    )


ROUND_CPU_GOAL = 1.10
"""A secure round's CPU per party may be at most this many times the reference commit's (issue 97)."""


def round_compare(name: str, document: Mapping[str, Any]) -> Section:
    """Per size, this tree's secure round against the pinned reference: party CPU, peaks, then each step's CPU."""
    results = document["results"]
    header = ["d", "n", "secure party CPU (ms)", "reference (ms)", "ratio (each pair)", "within goal"]
    header += ["peak MB, secure (reference)", "peak MB, plain (reference)"]
    rows = [
        [count(row["dimension"]), str(row["parties"])]
        + [cpu_ms(row["head"]["secure_party_cpu_seconds"]), cpu_ms(row["reference"]["secure_party_cpu_seconds"])]
        + [f"{ratio(row['secure_party_cpu_ratio'])} ({', '.join(fixed(v, 2) for v in row['secure_party_cpu_ratios'])})"]
        + ["yes" if row["secure_party_cpu_ratio"] <= ROUND_CPU_GOAL else "no"]
        + [
            f"{peaks(row['head'][f'{setting}_peak_rss_mb_each'])} ({peaks(row['reference'][f'{setting}_peak_rss_mb_each'])})"
            for setting in ("secure", "plain")
        ]
        for row in results
    ]
    traced = all(row.get("live_peak_ratio") for row in results)  # results made before the live peaks have none
    if traced:
        header += ["live MB, secure (reference)", "live MB, plain (reference)", "live within goal"]
        for row, cells in zip(results, rows, strict=True):
            cells += [
                f"{peaks(row['head'][f'{setting}_live_peak_mb_each'])} "
                f"({peaks(row['reference'][f'{setting}_live_peak_mb_each'])})"
                for setting in ("secure", "plain")
            ]
            cells.append("yes" if max(row["live_peak_ratio"].values()) <= row["live_peak_goal"] else "no")
    notes = [
        "",
        f"{document['runs']} runs of each tree per size, alternating which runs first; the reference is commit "
        f"{document['reference']}. Goal: a secure round's CPU per party at most {ROUND_CPU_GOAL:.2f}× the "
        "reference's. The peaks are the whole process's (the aggregator and every party, as threads), each run's. "
        + (
            f"The live peaks come from {document['memory_runs']} further run{'' if document['memory_runs'] == 1 else 's'} "
            "of each tree with every allocation traced "
            "(tracemalloc): the most memory numpy arrays and Python objects held at once, counted as they are freed, "
            "which the host's reclaiming and the allocator's keeping of freed memory cannot move as they move the "
            f"resident peak (torch tensors and gRPC's buffers are not traced). Goal: this tree's at most "
            f"{results[0]['live_peak_goal']:.2f}× the reference's (medians), plain and secure. "
            if traced
            else ""
        )
        + "Whole runs one after the other let whichever tree runs on pages the host has reclaimed pay for them: "
        "the CPU ratio moves by 0.1 between runs of the same trees, and `make bench-round` runs the lock-step "
        "comparison (the next section) instead; this one gives the plain rounds and the peaks.",
    ]
    return Section(
        "A secure round against the reference commit: CPU per party, per step, and peak memory",
        f"{document['what'][:1].upper()}{document['what'][1:]}.",
        table(header, rows)
        + notes
        + party_steps(results, "a run's measured rounds do not, its warm-up round writes round 1's"),
    )


def round_compare_paired(name: str, document: Mapping[str, Any]) -> Section:
    """Per size, both trees' secure rounds in lock-step: the paired ratios with their intervals, user and system
    CPU and page faults a party's round, then each step's CPU."""
    results = document["results"]
    header = ["d", "n", "pairs", "party CPU (ms)", "reference (ms)", "ratio [interval] (each run)", "within goal"]
    header += ["user CPU (ms)", "reference (ms)", "user ratio", "system CPU (ms)", "reference (ms)"]
    header += ["minor faults", "reference", "process CPU ratio", "peak MB (reference)"]
    rows = [
        [count(row["dimension"]), str(row["parties"]), f"{row['runs']} × {row['measured_rounds']}"]
        + [cpu_ms(row[tree]["secure_party_cpu_seconds"]) for tree in ("head", "reference")]
        + [paired_ratio(row, "party_cpu"), within_goal(row["secure_party_cpu_ratio_interval"])]
        + [cpu_ms(row[tree]["secure_party_user_seconds"]) for tree in ("head", "reference")]
        + [paired_ratio(row, "party_user_cpu")]
        + [cpu_ms(row[tree]["secure_party_system_seconds"]) for tree in ("head", "reference")]
        + [f"{row[tree]['secure_party_minor_faults']:,.0f}" for tree in ("head", "reference")]
        + [paired_ratio(row, "process_cpu")]
        + [f"{peaks(row['head']['secure_peak_rss_mb_each'])} ({peaks(row['reference']['secure_peak_rss_mb_each'])})"]
        for row in results
    ]
    coverage = min(row["secure_party_cpu_ratio_interval"]["coverage"] for row in results)
    notes = [
        "",
        f"Both trees run at once and take turns round by round, ABBA (the reference is commit "
        f"{document['reference']}): each measured round of one and the same round of the other is a pair, and a "
        "ratio is this tree's over the reference's in one pair (a party's figures are the median party's in the "
        "round). Each size runs so several times (runs × measured rounds), each run two fresh processes, the tree "
        "that starts alternating. Shown: the median ratio over every pair, in square brackets a distribution-free "
        f"interval for it (the sign test's order statistics, at least {100 * coverage:.1f}% coverage, which counts "
        "the pairs as independent), then each run's median, whose spread is what a process's own state (which "
        "party gets freed memory back and which faults in fresh pages) moves between runs. Goal: a secure round's CPU per "
        f"party at most {ROUND_CPU_GOAL:.2f}× the reference's; within goal says yes where the whole interval is "
        "below it, no where the whole interval is above it, and open where it spans the goal. User CPU and the "
        "minor page faults (a party's round, the median) are what the code does; system CPU is where this VM's "
        "host reclaiming freed pages shows. The process CPU counts the aggregator's and gRPC's threads too; the "
        "peaks are each run's process's (the aggregator and every party). Run `make bench-round` after a change "
        "to the secure round's path (secagg, the collaborator's steps, its model chain, the transport) and before "
        "merging it; it prints this comparison.",
    ]
    return Section(
        "A secure round against the reference commit, round by round in lock-step: CPU per party, user and system",
        f"{document['what'][:1].upper()}{document['what'][1:]}.",
        table(header, rows)
        + notes
        + party_steps(
            results,
            "the warm-up round writes round 1's, and round 9 is one of the measured rounds here"
            if min(row["measured_rounds"] for row in results) >= 8  # rounds 2 to R + 1
            else "the measured rounds do not, the warm-up round writes round 1's",
        ),
    )


def paired_ratio(row: Mapping[str, Any], name: str) -> str:
    """One paired ratio's median and interval, then each run's median: "1.03× [0.98, 1.07] (1.01, 1.05)"."""
    interval = row[f"secure_{name}_ratio_interval"]
    runs = ", ".join(fixed(value, 2) for value in row[f"secure_{name}_ratio_each_run"])
    return (
        f"{ratio(row[f'secure_{name}_ratio'], 3)} [{fixed(interval['low'], 3)}, {fixed(interval['high'], 3)}] ({runs})"
    )


def within_goal(interval: Mapping[str, float]) -> str:
    """Whether a ratio's interval lies below the goal (yes), above it (no), or spans it (open)."""
    if interval["high"] <= ROUND_CPU_GOAL:
        return "yes"
    return "no" if interval["low"] > ROUND_CPU_GOAL else "open"


def party_steps(results: list[Mapping[str, Any]], whole_states: str) -> list[str]:
    """Each party step's median call in both trees at every size, then where each size's extra CPU goes;
    `whole_states` says which of the runs' rounds wrote a chain's state whole."""
    steps = sorted({label for row in results for label in row["steps"]})
    step_header = ["step of a party's secure round"]
    for row in results:
        step_header += [f"d = {count(row['dimension'])}, n = {row['parties']} (ms)", "reference (ms)"]
    step_rows = [
        [label] + [cpu_ms(row["steps"].get(label, {}).get(tree)) for row in results for tree in ("head", "reference")]
        for label in steps
    ]
    intro = [
        "",
        "Each step's CPU on its own thread, the median call (training sums only). A stage's step is the client's "
        "(`Client.advertise` to `Client.verify`); `chain: model sent` is the site checking the model it is sent "
        "against its chain, `chain: sum verified` the site taking the verified sum: decoding it, holding it to the "
        "plan's bounds, the server step, and the anchor kept on disk before its verdict leaves (`chain: anchor "
        "kept`, part of it: the round's verified sum logged and synced, and the anchor naming it; one round in 8 "
        f"writes a state whole instead: {whole_states}):",
        "",
    ]
    culprits = [line for row in results for line in ("", largest_extra(row))]
    return intro + table(step_header, step_rows) + culprits


def cpu_ms(seconds: float | None) -> str:
    """CPU seconds in milliseconds: three significant digits below 100 ms, whole milliseconds from there."""
    if seconds is None:
        return "n/a"
    return f"{1000 * seconds:,.0f}" if seconds >= 0.1 else f"{1000 * seconds:.3g}"


def peaks(values: list[float]) -> str:
    """Each run's peak in MB, as "1,520, 1,612"."""
    return ", ".join(f"{value:,.0f}" for value in values)


def largest_extra(row: Mapping[str, Any]) -> str:
    """Where one size's extra CPU goes: the step whose median call grew most, against the whole party's growth."""
    grown = {
        label: spent["head"] - (spent["reference"] or 0.0)
        for label, spent in row["steps"].items()
        if spent["head"] is not None
    }
    label = max(grown, key=lambda step: grown[step])
    extra = row["head"]["secure_party_cpu_seconds"] - row["reference"]["secure_party_cpu_seconds"]
    return (
        f"At d = {count(row['dimension'])}, n = {row['parties']} a party's secure round costs "
        f"{cpu_ms(abs(extra))} ms {'more' if extra >= 0 else 'less'} than the reference's; the step that grew most "
        f"is {label}, by "
        f"{cpu_ms(grown[label])} ms a call."
    )
