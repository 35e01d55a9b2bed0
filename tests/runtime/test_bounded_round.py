"""One bounded training round through the runtime's own pieces, in process, with the federation's real certificates.

The aggregator's side as its driver runs it (its round parameters, :func:`aggregator_setup`, the protocol's server
and names, each upload through :class:`SecureUpload`), the sites' as their steps run it (:func:`round_steps`: SHARE,
DECIDE and VERIFY, every relayed certificate checked against the manifest's pins), and the auditor's from the same parameters
and pins. Only the transport is left out. A liar (the FEDFAIR_TEST_LIAR fault) is excluded and named at its first
round, by the aggregator as a proven culprit and by every honest site's own check of the record, and the others'
sum is what the round applies.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives import serialization

from fedfair.core import server as server_step
from fedfair.core.files import SECRET_BYTES
from fedfair.core.errors import (
    AuthenticationError,
    ConfigError,
    ProtocolError,
    Refusal,
    RefusedError,
    VerificationError,
    VerifyReason,
)
from fedfair.pki import load_certificate, load_private_key
from fedfair.runtime import manifest as manifests
from fedfair.runtime.aggregator.driver import DriverSettings, SumDriver
from fedfair.runtime.aggregator.round_identities import RoundIdentities, aggregator_setup
from fedfair.runtime.aggregator.secure_uploads import SecureUpload
from fedfair.runtime.collaborator.kinds.bounded import bounded_encoding
from fedfair.runtime.collaborator.chain import ModelChain
from fedfair.runtime.collaborator.stage_steps import round_steps
from fedfair.runtime.collaborator.steps import Participant, Work
from fedfair.runtime.peer.uplink import input_limit
from tests.runtime.wire_stages import BOUNDED_TRAINING
from fedfair.runtime.contract import (
    ACCEPTED,
    EVALUATION,
    TRAINING,
    Aggregations,
    RoundParameters,
    model_digest,
    model_download,
    relayed_keys,
    round_setup,
)
from fedfair.runtime.collaborator.kinds.bounded import LIAR_VARIABLE
from fedfair.runtime.plan import aggregator_plan as plan
from fedfair.runtime.plan.bounded_noise import bounded_noise_mu
from fedfair.runtime.transport import make_binding, pb
from fedfair.pki.identity import generate_identity_key
from fedfair.secagg import keys
from fedfair.secagg.bounded.exchange import AUDITOR as AUDITOR_PARTY
from fedfair.secagg.bounded.messages import ShareOpening, SignedRoundKey
from fedfair.secagg.bounded import field
from fedfair.secagg.bounded.record import VerdictRecord, sign_record
from fedfair.secagg.bounded.stages import BOUNDED_ROUND, BoundedStage
from fedfair.secagg.round import Opening, RoundSetup
from tests.runtime.test_input_bound import AUDITOR, declared, federation  # noqa: F401 (the fixture)
from tests.runtime.test_manifest import COLLABORATORS, aggregator_plan_with

PARAMETERS = 40
"""The model's parameters: a training update is this long, plus c."""
MODEL = model_digest(np.zeros(PARAMETERS, np.float32), 0.0)
NO_NETWORK: Any = None
"""The driver's parameters, setup and naming need neither its board nor its gate."""


@dataclass
class Federation:
    """The template federation under the two-verifier mode: the aggregator's driver, the sites, the auditor's key."""

    folder: Path
    loaded: plan.AggregatorPlan
    driver: SumDriver
    held: RoundIdentities
    sites: dict[str, Participant]
    manifest: manifests.Manifest

    def parameters(self, round_number: int = 1) -> RoundParameters:
        """The round's public parameters (on :data:`MODEL`) as the aggregator's driver states them."""
        work = Work(round_number, BOUNDED_TRAINING, None, 1.0)
        _, dimension, encoding = next(iter(self.sites.values())).expected(work)
        return self.driver.parameters(
            round_number, BOUNDED_TRAINING, COLLABORATORS, dimension, encoding, "train", MODEL
        )


def certificate(folder: Path, name: str) -> bytes:
    """`name`'s certificate (DER), as the CA signed it."""
    return load_certificate(folder / "ca" / f"{name}.crt").public_bytes(serialization.Encoding.DER)


@pytest.fixture()
def bounded(federation: Path) -> Federation:  # noqa: F811
    loaded = declared(aggregator_plan_with(federation))
    shared = plan.load_shared_settings(plan.shared_settings(loaded))
    manifest = manifests.load_manifest(federation / "manifest.toml")
    ca = load_certificate(federation / "ca" / "ca.crt")
    certificates = {name: certificate(federation, name) for name in (*COLLABORATORS, "aggregator", AUDITOR)}
    held = RoundIdentities(
        "aggregator",
        AUDITOR,
        load_private_key(federation / "ca" / "aggregator.key"),
        lambda names: {name: certificates[name] for name in names},
        loaded.influence,
        loaded.batch_fraction,
        partial(bounded_noise_mu, loaded, len(loaded.collaborators)),
        os.urandom(SECRET_BYTES),
    )
    secure = loaded.secure_aggregation
    settings = DriverSettings(
        loaded.federation_id,
        True,
        secure.security(len(COLLABORATORS)),
        30.0,
        graph_roster=COLLABORATORS,
        identities=held,
    )
    verify = manifests.pinned_verifier(manifest, ca)
    sites = {
        name: Participant(
            name,
            shared,
            PARAMETERS,
            load_private_key(federation / name / f"{name}.key"),
            certificates[name],
            verify,
            manifest,
            ca_certificate=ca,
        )
        for name in COLLABORATORS
    }
    return Federation(federation, loaded, SumDriver(NO_NETWORK, NO_NETWORK, settings, verify), held, sites, manifest)


@dataclass
class Outcome:
    """What one round left: the aggregator's server and config, each site's verdict (or refusal), the updates, and
    each site's work (its round state)."""

    server: Any
    names: Any
    config: Any
    verdicts: dict[str, bytes | Exception]
    updates: dict[str, np.ndarray]
    works: dict[str, Work]


def run_round(
    bounded: Federation,
    monkeypatch: pytest.MonkeyPatch,
    *,
    liar: str | None = None,
    factor: float = 2.5,
    record: Any = None,
    auditor: Any = None,
    lost: tuple[str, ...] = (),
    round_number: int = 1,
    restarted: tuple[str, ...] = (),
) -> Outcome:
    """A round (1 unless `round_number`, on :data:`MODEL`) as the driver runs it, stage by stage; `liar` lies at
    `factor`; `record` may alter the record sent.

    `auditor(spec, inputs)` makes the auditor's uploads (default: its state derived here); the SHARE uploads of
    `lost` never reach the aggregator (they are absent: their stage timed out). The sites `restarted` restart between
    SHARE and DECIDE: each is a new Participant from the same settings (a new process's), with none of the round in
    memory, only what its folder keeps.
    """
    parameters = bounded.parameters(round_number)
    config = parameters.secagg_config(bounded.loaded.federation_id, BOUNDED_TRAINING)
    setup = aggregator_setup(bounded.held, bounded.driver.verify, parameters, BOUNDED_TRAINING)
    server = BOUNDED_ROUND.server(config, setup)
    names = BOUNDED_ROUND.names(config, setup)
    state = auditor_of(bounded, parameters, config)
    updates, works = {}, {}
    rng = np.random.default_rng(7)
    for name, me in bounded.sites.items():
        weight = bounded.loaded.influence.weight_of(name, bounded.loaded.batch_fraction)
        direction = rng.normal(size=PARAMETERS + 1)
        # Exactly at its bound: update_norm times its weight.
        updates[name] = direction * (bounded.loaded.influence.update_norm * weight / np.linalg.norm(direction))
        works[name] = Work(round_number, BOUNDED_TRAINING, None, weight, model=MODEL)
        works[name].encoded = bounded_encoding(updates[name], name, me.shared)
    verdicts: dict[str, bytes | Exception] = {}
    opening: Opening | None = BOUNDED_ROUND.open_sum(server)
    for spec in BOUNDED_ROUND.stages(True):
        assert opening is not None
        inputs = parameters.to_bytes() if opening.inputs is None else opening.inputs.to_bytes()
        if spec.stage is BoundedStage.DECIDE and record is not None:
            inputs = record(inputs, server)
        if spec.stage is BoundedStage.DECIDE:
            for name in restarted:
                bounded.sites[name] = dataclasses.replace(bounded.sites[name])
                works[name] = Work(round_number, BOUNDED_TRAINING, None, works[name].weight, model=MODEL)
        if opening.among != (AUDITOR_PARTY,):  # what a site reads is within what it admits
            wire = BOUNDED_TRAINING.wire(spec)
            task = pb.Task(binding=make_binding("", 0, wire))
            limit = input_limit(task, Aggregations(BOUNDED_TRAINING, EVALUATION), len(COLLABORATORS), PARAMETERS, 0)
            assert len(inputs) <= limit, BOUNDED_TRAINING.name(wire)
        for party in opening.among:
            name = names.name_of(party)
            if party == AUDITOR_PARTY and auditor is not None:
                upload = auditor(spec, inputs)
                if upload is None:  # it withdrew
                    continue
            elif party == AUDITOR_PARTY:
                received = None if spec.received is None else spec.received(inputs)
                try:
                    upload = spec.step(state, received, lambda: None).to_bytes()
                except ProtocolError as error:  # its process withdraws: it withholds its upload
                    verdicts[AUDITOR] = error
                    continue
            else:
                with monkeypatch.context() as lying:
                    if name == liar:
                        lying.setenv(LIAR_VARIABLE, str(factor))
                    try:
                        upload = round_steps(BOUNDED_TRAINING)[BOUNDED_TRAINING.wire(spec)](
                            bounded.sites[name], works[name], inputs
                        )
                    except (RefusedError, VerificationError) as error:
                        verdicts[name] = error
                        continue
            if spec.upload is None:
                verdicts[name] = bytes(upload)
                continue
            if name in lost and spec.stage is BoundedStage.SHARE:
                continue
            assert spec.receive is not None
            SecureUpload(spec.upload, partial(spec.receive, server)).handler(names)(name, upload)
        if spec.stage is BoundedStage.DECIDE:  # the sum is made; the sites that tagged its total verify it
            assert spec.withheld is not None
            withheld = spec.withheld(server)
            opening = None if withheld else BOUNDED_ROUND.open_verification(server, server.finish())
        else:
            opening = None if spec.close is None else spec.close(server)
        if opening is None:
            break
    return Outcome(server, names, config, verdicts, updates, works)


def auditor_of(bounded: Federation, parameters: RoundParameters, config: Any) -> Any:
    """The auditor's state for the round, as its process derives it: every relayed key checked against the pins."""
    ca = load_certificate(bounded.folder / "ca" / "ca.crt")
    setup = round_setup(
        parameters,
        bounded.driver.verify,
        relayed_keys(parameters, bounded.manifest, ca),
        bounded.loaded.influence,
        bounded.loaded.batch_fraction,
        aggregator="aggregator",
        auditor=AUDITOR,
    )
    key = load_private_key(bounded.folder / AUDITOR / f"{AUDITOR}.key")
    return BOUNDED_ROUND.client(config, setup, AUDITOR, key, b"")


def in_sum(outcome: Outcome, names: tuple[str, ...]) -> None:
    """The round's sum is `names`' updates, to the encoding's 2^-f per site, and their plan weights."""
    result = outcome.server.finish()
    assert tuple(outcome.config.name_of(party) for party in result.contributors) == names
    expected = sum(outcome.updates[name] for name in names)
    bits = outcome.server.parameters.fractional_bits
    assert result.decoded.error_bound == len(names) * 2.0**-bits
    assert np.max(np.abs(result.decoded.weighted_sum - expected)) <= result.decoded.error_bound
    assert result.decoded.total_weight == float(len(names))  # equal weights: 1 each


def test_an_honest_round_sums_every_site_and_each_accepts_the_record(
    bounded: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcome = run_round(bounded, monkeypatch)
    assert outcome.verdicts == dict.fromkeys(COLLABORATORS, ACCEPTED)
    in_sum(outcome, COLLABORATORS)
    assert bounded.driver._named(1, outcome.config, outcome.server) == {}
    # The auditor is named by its own id, yet it is no party of the round's roster.
    assert outcome.names.name_of(AUDITOR_PARTY) == AUDITOR and AUDITOR not in outcome.config.parties


@pytest.mark.parametrize("factor", [1.01, 2.5, 3.5])
def test_a_liar_is_excluded_and_named_at_its_first_round_and_the_others_sum_applies(
    bounded: Federation, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, factor: float
) -> None:
    liar = "hospital-b"
    with caplog.at_level(logging.WARNING, logger="fedfair.collaborator"):
        outcome = run_round(bounded, monkeypatch, liar=liar, factor=factor)
    honest = ("hospital-a", "hospital-c")
    in_sum(outcome, honest)
    named = bounded.driver._named(1, outcome.config, outcome.server)
    assert list(named) == [liar] and "norm" in named[liar]  # a proven culprit: excluded from later rounds
    refused = outcome.verdicts[liar]
    assert isinstance(refused, RefusedError) and refused.reason is Refusal.WITHDRAWN
    assert "leaves this site's update out of the sum" in str(refused)
    assert all(outcome.verdicts[name] == ACCEPTED for name in honest)
    for name in honest:  # each honest site names the liar from its own check of the evidence
        assert any(f"{name}: round 1: the verdict record names {liar}" in line for line in caplog.messages)


def test_a_record_that_does_not_hold_up_stops_every_site(bounded: Federation, monkeypatch: pytest.MonkeyPatch) -> None:
    def tampered(data: bytes, _server: Any) -> bytes:
        return data[:-1] + bytes([data[-1] ^ 1])  # the aggregator's signature over the record, one bit off

    outcome = run_round(bounded, monkeypatch, record=tampered)
    for name in COLLABORATORS:
        refused = outcome.verdicts[name]
        assert isinstance(refused, VerificationError) and refused.reason is VerifyReason.FORGED, refused
    withheld = outcome.verdicts[AUDITOR]  # nor does the auditor tag its total under it
    assert isinstance(withheld, AuthenticationError) and "not signed by the aggregator" in str(withheld)


def test_every_site_verifies_the_total_and_refuses_a_share_sum_the_aggregator_moved(
    bounded: Federation, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The aggregator signs a record whose total it moved by one unit: each site tags its own share, and the auditor its
    total, under the challenge drawn from that record, and the tags no longer add up (FORGED at VERIFY); the honest
    record's total is verified, and the record is kept in each site's folder before its tags leave."""
    aggregator_key = load_private_key(bounded.folder / "ca" / "aggregator.key")

    def moved(data: bytes, server: Any) -> bytes:
        record = VerdictRecord.from_bytes(data)
        one = np.zeros(record.total.size, np.uint64)
        one[0] = 1
        forged = dataclasses.replace(record, total=field.add(record.total, one))
        server._record = sign_record(server.context, aggregator_key, forged).to_bytes(server.context)
        return bytes(server._record)  # the hostile aggregator takes the tags of the record it sent

    outcome = run_round(bounded, monkeypatch, record=moved)
    for name in COLLABORATORS:
        refused = outcome.verdicts[name]
        assert isinstance(refused, VerificationError) and refused.reason is VerifyReason.FORGED, refused
    kept = {name: dataclasses.replace(me, folder=tmp_path) for name, me in bounded.sites.items()}
    honest = run_round(dataclasses.replace(bounded, sites=kept), monkeypatch)
    assert honest.verdicts == dict.fromkeys(COLLABORATORS, ACCEPTED)
    for name in COLLABORATORS:
        assert (tmp_path / f"{name}.{bounded.loaded.federation_id}.round-1.verdict_record").read_bytes() == (
            honest.server.record
        )


@pytest.mark.parametrize("altered", ["secure round", "certificate"])
def test_a_site_shares_nothing_under_parameters_its_plan_or_its_manifest_refuses(
    bounded: Federation, altered: str
) -> None:
    parameters = bounded.parameters()
    if altered == "secure round":
        parameters = dataclasses.replace(parameters, protocol=TRAINING.protocol.name)
        refusal = r"differ from the plan \(secure round\)"
    else:
        relayed = dict(parameters.identities)
        relayed["hospital-a"] = relayed[AUDITOR]  # the auditor's certificate under a site's name
        parameters = dataclasses.replace(parameters, identities=tuple(sorted(relayed.items())))
        refusal = "hospital-a"
    round_key = SignedRoundKey.sign(generate_identity_key(), b"any round", keys.public_bytes(keys.generate_key_pair()))
    share = BOUNDED_ROUND.spec(BoundedStage.SHARE)
    encoded = np.zeros(PARAMETERS + 1, np.int64)
    work = Work(1, BOUNDED_TRAINING, None, 1.0, model=MODEL, encoded=encoded)
    with pytest.raises(RefusedError, match=refusal) as caught:
        round_steps(BOUNDED_TRAINING)[BOUNDED_TRAINING.wire(share)](
            bounded.sites["hospital-a"], work, ShareOpening(parameters.to_bytes(), round_key).to_bytes()
        )
    assert caught.value.reason is Refusal.WITHDRAWN
    assert work.encoded is encoded and work.client is None  # nothing was shared


def test_under_the_mode_a_site_keeps_a_model_chain_and_the_auditor_is_named_by_the_setup(
    bounded: Federation,
) -> None:
    """Each accepted site verifies the bounded total (VERIFY), so it checks every later model, as under the masked
    round; without secure aggregation there is no sum to verify and no chain."""
    me = bounded.sites["hospital-a"]
    assert me.chain.active
    plain = dataclasses.replace(me.shared.secure_aggregation, enabled=False)
    assert not ModelChain("hospital-a", dataclasses.replace(me.shared, secure_aggregation=plain)).active
    parameters = bounded.parameters()
    config = parameters.secagg_config(bounded.loaded.federation_id, BOUNDED_TRAINING)
    with pytest.raises(ConfigError, match="has an auditor: name it in the round's setup"):
        BOUNDED_ROUND.names(config, RoundSetup(bounded.driver.verify))


def test_a_sites_chain_steps_the_verified_total_as_the_aggregator_does_and_voids_one_over_the_bound(
    bounded: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The total a site verified makes, bit for bit, the model the aggregator makes of its decoded sum (so round 2's
    model is taken); three times it breaks the plan's update_norm, so no step is made and only the model before may
    follow (OUT_OF_BOUNDS)."""
    outcome = run_round(bounded, monkeypatch)
    assert outcome.verdicts == dict.fromkeys(COLLABORATORS, ACCEPTED)
    result, total = outcome.server.finish(), outcome.server.outcome.total
    shared = bounded.sites["hospital-a"].shared
    algorithm, initial = shared.algorithm(), torch.zeros(PARAMETERS, dtype=torch.float64)
    start = algorithm.server_init(initial.clone())
    aggregate = server_step.Aggregate.from_vector(
        torch.from_numpy(result.decoded.weighted_sum.copy()), result.decoded.total_weight
    )
    moved = algorithm.server_apply(start, aggregate, average_from=shared.training.average_from_round)
    first = (model_download(start.theta.numpy(), builtin=True), start.c, None)
    for scale, takes in ((1, True), (3, False)):
        chain = ModelChain("hospital-a", shared, initial=lambda: initial)
        chain.sent(1, *first)
        chain.verified_fixed_point(1, total * scale, COLLABORATORS, outcome.server.parameters.fractional_bits)
        assert chain.anchor is not None and chain.anchor.verified and (chain.anchor.next is not None) == takes
        if takes:
            chain.sent(2, model_download(moved.theta.numpy(), builtin=True), moved.c, None)
        else:
            assert "update_norm" in chain.anchor.void
            with pytest.raises(VerificationError) as refused:
                chain.sent(2, model_download(moved.theta.numpy(), builtin=True), moved.c, None)
            assert refused.value.reason is VerifyReason.OUT_OF_BOUNDS


def test_a_colluders_shift_of_the_total_moves_the_model_only_within_the_plans_sum_bound(
    bounded: Federation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A site colluding with the aggregator can make any shifted total T + E pass the tags
    (tests/secagg/bounded/test_total.py, test_a_colluding_site_can_move_the_total_as_the_doc_states); each honest
    site's chain still holds T + E to the plan's sum bound, as it holds a masked round's verified sum: a shift within
    it steps, one past it makes no step (the round is void), so a colluder moves the model no further than it could in
    the masked round."""
    outcome = run_round(bounded, monkeypatch)
    assert outcome.verdicts == dict.fromkeys(COLLABORATORS, ACCEPTED)
    total, bits = outcome.server.outcome.total, outcome.server.parameters.fractional_bits
    shared = bounded.sites["hospital-a"].shared
    bound = shared.influence.update_norm * shared.influence.total_weight(COLLABORATORS, shared.batch_fraction)
    initial = torch.zeros(PARAMETERS, dtype=torch.float64)
    start = shared.algorithm().server_init(initial.clone())
    within = -(total // 2)  # halves the sum: shorter than the honest total, so within the bound
    beyond = np.zeros_like(total)
    beyond[0] = int(3 * bound * 2**bits)  # the mean step 3 - 1 = 2 times update_norm long at least
    for shift, takes in ((within, True), (beyond, False)):
        chain = ModelChain("hospital-a", shared, initial=lambda: initial)
        chain.sent(1, model_download(start.theta.numpy(), builtin=True), start.c, None)
        chain.verified_fixed_point(1, total + shift, COLLABORATORS, bits)
        assert chain.anchor is not None and chain.anchor.verified and (chain.anchor.next is not None) == takes
        assert takes or "beyond the plan's [influence] update_norm" in chain.anchor.void
