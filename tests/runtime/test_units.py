"""The runtime's pieces without a network: checkpoints, the board, plain sums and their bounds, the
collaborator's learner and retries."""

from __future__ import annotations

import json
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fedfair.core import server
from fedfair.core.errors import ConfigError, FailureError, RefusedError
from fedfair.research.launch_baseline import simulation_options
from fedfair.runtime.local.workspace import make_workspace, toml_text
from fedfair.simulation.rounds import make_learners
from fedfair.runtime.aggregator.board import Board
from fedfair.runtime.output_folder import CHECKPOINT_NAME, ROUND_LOG_NAME
from fedfair.runtime.aggregator.checkpoint import (
    Checkpoint,
    append_round_log,
    atomic_write,
    load_checkpoint,
    read_round_log,
    save_checkpoint,
    state_digest,
    trim_round_log,
)
from fedfair.cli.aggregator import plan_from_args
from fedfair.runtime.aggregator.checks import decode_plain
from fedfair.runtime.aggregator.driver import DriverSettings, SumDriver
from fedfair.runtime.aggregator.bundles import initial_state
from fedfair.runtime.aggregator.start import prepare
from fedfair.runtime.collaborator.client import (
    Collaborator,
    clip_plain_update,
    model_digest,
)
from fedfair.privacy.ledger import data_digest
from fedfair.privacy.ledger_home import ledger_folder
from fedfair.runtime.collaborator.charges import data_identity
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.peer.retries import (
    RetryPolicy,
    refusal,
)
from fedfair.runtime.collaborator.trainer import build_learner, load_local_data
from fedfair.runtime.contract import EVALUATION, TRAINING
from fedfair.runtime.failures import NEVER_ANSWERED
from fedfair.runtime.plan.aggregator_plan import (
    load_aggregator_plan,
    load_shared_settings,
    shared_settings,
)
from fedfair.runtime.transport import StageGate, make_binding, pb
from fedfair.runtime.transport.chunks import PlainValues, plain_rounding, plain_upload
from fedfair.secagg import Encoder, EncodingConfig, SecurityParameters
from tests.federations import adult_by_race
from tests.runtime.harness import new_workspace
from fedfair.runtime.transport import WireStage
from tests.runtime.wire_stages import WIRE

NAMES = ["site-a", "site-b", "site-c"]


# ---------------------------------------------------------------- checkpoints


def a_state() -> server.ServerState:
    state = server.init(torch.arange(5, dtype=torch.float64), bound=10.0)
    aggregate = server.Aggregate(torch.full((5,), 0.25, dtype=torch.float64), -3.0, 2.0)
    return server.apply(server.apply(state, aggregate, bound=10.0), aggregate, bound=10.0)


def test_a_checkpoint_round_trips_exactly(tmp_path: Path) -> None:
    state = a_state()
    save_checkpoint(tmp_path, Checkpoint(7, state, "d" * 64, {"worst_risk": 0.5}))
    loaded = load_checkpoint(tmp_path, "d" * 64)
    assert loaded.round == 7 and loaded.evaluation == {"worst_risk": 0.5}
    assert state_digest(loaded.state) == state_digest(state)
    assert torch.equal(loaded.state.theta, state.theta) and loaded.state.c == state.c
    assert loaded.state.averaged_rounds == state.averaged_rounds == 2
    assert [path.name for path in tmp_path.iterdir()] == [CHECKPOINT_NAME]  # no temporary file left behind


def test_a_checkpoint_from_another_plan_is_refused(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, Checkpoint(3, a_state(), "a" * 64))
    with pytest.raises(ConfigError, match="written under another plan .*resume with the plan it was made with"):
        load_checkpoint(tmp_path, "b" * 64)
    with pytest.raises(ConfigError, match="no checkpoint .*start without --resume"):
        load_checkpoint(tmp_path / "empty", "a" * 64)
    (tmp_path / CHECKPOINT_NAME).write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="unreadable"):
        load_checkpoint(tmp_path, "a" * 64)


def test_an_interrupted_write_leaves_the_old_checkpoint(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, Checkpoint(1, a_state(), "a" * 64))
    before = (tmp_path / CHECKPOINT_NAME).read_bytes()

    def crash(stream) -> None:  # type: ignore[no-untyped-def]
        stream.write(b"half a checkpoint")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(tmp_path / CHECKPOINT_NAME, crash)
    assert (tmp_path / CHECKPOINT_NAME).read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == [CHECKPOINT_NAME]


def test_the_round_log_appends_json_lines(tmp_path: Path) -> None:
    append_round_log(tmp_path, {"round": 1, "status": "applied"})
    append_round_log(tmp_path, {"round": 2, "status": "aborted", "reason": "too few"})
    assert read_round_log(tmp_path) == [
        {"round": 1, "status": "applied"},
        {"round": 2, "status": "aborted", "reason": "too few"},
    ]


def test_a_non_finite_value_is_written_as_null_and_named_not_fatal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Strict JSON has no NaN: the writer used to raise, killing the aggregator mid-federation. Now each such value
    is null, named in the record and in a warning; an evaluation with one is aborted, its reason naming it."""
    evaluation = {"status": "done", "round": 3, "mean_risk": float("nan"), "worst_risk": 0.7, "samples": 900}
    record = {
        "round": 3, "status": "applied", "c": 0.4, "answer_seconds": {"site-a": float("inf"), "site-b": 1.5},
        "stages": [("mask", -math.inf)], "evaluation": evaluation,
    }  # fmt: skip
    with caplog.at_level("WARNING", logger="fedfair.aggregator"):
        append_round_log(tmp_path, record)
    named = ["answer_seconds.site-a (inf)", "stages[0][1] (-inf)", "evaluation.mean_risk (nan)"]
    (written,) = read_round_log(tmp_path)
    assert sorted(written["non_finite"]) == sorted(named) and written["c"] == 0.4
    assert written["answer_seconds"] == {"site-a": None, "site-b": 1.5} and written["stages"] == [["mask", None]]
    assert written["evaluation"]["mean_risk"] is None and written["evaluation"]["worst_risk"] == 0.7
    assert written["evaluation"]["status"] == "aborted"
    assert written["evaluation"]["reason"] == "figures not finite, written as null: evaluation.mean_risk (nan)"
    assert all(name in caplog.text for name in named) and "round 3: not finite" in caplog.text
    # In place: the evaluation the aggregator keeps (checkpoint, bundle, final model) is the record's, and every
    # strict writer takes it now.
    assert record["evaluation"] is evaluation and evaluation["status"] == "aborted"
    assert json.loads(json.dumps(record, sort_keys=True, allow_nan=False)) == written
    # A finite record is written as it is, with no such field.
    append_round_log(tmp_path, {"round": 4, "status": "applied", "c": 0.5})
    assert read_round_log(tmp_path)[1] == {"round": 4, "status": "applied", "c": 0.5}


def test_a_resume_drops_the_log_of_rounds_past_the_checkpoint(tmp_path: Path) -> None:
    """A round is logged just before its checkpoint: after a crash between the two, the resumed run
    re-runs that round, so its first record (and any torn line) must go, or the round is logged twice."""
    for round_number in (1, 2, 3):
        append_round_log(tmp_path, {"round": round_number, "status": "applied"})
    with (tmp_path / ROUND_LOG_NAME).open("a", encoding="utf-8") as stream:
        stream.write('{"round": 4, "sta')  # torn by a power cut in the middle of an append
    assert trim_round_log(tmp_path, 2) == 2
    assert read_round_log(tmp_path) == [{"round": 1, "status": "applied"}, {"round": 2, "status": "applied"}]
    before = (tmp_path / ROUND_LOG_NAME).read_bytes()
    assert trim_round_log(tmp_path, 2) == 0 and (tmp_path / ROUND_LOG_NAME).read_bytes() == before
    assert trim_round_log(tmp_path / "none", 5) == 0


def test_the_aggregator_refuses_to_overwrite_or_to_resume_the_wrong_run(tmp_path: Path) -> None:
    workspace = new_workspace(tmp_path, NAMES, training={"rounds": 4})
    plan = load_aggregator_plan(workspace.plan)
    start = prepare(plan, resume=False)
    assert start.round == 0 and torch.equal(start.state.theta, initial_state(plan).theta)
    save_checkpoint(workspace.output, Checkpoint(2, start.state, start.plan_digest))
    with pytest.raises(ConfigError, match="pass --resume to continue it"):
        prepare(plan, resume=False)
    assert prepare(plan, resume=True).round == 2
    changed = load_aggregator_plan(workspace.plan, {"objective": {"rho": 0.2}})
    with pytest.raises(ConfigError, match="another plan"):
        prepare(changed, resume=True)
    with pytest.raises(ConfigError, match="could wrap around"):  # refused as the plan is read
        load_aggregator_plan(workspace.plan, {"secure_aggregation": {"modulus_bits": 32}})


def test_a_plan_from_flags_alone(tmp_path: Path) -> None:
    import argparse

    args = argparse.Namespace(
        plan=None,
        federation_id=None,
        collaborators="a,b",
        address="127.0.0.1:5000",
        certs=str(tmp_path),
        output=str(tmp_path / "out"),
        name=None,
        rounds=9,
    )
    plan = plan_from_args(args)
    assert plan.collaborators == ("a", "b") and plan.training.rounds == 9 and plan.model.features == 107
    assert plan.aggregator.certs == tmp_path and plan.federation_id == "fedfair"
    args.certs = None
    with pytest.raises(ConfigError, match="without --plan the aggregator needs --certs"):
        plan_from_args(args)


# ---------------------------------------------------------------- the board


def test_a_stage_waits_on_a_condition_not_a_clock() -> None:
    board = Board("digest")
    for name in NAMES:
        board.connect(name, make_binding("f", 0, WIRE["STAGE_JOIN"]))
    board.new_round(1)
    binding = make_binding("f", 1, WIRE["STAGE_ADVERTISE_KEYS"])
    received: list[str] = []
    board.open_stage(
        binding, NAMES, b"in", lambda peer, payload: received.append(peer), max_upload_bytes=10, timeout=60.0
    )
    waiter = threading.Thread(target=board.wait_stage)
    waiter.start()
    board.deliver("site-a", binding, b"x")
    board.deliver("site-b", binding, b"")  # withdraws
    board.disconnect("site-c")  # gone: nobody waits for it
    waiter.join(60)  # settled at once: the bound only ends a failing test (a loaded machine may stall it seconds)
    assert not waiter.is_alive()
    assert board.close_stage() == (frozenset({"site-a"}), 1) and received == ["site-a"]


def test_a_task_stream_of_a_restarted_process_skips_the_round_in_progress() -> None:
    board = Board("digest")
    board.new_round(4)
    board.publish(["site-a"], make_binding("f", 4, WIRE["STAGE_TRAIN"]), pb.ACTION_RUN)
    board.finish(make_binding("f", 4, WIRE["STAGE_EVAL_UNMASK"]))
    fresh = list(
        board.stream_tasks("site-a", board.connect("site-a", make_binding("f", 0, WIRE["STAGE_JOIN"])), lambda: True)
    )
    assert [task.action for task in fresh] == [pb.ACTION_FINISHED]
    continuing = list(
        board.stream_tasks("site-a", board.connect("site-a", make_binding("f", 4, WIRE["STAGE_JOIN"])), lambda: True)
    )
    assert [task.action for task in continuing] == [pb.ACTION_RUN, pb.ACTION_FINISHED]


# ---------------------------------------------------------------- plain sums and their bounds

BOUNDS = EncodingConfig(clip=10.0, max_weight=100.0, fractional_bits=20, modulus_bits=64)


EVALUATION_UPLOAD = EVALUATION.plain_values
"""A plain evaluation upload: float64 values, then the float64 weight."""


def plain(*values: float) -> bytes:
    return np.array(values, dtype="<f8").tobytes()


def decoded(payload: bytes, dimension: int, wire: PlainValues = EVALUATION_UPLOAD) -> list[float]:
    """decode_plain's values and weight as one list."""
    values, weight = decode_plain(payload, dimension, BOUNDS, wire)
    return values.tolist() + [weight]


def test_a_plain_update_outside_the_plans_bounds_is_refused() -> None:
    """The bounds of the secure encoding hold in plain mode too: weight in (0, max_weight], every
    weighted coordinate within clip * weight; a finite but huge update cannot become the model."""
    assert decoded(plain(-20.0, 20.0, 2.0), 2) == [-20.0, 20.0, 2.0]  # on the bound
    assert decoded(plain(1000.0, 100.0), 1) == [1000.0, 100.0]  # the largest weight
    for payload, reason in (
        (plain(1e100, 2.0), "clipping range"),
        (plain(-np.nextafter(20.0, 21.0), 2.0), "clipping range"),
        (plain(0.5, 0.0), "weight"),
        (plain(0.5, -1.0), "weight"),
        (plain(0.5, 101.0), "weight"),
        (plain(np.inf, 1.0), "NaN or Inf"),
        (plain(0.5, np.nan), "NaN or Inf"),
        (plain(0.5, 1.0, 1.0), "1 float64 values and a float64 weight"),
    ):
        with pytest.raises(RefusedError, match=reason):
            decode_plain(payload, 1, BOUNDS, EVALUATION_UPLOAD)


def _reference_refusal(values: np.ndarray) -> str | None:
    """The plain bounds written out over whole-vector temporaries: the reason decode_plain must give."""
    if not np.isfinite(values).all():
        return "NaN or Inf"
    weight = values[-1]
    if not 0.0 < weight <= BOUNDS.max_weight:
        return "weight"
    if np.abs(values[:-1]).max(initial=0.0) > BOUNDS.clip * weight:
        return "clipping range"
    return None


@settings(max_examples=300, deadline=None)
@given(
    arrays(
        np.float64,
        st.integers(1, 40),
        elements=st.one_of(
            st.floats(-2000.0, 2000.0), st.sampled_from([np.nan, np.inf, -np.inf, 0.0, 100.0, -20.0, 20.0])
        ),
    )
)
def test_plain_decode_checks_by_extremes_refuse_exactly_what_the_whole_vector_checks_refuse(values: np.ndarray) -> None:
    # decode_plain reads the extremes of a zero-copy view; a NaN or Inf anywhere must still be caught.
    expected = _reference_refusal(values)
    payload = values.astype("<f8").tobytes()
    if expected is None:
        assert decoded(payload, values.size - 1) == values.tolist()
    else:
        with pytest.raises(RefusedError, match=expected):
            decode_plain(payload, values.size - 1, BOUNDS, EVALUATION_UPLOAD)


def test_an_honest_plain_update_is_clipped_as_the_encoding_clips_it_and_never_refused() -> None:
    """A collaborator clips its plain update exactly where the secure encoding would, so the aggregator's
    plain bounds never refuse an honest update, and plain and secure rounds bound updates alike."""
    rng = np.random.default_rng(0)
    weight = 31.0
    update = rng.normal(scale=400.0, size=1000)  # many weighted coordinates beyond clip * weight = 310
    clipped = clip_plain_update(update, weight, BOUNDS.clip)
    assert (np.abs(clipped) == BOUNDS.clip * weight).sum() > 100
    # A training update travels in float32, whose rounding may carry a value on the bound past it: still taken.
    wire = TRAINING.plain_values
    values, _ = decode_plain(b"".join(plain_upload(clipped, weight, wire)), update.size, BOUNDS, wire)
    assert np.max(np.abs(values - clipped)) <= plain_rounding(BOUNDS.clip * weight, wire)
    # The secure encoding of the same update decodes to the same clipped values, up to its rounding.
    encoder = Encoder(BOUNDS, 1)
    decoded = encoder.decode(encoder.encode(update, weight, randomness_key=bytes(32)), 1)
    assert np.abs(decoded.weighted_sum - clipped).max() <= encoder.error_bound(1)
    assert decoded.total_weight == weight


def test_a_plain_sum_adds_in_name_order_whatever_order_the_uploads_arrive_in() -> None:
    """Float addition is not associative: (1e16 - 1e16) + 1 = 1 but (1e16 + 1) - 1e16 = 0. The plain
    sum must be the same bits however the uploads race, or a re-run round could move the model."""
    big = float(np.float32(1e16))  # a training upload travels in float32
    updates = {
        name: b"".join(plain_upload(np.array([value]), 1.0, TRAINING.plain_values))
        for name, value in (("site-a", big), ("site-b", 1.0), ("site-c", -big))
    }
    name_order = (big + 1.0) + -big
    wide = EncodingConfig(clip=1e17, max_weight=10.0, fractional_bits=0)
    for arrival in (NAMES, ["site-a", "site-c", "site-b"]):  # summed as they arrive, the second would give 1
        board, gate = Board("digest"), StageGate("f")
        for name in NAMES:
            board.connect(name, make_binding("f", 0, WIRE["STAGE_JOIN"]))
        board.new_round(1)
        driver = SumDriver(
            board,
            gate,
            DriverSettings("f", secure=False, security=SecurityParameters(), stage_timeout=30.0),
            verify=lambda name, credential: pytest.fail("a plain sum verifies no credential"),
        )
        with ThreadPoolExecutor(max_workers=1) as pool:
            summing = pool.submit(driver.run, 1, TRAINING, frozenset(NAMES), 1, wide, (np.zeros(1), 5.0))
            # The stream hands out the MASKED_INPUT task once that stage is open.
            tasks = board.stream_tasks(
                "site-a", board.connect("site-a", make_binding("f", 1, WIRE["STAGE_JOIN"])), lambda: True
            )
            masked = next(task.binding for task in tasks if WireStage.of(task.binding) == TRAINING.masked)
            for name in arrival:
                board.deliver(name, masked, updates[name])
            outcome = summing.result(timeout=10)
        assert outcome.weighted_sum.tolist() == [name_order] and outcome.total_weight == 3.0, arrival
        assert outcome.contributors == tuple(NAMES)


# ---------------------------------------------------------------- the collaborator


def test_a_model_digest_tells_models_apart() -> None:
    """The key of a collaborator's cached update: a re-run round re-sends it only for the very same model."""
    theta = np.linspace(-1.0, 1.0, 7)
    same = model_digest(theta.copy(), 5.0)
    assert model_digest(theta, 5.0) == same
    assert model_digest(theta, np.nextafter(5.0, 6.0)) != same
    assert model_digest(theta.astype(np.float32), 5.0) != same
    changed = theta.copy()
    changed[3] = np.nextafter(changed[3], 1.0)
    assert model_digest(changed, 5.0) != same


def test_the_collaborators_learner_is_the_simulations_client(tmp_path: Path) -> None:
    workspace = new_workspace(tmp_path, NAMES)
    plan = load_aggregator_plan(workspace.plan)
    shared = load_shared_settings(shared_settings(plan))
    _, expected = make_learners(adult_by_race(), plan.training, plan.objective, options=simulation_options(plan))
    for index, name in enumerate(NAMES):
        data = load_local_data(load_collaborator_config(workspace.configs[name]), shared)
        learner = build_learner(data, shared, torch.device("cpu"), name=name)
        assert data.seed_index == index and learner.batch_size == expected[index].batch_size
        assert torch.equal(learner.features, expected[index].features)
        theta = initial_state(plan).theta
        for _ in range(3):
            ours, theirs = learner.train_round(theta, 5.0), expected[index].train_round(theta, 5.0)
            assert torch.equal(ours.delta, theirs.delta) and ours.delta_c == theirs.delta_c


def test_the_configured_name_must_be_the_certificates(tmp_path: Path) -> None:
    workspace = new_workspace(tmp_path, NAMES)
    source = workspace.configs["site-a"]
    source.write_text(
        source.read_text()
        .replace("cert = ", "x = ")
        .replace('name = "site-a"', 'name = "site-b"')
        .replace(
            "[certificates]",
            f'[certificates]\ncert = "{workspace.certs / "site-a.crt"}"\nkey = "{workspace.certs / "site-a.key"}"',
        )
    )
    with pytest.raises(ConfigError, match="name = 'site-b' but .* certifies 'site-a'"):
        Collaborator(load_collaborator_config(source))


def test_an_unreachable_aggregator_is_retried_a_bounded_number_of_times(tmp_path: Path) -> None:
    workspace = make_workspace(tmp_path, ["site-a", "site-b"])  # nobody serves its address
    collaborator = Collaborator(
        load_collaborator_config(workspace.configs["site-a"]),
        retry=RetryPolicy(attempts=3, base_seconds=0.01, cap_seconds=0.05),
    )
    tries: list[int] = []
    original = collaborator.backoff.wait_for_start
    collaborator.backoff.wait_for_start = lambda attempt, elapsed, failure: (  # type: ignore[method-assign]
        tries.append(attempt),
        original(attempt, elapsed, failure),
    )
    with pytest.raises(FailureError, match="aggregator-never-answered: nothing answered at ") as failed:
        collaborator.run()
    assert failed.value.failure is NEVER_ANSWERED
    assert tries == [0, 1, 2, 3]  # three waits, then the bound


def test_back_off_is_exponential_jittered_and_capped() -> None:
    import random

    policy, rng = RetryPolicy(attempts=8, base_seconds=0.5, cap_seconds=4.0), random.Random(0)
    delays = np.array([[policy.delay(attempt, rng) for attempt in range(6)] for _ in range(200)])
    ceilings = np.minimum(4.0, 0.5 * 2.0 ** np.arange(6))
    assert np.all(delays <= ceilings) and np.all(delays >= 0.5 * ceilings)
    assert delays.std(axis=0).min() > 0  # jittered: peers that lost the aggregator together do not retry together


def test_privacy_plugs_into_the_collaborators_hook(tmp_path: Path) -> None:
    from fedfair.privacy.learner import PrivateLearner
    from fedfair.runtime.collaborator.trainer import round_trainer

    workspace = new_workspace(tmp_path, NAMES)
    config_path = workspace.configs["site-b"]
    config_path.write_text(config_path.read_text() + toml_text({"privacy": {"enabled": True, "noise_multiplier": 1.0}}))
    config = load_collaborator_config(config_path)
    shared = load_shared_settings(shared_settings(load_aggregator_plan(workspace.plan)))
    learner = build_learner(load_local_data(config, shared), shared, torch.device("cpu"), name=config.name)
    trainer = round_trainer(learner, config, shared)
    assert isinstance(trainer, PrivateLearner)
    update = trainer.train_round(initial_state(load_aggregator_plan(workspace.plan)).theta, 5.0)
    assert np.isfinite(update.weighted_vector().numpy()).all()
    # The accountant persists beside the data's ledger, in the institution's ledger folder, one history per dataset.
    assert (ledger_folder() / f"site-b.{data_digest(data_identity(config.data))[:16]}.privacy.json").exists()


def test_grpc_codes_are_explained(tmp_path: Path) -> None:
    class Error(grpc.RpcError):
        def __init__(self, code: grpc.StatusCode) -> None:
            self._code = code

        def code(self) -> grpc.StatusCode:
            return self._code

        def details(self) -> str:
            return "details"

    assert "allow-list" in str(refusal(Error(grpc.StatusCode.PERMISSION_DENIED), "x", role="collaborator"))
    assert "unreachable" in str(refusal(Error(grpc.StatusCode.UNAVAILABLE), "x", role="collaborator"))
