"""The benchmark page's sections on learning: what DP costs, FedSRCVaR against FedAvg and against the
centralised optimum, convergence, one lying site's damage, and the simulation's speed.

Each function turns one result file's JSON into a `Section`; a row states only what the JSON holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from report_plots import Point, curves, risk_versus_epsilon
from report_tables import Plot, Section, count, fixed, milliseconds, percent, ratio, table

NO_DP = "no DP"

SIMULATED_FEDERATIONS = {"3": "3 clients by race", "51": "51 near-equal clients", "51-dirichlet": "51 uneven clients"}
"""simulation_speed's federation keys, as a reader knows them."""


def shown_epsilon(value: Any) -> str:
    """A DP epsilon as the JSON writes it, "inf" read as training without DP."""
    return "inf (no DP)" if value == "inf" else f"{value:g}"


def dp_bench(name: str, document: Mapping[str, Any]) -> Section:
    """DP-SGD's throughput beside plain training per clipping mode, and utility against epsilon."""
    rows = []
    for device, models in document["throughput"].items():
        for model, figures in models.items():
            for mode, private in figures["modes"].items():
                chosen = " (auto)" if mode == figures["mode"] else ""
                rows.append(
                    [device, f"{model} on {figures['data']}", str(figures["batch_size"])]
                    + [count(round(figures["plain_samples_per_s"])), f"{mode}{chosen}"]
                    + [count(round(private["dp_samples_per_s"])), ratio(private["dp_vs_plain_time"])]
                )
    header = ["device", "model on data", "batch", "plain samples/s", "DP clipping mode"]
    header += ["DP samples/s", "DP step time ÷ plain"]
    lines = table(header, rows)
    lines += [
        "",
        f"On {document['torch_threads']} torch thread(s). The JSON holds no Opacus run, so this page cannot put "
        "fedfair's DP-SGD beside Opacus: the comparison measured is plain training and fedfair's own clipping "
        "modes.",
    ]
    plots: tuple[Plot, ...] = ()
    utility = document.get("utility")
    if isinstance(utility, Mapping):
        setup = utility["setup"]
        lines += [
            "",
            f"Utility: `fedfair simulate {' '.join(setup['flags'])}` with every collaborator at the DP epsilon "
            f"(delta {setup['delta']:g}, {setup['accountant']} accountant), held-out risks of the "
            f"{setup['iterate']} iterate.",
            "",
        ]
        lines += table(
            ["DP epsilon", "clip C", "worst-group risk", "mean risk", "accuracy", "threshold c"],
            (
                [shown_epsilon(row["dp_epsilon"]), fixed(row["max_grad_norm"], 0), fixed(row["worst_risk"])]
                + [fixed(row["mean_risk"]), fixed(row["accuracy"]), fixed(row["c"])]
                for row in utility["rows"]
            ),
        )
        private = [row for row in utility["rows"] if row["max_grad_norm"] is not None]
        lines_by_clip: dict[str, list[Point]] = {}
        for row in private:
            lines_by_clip.setdefault(f"clip C = {row['max_grad_norm']:g}", []).append(
                (float(row["dp_epsilon"]), row["worst_risk"], 0.0)
            )
        flags = setup["flags"]
        dataset = flags[flags.index("--dataset") + 1] if "--dataset" in flags else "utility"
        references = {dataset: row["worst_risk"] for row in utility["rows"] if row["max_grad_norm"] is None}
        plots = (
            Plot(
                f"{name}_worst_risk_vs_epsilon.png",
                "Worst-group risk against the DP epsilon, per clip bound, beside training without DP",
                partial(risk_versus_epsilon, {dataset: lines_by_clip}, references, NO_DP),
            ),
        )
    return Section(
        "What DP-SGD costs: throughput and utility against plain training",
        "One collaborator's local steps with and without DP-SGD (joint clipping of theta and c, Gaussian noise), "
        "samples per second at the same batch size, best of three interleaved blocks; then FedSRCVaR's held-out "
        "risks at DP epsilon 1, 3 and 8 beside the same federation without DP.",
        lines,
        plots,
    )


def dp_utility(name: str, document: Mapping[str, Any]) -> Section:
    """Worst-group risk without DP, with local DP and with distributed DP, per dataset and epsilon."""
    by_key = {(row["dataset"], row["mode"], float(row["epsilon"])): row for row in document["rows"]}
    federations = {row["dataset"]: row for row in document["rows"] if row["mode"] == "none"}

    def cell(dataset: str, mode: str, value: float) -> str:
        row = by_key.get((dataset, mode, value))
        if row is None:
            return "not measured"
        spread = row.get("worst_group_risk_sd")
        return fixed(row["worst_group_risk"]) + ("" if spread is None else f" ± {spread:.2g}")

    rows = []
    for dataset, reference in federations.items():
        for value in sorted({key[2] for key in by_key if key[0] == dataset and key[1] != "none"}):
            rows.append(
                [f"{dataset} ({reference['sites']} sites, {reference['colluders']} colluding)", f"{value:g}"]
                + [fixed(reference["worst_group_risk"]), cell(dataset, "local", value)]
                + [cell(dataset, "distributed", value)]
            )
    lines = table(["federation", "DP epsilon", NO_DP, "local DP", "distributed DP"], rows)
    lines += ["", "Held-out worst-group risk (± the standard deviation over the repeats with fresh noise)."]
    targets = document.get("targets", {})
    excess = [(key, value) for key, value in targets.items() if key.endswith("_eps1_over_none")]
    if excess:
        lines += ["", "At DP epsilon 1 the worst-group risk exceeds the run without DP by:", ""]
        lines += table(
            ["federation and mode", "worst-group risk above no DP", "the benchmark's target"],
            (
                [key.removesuffix("_eps1_over_none").replace("_", ", "), percent(value), target(targets, key)]
                for key, value in excess
            ),
        )
    panels: dict[str, dict[str, list[Point]]] = {}
    for (dataset, mode, value), row in by_key.items():
        if mode != "none":
            label = f"{mode} DP"
            panels.setdefault(dataset, {}).setdefault(label, []).append(
                (value, row["worst_group_risk"], row.get("worst_group_risk_sd") or 0.0)
            )
    references = {dataset: row["worst_group_risk"] for dataset, row in federations.items()}
    plot = Plot(
        f"{name}_worst_risk_vs_epsilon.png",
        "Worst-group risk against the DP epsilon, local and distributed DP beside no DP",
        partial(risk_versus_epsilon, panels, references, NO_DP),
    )
    return Section(
        "Distributed DP against local DP: worst-group risk against epsilon",
        "FedSRCVaR (logistic regression) with no DP, with every site adding its own noise (local DP-SGD), and with "
        "Skellam noise added inside the secure sum (distributed DP), calibrated so the honest sites carry the "
        "whole noise; then the secure-aggregation encoder with noise against the raw keystream.",
        lines,
        (plot,),
        tuple(encoding(document.get("encoding"))),
    )


def target(targets: Mapping[str, Any], excess_key: str) -> str:
    """The target the JSON records for one `DATASET_MODE_eps1_over_none` figure, as "within 10 %: met".

    The benchmark names a target `STEM_MODE_eps1_within_Npct`, STEM being the dataset's name up to its
    first hyphen ("census" for census-income)."""
    dataset, mode = excess_key.removesuffix("_eps1_over_none").rsplit("_", 1)
    for key, met in targets.items():
        stem, _, bound = key.rpartition("_eps1_within_")
        if stem.rsplit("_", 1) == [dataset.split("-")[0], mode] and bound.endswith("pct"):
            return f"within {bound.removesuffix('pct')} %: {'met' if met else 'missed'}"
    return "none recorded"


def encoding(figures: Mapping[str, Any] | None) -> list[str]:
    """The noised encoder's cost per stage against one mask's keystream (dp_utility's `encoding`)."""
    if figures is None:
        return []
    seconds = figures["seconds"]
    keystream = seconds["keystream"]
    labels = {
        "keystream": "one mask's AES-CTR keystream (the yardstick)",
        "plain": "plain encode + one mask",
        "noised": "noised encode (rotation, rounding, Skellam noise) + one mask",
        "numpy_skellam": "numpy's Skellam sampler alone, as many coordinates",
    }
    rows = [[labels.get(key, key), milliseconds(value), ratio(value / keystream, 1)] for key, value in seconds.items()]
    return (
        [
            f"Encoding at d = {count(figures['dimension'])} ({count(figures['encoded_words'])} words), CPU time, best of "
            "five, interleaved:",
            "",
        ]
        + table(["step", "CPU (ms)", "÷ keystream"], rows)
        + [
            "",
            f"The noised encode + mask costs {ratio(figures['noised_vs_reference'])} a plain encode + mask plus numpy's "
            "sampler: what a non-cryptographic noised encoder would cost at the least.",
        ]
    )


def census_fairness(name: str, document: Mapping[str, Any]) -> Section:
    """FedSRCVaR beside FedAvg on the paper's Census-Income setting, metric by metric."""
    ours, theirs = document["fedsrcvar"], document["fedavg"]
    labels = {
        "worst_risk": f"worst-group risk (rho = {ours['rho']:g}, cross-entropy)",
        "mean_risk": "mean risk (cross-entropy)",
        "best_risk": "best-group risk",
        "disparity": "risk disparity",
        "accuracy": "accuracy",
        "worst_error": "worst-group error",
        "mean_error": "mean error",
        "seconds": "wall time (s)",
    }
    rows = [
        [label, fixed(ours[key], 1 if key == "seconds" else 3), fixed(theirs[key], 1 if key == "seconds" else 3)]
        for key, label in labels.items()
        if key in ours
    ]
    lines = table(["held-out figure", "FedSRCVaR", "FedAvg"], rows)
    lines += ["", f"FedSRCVaR's worst-group risk is {ratio(document['worst_risk_ratio'])} FedAvg's."]
    return Section(
        "FedSRCVaR against FedAvg on Census-Income",
        "The paper's table setting: Census-Income KDD split by race into 3 clients (White, Black, Other), the MLP "
        "with 512 hidden units, both methods with the same flags otherwise; held-out risks on the test rows.",
        lines,
    )


CONVERGENCE_METHODS = {
    "fedsrcvar_before": "FedSRCVaR, plain server step",
    "fedsrcvar_after": "FedSRCVaR, server momentum",
    "fedavg": "FedAvg",
}


def convergence_bench(name: str, document: Mapping[str, Any]) -> Section:
    """Rounds to fit and final held-out figures per method and dataset, h̄ and the base rate beside, and the curves."""
    header = ["dataset", "method", "final worst-group risk", "mean risk", "accuracy", "best worst-group risk"]
    header += ["rounds to within 1 % of its best", "rounds to FedAvg's final risk", "training RCVaR", "CPU (s)"]
    rows = []
    panels: dict[str, dict[str, dict[int, float]]] = {}
    for dataset, methods in document["results"].items():
        for method, label in CONVERGENCE_METHODS.items():
            figures = methods[method]
            reached = figures["rounds_to_fedavg_final"]
            rows.append(
                [dataset, label, fixed(figures["final_worst_risk"]), fixed(figures["final_mean_risk"])]
                + [fixed(figures["final_accuracy"]), fixed(figures["best_worst_risk"])]
                + [str(figures["rounds_to_within_1pct"]), "never" if reached is None else str(reached)]
                + [fixed(figures["final_train_rcvar"]), fixed(figures["cpu_seconds"], 1)]
            )
            panels.setdefault(dataset, {})[label] = {int(round_): risk for round_, risk in figures["curve"].items()}
        for predictor, constant in methods["references"].items():
            figures = [fixed(constant[f"final_{figure}"]) for figure in ("worst_risk", "mean_risk", "accuracy")]
            rows.append([dataset, f"{predictor}, a constant", *figures] + [""] * 5)
    plot = Plot(
        f"{name}_curves.png",
        "Held-out worst-group risk of the output model against the rounds run, per method",
        partial(curves, panels, "held-out worst-group risk"),
    )
    return Section(
        "Convergence: FedSRCVaR against FedAvg, round by round",
        f"The 512-unit MLP, rho = {document['rho']:g}, epsilon = {document['epsilon']:g}, {document['rounds']} rounds: "
        "every few rounds, the held-out worst-group risk of the model a run of that many rounds would output; the "
        "final output's held-out mean risk and accuracy beside it, and the uniform classifier's and the base rate's. "
        "'never' means the method did not reach FedAvg's final risk within the rounds.",
        table(header, rows),
        (plot,),
    )


def server_step_bench(name: str, document: Mapping[str, Any]) -> Section:
    """Each server step's validation figures and training RCVaR at 200 rounds, FedAvg, h̄ and the base rate beside."""
    header = ["server step", "step (x curvature step)", "local steps", "validation worst-group risk", "mean risk"]
    header += ["accuracy", "training RCVaR", "CPU (s)"]
    rows = [
        [row["server_step"], "" if row["step_multiple"] is None else f"{row['step_multiple']:g}"]
        + [str(row["local_steps"]), fixed(row["validation_worst_risk"]), fixed(row["validation_mean_risk"])]
        + [fixed(row["validation_accuracy"]), fixed(row["train_rcvar"]), fixed(row["cpu_seconds"], 1)]
        for row in document["rows"]
    ]
    for constant, figures in document["references"].items():
        shown = [fixed(figures[f"validation_{figure}"]) for figure in ("worst_risk", "mean_risk", "accuracy")]
        rows.append([f"{constant}, a constant", "", "", *shown, "", ""])
    return Section(
        "Server step: Algorithm 1's, momentum or FedAdam",
        f"MNIST, one digit per site, the 512-unit MLP, rho = {document['rho']:g}, epsilon = {document['epsilon']:g}, "
        f"B = 1, {document['rounds']} rounds, seed 0, on validation rows: FedSRCVaR's output under each server step "
        "beside FedAvg's.",
        table(header, rows),
    )


def reference_gap(name: str, document: Mapping[str, Any]) -> Section:
    """The federation's objective beside the centralised optimum over the (epsilon, rho) grid."""
    rows = [
        [f"{row['epsilon']:g}", f"{row['rho']:g}", f"{row['federated']:.5f}", f"{row['reference']:.5f}"]
        + [percent(row["relative_gap"], 3)]
        for row in document["grid"]
    ]
    lines = table(["smoothing epsilon", "rho", "federated objective", "centralised optimum", "relative gap"], rows)
    lines += ["", f"Largest gap: {percent(document['max_relative_gap'], 3)}; {document['seconds']:.0f} s in all."]
    return Section(
        "FedSRCVaR against the centralised optimum",
        "Adult, logistic regression, 3 clients by race: the federation's averaged smoothed training objective "
        "beside the optimum `reference.py` computes on the pooled data.",
        lines,
    )


def influence_bench(name: str, document: Mapping[str, Any]) -> Section:
    """Each lying or poisoning run's damage beside the honest run's, plain and secure."""
    header = ["run", "aggregation", "rounds applied / aborted", "worst-group loss", "÷ honest"]
    header += ["pooled rho-worst risk", "÷ honest", "accuracy"]
    rows = [
        [f"`{run}`", "secure" if figures["secure"] else "plain"]
        + [f"{figures['rounds_applied']} / {figures['rounds_aborted']}"]
        + [fixed(figures["worst_group_loss"]), ratio(figures.get("worst_loss_ratio"))]
        + [fixed(figures["worst_rho_risk"]), ratio(figures.get("worst_rho_risk_ratio")), fixed(figures["accuracy"])]
        for run, figures in document["runs"].items()
    ]
    settings = document["settings"]
    lines = table(header, rows) + [
        "",
        "Runs: `honest` has no liar; `claim-1e6` claims weight 10^6; `bound` sends an update of norm exactly the "
        "bound toward the target every round; `mean-bound-F` (secure only) sends a weighted vector of norm F "
        "times the agreed total weight times the bound; `poison` is an honest participant training on flipped "
        "labels, the yardstick no protocol can detect. Ratios are to the honest run with the same aggregation; "
        "n/a for the honest runs.",
        "",
        f"Setting: {settings['data']}, {settings['objective']}, {settings['rounds']} rounds; target: "
        f"{settings['target']}.",
    ]
    return Section(
        "Bounded influence: one lying site's damage against an honest run",
        "How much one institution that lies about its weight or its update can damage the model with the plan's "
        "[influence] bounds in force, measured on live loopback federations, beside an honest run and a site "
        "poisoning its own labels.",
        lines,
    )


def simulation_speed(name: str, document: Mapping[str, Any]) -> Section:
    """The vectorised simulation beside the loop over learners, per federation."""
    rows = [
        [SIMULATED_FEDERATIONS.get(federation, federation), document["modes"][federation], fixed(speed, 0)]
        + [fixed(document["rounds_per_s_loop"][federation], 0), ratio(document["vectorised_speedup"][federation], 1)]
        + [fixed(document["setup_s"][federation], 3)]
        for federation, speed in document["rounds_per_s"].items()
    ]
    sweep = document["sweep"]
    lines = table(["federation", "mode chosen", "rounds/s as run", "rounds/s, loop", "speed-up", "setup (s)"], rows)
    lines += [
        "",
        f"A local step costs {ratio(document['step_overhead_ratio'])} a bare forward/backward/update on the same "
        f"batch. A sweep of {sweep['points']} points x {sweep['rounds']} rounds took {sweep['seconds']:.1f} s "
        f"with {sweep['jobs']} jobs, on {document['device']}.",
    ]
    return Section(
        "Simulation speed: vectorised clients against the loop",
        "Rounds per second of the in-process simulation on Adult (logistic regression): 3 clients by race, 51 "
        "near-equal clients and 51 uneven ones (Dirichlet label skew), as it runs (vectorised where it pays) "
        "beside the plain loop over learners.",
        lines,
    )


def dp_bits(name: str, document: Mapping[str, Any]) -> Section:
    """Which word sizes the distributed-DP training sums of dp_utility's federations fit, and at what noise."""
    rows = [
        (
            row["dataset"],
            str(row["sites"]),
            fixed(row["max_weight"], 0),
            str(row["modulus_bits"]),
            "yes" if row["fits"] else "no",
            "n/a" if row.get("fractional_bits") is None else str(row["fractional_bits"]),
            ratio(row.get("noise_std_vs_64_bit"), 3),
        )
        for row in document["rows"]
    ]
    return Section(
        "Distributed DP in 16-, 32- and 64-bit words: which federations fit, at what noise",
        f"The training noise's calibration (epsilon {document['epsilon']:g}, delta {document['delta']:g}, "
        f"{document['rounds']} rounds) with the word size and the largest weight a site sends: whether fractional "
        "bits exist that keep the sum within the words (a wrap at most 2^-40, counted in delta), and the decoded "
        "noise's standard deviation against the 64-bit run's.",
        table(("dataset", "sites", "max weight", "bits", "fits", "fractional bits", "noise vs 64-bit"), rows),
    )


def dp_utility_equal(name: str, document: Mapping[str, Any]) -> Section:
    """Equal weights' training noise calibrated to one record's true move against the former calibration."""
    rows = [
        (
            row["dataset"],
            row["mode"],
            row["weights"],
            "inf" if row["epsilon"] == "inf" else fixed(row["epsilon"], 1),
            fixed(row["worst_group_risk"], 3),
            fixed(row["mean_risk"], 3),
            fixed(row["accuracy"], 3),
            fixed(row.get("noise_std"), 4),
        )
        for row in document["rows"]
    ]
    return Section(
        "Equal weights under distributed DP: the noise one record needs against the former calibration",
        'FedSRCVaR under `weights = "equal"` with noise inside the secure sum: `equal` calibrated to one record\'s '
        "true move lr C / min b_k, `equal-batch` as before (as if each weight were the batch, min b_k times the "
        "noise); the held-out worst-group risk, mean risk and accuracy at the end.",
        table(
            ("dataset", "noise", "calibration", "epsilon", "worst-group risk", "mean risk", "accuracy", "noise std"),
            rows,
        ),  # fmt: skip
    )


def noised_statistics(name: str, document: Mapping[str, Any]) -> Section:
    """The worst-group risk with the statistics before round 1 noised, against exact statistics."""
    rows = [
        (
            row["statistics"],
            "inf" if row["epsilon"] == "inf" else fixed(row["epsilon"], 1),
            fixed(row["worst_group_risk"], 3)
            + ("" if row.get("worst_group_risk_sd") is None else f" ± {row['worst_group_risk_sd']:.3f}"),
            "n/a" if row.get("largest_mean_error_in_sds") is None else fixed(row["largest_mean_error_in_sds"], 2),
        )
        for row in document["rows"]
    ]
    sites = ", ".join(f"{site} {size:,}" for site, size in document["sites"].items())
    return Section(
        "Statistics before round 1, noised: the worst-group risk against exact statistics",
        f"Adult rows cut into three sites ({sites}) under a [schema]: the standardisation every site encodes with, "
        "from exact or noised sums (charged at the epsilon shown), and the held-out worst-group risk trained on "
        "it; ± is the standard deviation over fresh noises.",
        table(("statistics", "epsilon", "worst-group risk", "largest column-mean error (sd)"), rows),
    )
