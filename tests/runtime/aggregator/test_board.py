"""The board without a network: when a stage settles, and which tasks a (re)connecting stream gets."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from fedfair import pki
from fedfair.core.errors import Refusal, RefusedError
from fedfair.runtime.aggregator.board import Board
from fedfair.runtime.aggregator.stages import StageProgress, error_summary
from fedfair.runtime.transport import INLINE_INPUT_BYTES, make_binding, pb
from fedfair.runtime.transport import WireStage
from tests.runtime.harness import eventually
from tests.runtime.wire_stages import WIRE

NAMES = ("site-a", "site-b", "site-c")
ADVERTISE = make_binding("f", 1, WIRE["STAGE_ADVERTISE_KEYS"])
SETTLES_IN = 60.0  # seconds a settled stage may take to notice: it is woken at once, so this only ends a failing
# test; a passing one returns as soon as the waiter does, and a busy 2-core box may stall a thread for seconds
STILL_WAITING = 0.2  # seconds a stage that must not settle is given to (wrongly) do so


def certificate_handler(received: list[str]) -> Callable[[str, bytes], None]:
    """A handler that parses each upload as a DER certificate, as key advertisements carry them."""

    def absorb(peer: str, payload: bytes) -> None:
        x509.load_der_x509_certificate(payload)
        received.append(peer)

    return absorb


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A real DER certificate (a fresh CA's), the kind a key advertisement carries."""
    folder = tmp_path_factory.mktemp("ca")
    pki.init_ca(folder)
    return pki.load_certificate(folder / "ca.crt").public_bytes(serialization.Encoding.DER)


def board_with_stage(handler: Callable[[str, bytes], None], *, ready: Callable[[], bool] | None = None) -> Board:
    """Round 1's ADVERTISE_KEYS open for three connected peers, with a deadline far beyond the test."""
    board = Board("digest")
    for name in NAMES:
        board.connect(name, make_binding("f", 0, WIRE["STAGE_JOIN"]))
    board.new_round(1)
    board.open_stage(ADVERTISE, NAMES, b"in", handler, max_upload_bytes=1 << 16, timeout=600.0, ready=ready)
    return board


def waiting(board: Board) -> threading.Thread:
    """The driver's wait for the open stage, in a thread so the test can deliver meanwhile."""
    waiter = threading.Thread(target=board.wait_stage, daemon=True)
    waiter.start()
    return waiter


def settles(waiter: threading.Thread) -> bool:
    waiter.join(SETTLES_IN)
    return not waiter.is_alive()


def still_waits(waiter: threading.Thread) -> bool:
    waiter.join(STILL_WAITING)
    return waiter.is_alive()


# ---------------------------------------------------------------- ready: stages end as soon as they can


def test_a_stage_settles_once_ready_says_so_without_waiting_for_the_rest(certificate: bytes) -> None:
    received: list[str] = []
    board = board_with_stage(certificate_handler(received), ready=lambda: len(received) >= 2)
    waiter = waiting(board)
    board.deliver("site-a", ADVERTISE, certificate)
    assert still_waits(waiter)  # one answer is not enough for this stage
    board.deliver("site-b", ADVERTISE, certificate)
    assert settles(waiter)  # site-c is connected and silent, yet nobody waits for it
    assert board.close_stage() == (frozenset({"site-a", "site-b"}), 2 * len(certificate))


def test_without_ready_a_stage_waits_for_every_live_peer(certificate: bytes) -> None:
    board = board_with_stage(certificate_handler([]))
    waiter = waiting(board)
    board.deliver("site-a", ADVERTISE, certificate)
    board.deliver("site-b", ADVERTISE, certificate)
    assert still_waits(waiter)
    board.deliver("site-c", ADVERTISE, certificate)
    assert settles(waiter)


# ---------------------------------------------------------------- refused uploads


def test_a_refused_upload_settles_only_its_senders_slot(certificate: bytes) -> None:
    """site-c's upload does not parse and it does not retry: the stage ends when site-a and site-b
    have answered, not at its deadline; site-c's refusals, however many, never settle anyone else."""
    received: list[str] = []
    board = board_with_stage(certificate_handler(received))
    waiter = waiting(board)
    mutated = bytearray(certificate)
    mutated[4] ^= 0xFF  # the tag of the to-be-signed part: an ASN.1 parse error, as in the reported attack
    for bad in (bytes(mutated), b"\x30\x03abc", certificate[:-1]):
        with pytest.raises(RefusedError) as refused:
            board.deliver("site-c", ADVERTISE, bad)
        assert refused.value.reason is Refusal.INVALID_UPLOAD
        assert isinstance(refused.value.__cause__, ValueError)  # the parser's own error, kept for the log
    assert still_waits(waiter)  # site-a and site-b are still owed an answer
    board.deliver("site-a", ADVERTISE, certificate)
    assert still_waits(waiter)
    board.deliver("site-b", ADVERTISE, certificate)
    assert settles(waiter)
    assert board.close_stage()[0] == {"site-a", "site-b"} and received == ["site-a", "site-b"]


def test_a_retry_in_progress_after_a_refusal_is_waited_for_and_counts(certificate: bytes) -> None:
    board = board_with_stage(certificate_handler([]))
    waiter = waiting(board)
    with pytest.raises(RefusedError):
        board.deliver("site-c", ADVERTISE, b"not a certificate")
    with board.uploading("site-c"):  # site-c is sending its corrected upload
        board.deliver("site-a", ADVERTISE, certificate)
        board.deliver("site-b", ADVERTISE, certificate)
        assert still_waits(waiter)
        board.deliver("site-c", ADVERTISE, certificate)
    assert settles(waiter)
    assert board.close_stage()[0] == set(NAMES)


def test_an_upload_outside_the_open_stage_is_not_a_refusal(certificate: bytes) -> None:
    """Only the handler's refusals count as an answer; a misdirected upload says nothing about the stage."""
    board = board_with_stage(certificate_handler([]))
    waiter = waiting(board)
    with pytest.raises(RefusedError) as refused:
        board.deliver("site-c", make_binding("f", 1, WIRE["STAGE_SHARE_KEYS"]), certificate)
    assert refused.value.reason is Refusal.NOT_EXPECTED
    board.deliver("site-a", ADVERTISE, certificate)
    board.deliver("site-b", ADVERTISE, certificate)
    assert still_waits(waiter)  # site-c still owes its answer
    board.disconnect("site-c")
    assert settles(waiter)


def test_an_error_summary_is_one_short_line() -> None:
    with pytest.raises(ValueError) as caught:
        x509.load_der_x509_certificate(b"\x30\x03abc" * 200)
    summary = error_summary(caught.value)
    assert summary.startswith("ValueError: ") and "\n" not in summary and len(summary) < 200
    assert error_summary(KeyError()) == "KeyError"
    # One class with many causes names its cause.
    assert error_summary(RefusedError(Refusal.LATE, "the stage closed")) == "RefusedError(LATE): the stage closed"


# ---------------------------------------------------------------- task streams


def stream(board: Board, peer: str, after: pb.Binding, active: Callable[[], bool] = lambda: True) -> Iterator[pb.Task]:
    """A task stream of `peer` that connects now, having last handled `after`."""
    return board.stream_tasks(peer, board.connect(peer, after), active)


def positions(tasks: Iterable[pb.Task]) -> list[tuple[int, int]]:
    return [(task.binding.round, WireStage.of(task.binding)) for task in tasks]


def test_each_peer_s_task_carries_its_own_small_input_and_announces_a_large_one() -> None:
    board = Board("digest")
    starts = {name: board.connect(name, make_binding("f", 0, WIRE["STAGE_JOIN"])) for name in ("site-a", "site-b")}
    board.new_round(1)
    large = bytes(INLINE_INPUT_BYTES + 1)
    inputs = {"site-a": b"a's shares", "site-b": large}
    board.open_stage(
        ADVERTISE, ["site-a", "site-b"], inputs, certificate_handler([]), max_upload_bytes=1, timeout=600.0
    )
    task_a = next(board.stream_tasks("site-a", starts["site-a"], lambda: True))
    task_b = next(board.stream_tasks("site-b", starts["site-b"], lambda: True))
    assert (task_a.input, task_a.input_size) == (b"a's shares", 10)
    assert not task_b.HasField("input") and task_b.input_size == len(large)
    assert board.fetch("site-b", ADVERTISE) == large  # still served to the peer that must fetch it


def test_a_resumed_aggregator_re_runs_the_round_its_predecessor_died_in() -> None:
    """A collaborator saw round 3 up to MASKED_INPUT from an aggregator that was then killed; the
    resumed one re-runs round 3 from its checkpoint, and its tasks reach the collaborator."""
    board = Board("digest")
    board.new_round(3)
    for stage in (WIRE["STAGE_TRAIN"], WIRE["STAGE_ADVERTISE_KEYS"]):
        board.publish(["site-a"], make_binding("f", 3, stage), pb.ACTION_RUN)
    board.finish(make_binding("f", 3, WIRE["STAGE_EVAL_UNMASK"]))
    seen_by_the_dead_process = make_binding("f", 3, WIRE["STAGE_MASKED_INPUT"])
    tasks = list(stream(board, "site-a", seen_by_the_dead_process))
    assert positions(tasks[:-1]) == [(3, WIRE["STAGE_TRAIN"]), (3, WIRE["STAGE_ADVERTISE_KEYS"])]
    assert tasks[-1].action == pb.ACTION_FINISHED


def test_a_reconnecting_stream_skips_only_what_this_board_delivered() -> None:
    board = Board("digest")
    board.new_round(2)
    for stage in (WIRE["STAGE_TRAIN"], WIRE["STAGE_ADVERTISE_KEYS"]):
        board.publish(["site-a"], make_binding("f", 2, stage), pb.ACTION_RUN)
    first = stream(board, "site-a", make_binding("f", 2, WIRE["STAGE_JOIN"]))
    assert positions([next(first), next(first)]) == [(2, WIRE["STAGE_TRAIN"]), (2, WIRE["STAGE_ADVERTISE_KEYS"])]
    first.close()  # the connection drops while site-a works on ADVERTISE_KEYS
    board.publish(["site-a"], make_binding("f", 2, WIRE["STAGE_SHARE_KEYS"]), pb.ACTION_RUN)
    # It finished TRAIN only: ADVERTISE_KEYS comes again, TRAIN does not.
    second = stream(board, "site-a", make_binding("f", 2, WIRE["STAGE_TRAIN"]))
    assert positions([next(second), next(second)]) == [(2, WIRE["STAGE_ADVERTISE_KEYS"]), (2, WIRE["STAGE_SHARE_KEYS"])]
    second.close()
    board.finish(make_binding("f", 2, WIRE["STAGE_EVAL_UNMASK"]))
    third = list(stream(board, "site-a", make_binding("f", 2, WIRE["STAGE_SHARE_KEYS"])))
    assert [task.action for task in third] == [pb.ACTION_FINISHED]  # nothing it already handled


def test_a_restarted_collaborator_process_still_sits_out_the_round_in_progress() -> None:
    """site-a's process received round 5's TRAIN from this board, died and started again: the new
    process (after = JOIN of round 0) has no state for round 5 and sits it out, as before."""
    board = Board("digest")
    board.new_round(5)
    board.publish(["site-a"], make_binding("f", 5, WIRE["STAGE_TRAIN"]), pb.ACTION_RUN)
    dead = stream(board, "site-a", make_binding("f", 5, WIRE["STAGE_JOIN"]))
    assert positions([next(dead)]) == [(5, WIRE["STAGE_TRAIN"])]
    dead.close()
    board.publish(["site-a"], make_binding("f", 5, WIRE["STAGE_ADVERTISE_KEYS"]), pb.ACTION_RUN)
    board.finish(make_binding("f", 5, WIRE["STAGE_EVAL_UNMASK"]))
    fresh = list(stream(board, "site-a", make_binding("f", 0, WIRE["STAGE_JOIN"])))
    assert [task.action for task in fresh] == [pb.ACTION_FINISHED]


def test_a_stream_that_connected_before_the_round_began_takes_part_in_it() -> None:
    """A resumed aggregator waits for its quorum; the last collaborator's stream (it handled round 3
    of the dead process) makes the quorum, and the driver begins round 4 before the stream's thread
    runs on. Its start was fixed as it connected, so it gets round 4's tasks: it is a participant,
    and a stream judging the round only now would leave round 4 waiting for it until the deadline."""
    board = Board("digest")
    start = board.connect("site-a", make_binding("f", 3, WIRE["STAGE_UNMASK"]))
    board.new_round(4)  # the driver, woken by the connection
    board.publish(["site-a"], make_binding("f", 4, WIRE["STAGE_TRAIN"]), pb.ACTION_RUN)
    board.finish(make_binding("f", 4, WIRE["STAGE_EVAL_UNMASK"]))
    tasks = list(board.stream_tasks("site-a", start, lambda: True))
    assert positions(tasks[:-1]) == [(4, WIRE["STAGE_TRAIN"])] and tasks[-1].action == pb.ACTION_FINISHED


def test_a_waiting_stream_ends_as_soon_as_its_rpc_does() -> None:
    """No task for it, and its RPC is cancelled: the termination callback (here called by hand, as
    gRPC calls it) wakes the stream at once instead of after TASK_WAIT_SECONDS."""
    board = Board("digest")
    board.new_round(1)
    active = threading.Event()
    active.set()
    received: list[pb.Task] = []
    worker = threading.Thread(
        target=lambda: received.extend(
            stream(board, "site-a", make_binding("f", 1, WIRE["STAGE_JOIN"]), active.is_set)
        ),
        daemon=True,
    )
    worker.start()
    assert still_waits(worker)
    active.clear()
    board.disconnect("site-a")
    assert settles(worker) and received == []


# ---------------------------------------------------------------- progress for the operator


def test_a_waiting_stage_reports_who_answered_and_who_it_waits_for_at_a_steady_cadence() -> None:
    started = time.monotonic()  # no later than the stage's opening: its deadline is at least 600 s past this
    board = board_with_stage(lambda peer, payload: None)
    reports: list[StageProgress] = []
    every = 0.1
    waiter = threading.Thread(target=board.wait_stage, args=(reports.append, every), daemon=True)
    waiter.start()
    board.deliver("site-a", ADVERTISE, b"key")
    board.deliver("site-b", ADVERTISE, b"")  # withdrawn: answered, not an input
    # Two more reports: the second was certainly taken after both answers (the first may have been under way).
    # Counted, not slept for: a loaded machine may stall either thread for longer than a few cadences.
    answered = len(reports)
    assert eventually(lambda: len(reports) >= answered + 2, SETTLES_IN)
    board.deliver("site-c", ADVERTISE, b"key")
    waited = time.monotonic() - started
    assert settles(waiter)
    *waits, over = reports  # the wait it reported ends with one report that awaits nobody
    # At most one report per `every` s of the wait, however long a stall made it (a busy loop would send thousands).
    assert 2 <= len(waits) <= waited / every + 1, (len(waits), waited)
    last = waits[-1]
    assert (last.binding, last.answered, last.expected, last.waiting_for) == (ADVERTISE, 1, 3, ("site-c",))
    assert 600 - waited <= last.seconds_left < 600  # the stage's 600 s, counted down
    assert (over.binding, over.answered, over.expected, over.waiting_for) == (ADVERTISE, 2, 3, ())


def test_a_stage_settled_before_its_first_report_reports_nothing() -> None:
    board = board_with_stage(lambda peer, payload: None)
    reports: list[StageProgress] = []
    waiter = threading.Thread(target=board.wait_stage, args=(reports.append, 10.0), daemon=True)
    waiter.start()
    for site in ("site-a", "site-b", "site-c"):
        board.deliver(site, ADVERTISE, b"key")
    assert settles(waiter) and reports == []


def test_a_site_an_aborted_round_waited_for_in_vain_is_absent_until_heard_from() -> None:
    board = board_with_stage(lambda peer, payload: None)
    board.disconnect("site-b")  # departed during the round: its stream ended, nothing to set aside
    assert board.unanswered(["site-b", "site-c"]) == {"site-c"}
    assert board.connected() == {"site-a"}
    assert board.wait_for_connected(2, 0.05) == {"site-a"}  # the quorum wait does not count it
    waiter = threading.Thread(target=board.wait_for_connected, args=(2, 30.0))
    waiter.start()
    board.heard("site-c")  # any call of its brings it back, and wakes the wait
    waiter.join(10.0)
    assert not waiter.is_alive() and board.connected() == {"site-a", "site-c"}
    board.unanswered(["site-c"])
    board.connect("site-c", make_binding("f", 1, WIRE["STAGE_JOIN"]))  # so does a new task stream
    assert board.connected() == {"site-a", "site-c"}


# ---------------------------------------------------------------- a restarted process and a rejoinable stage

DECIDE = make_binding("f", 2, WIRE["STAGE_BOUNDED_DECIDE"])
VERIFY = make_binding("f", 2, WIRE["STAGE_BOUNDED_VERIFY"])


def restarted_after_share(
    *, rejoinable: bool = True, expected: Iterable[str] = ("site-a", "site-b"), timeout: float = 600.0
) -> Board:
    """Round 2 of a bounded sum: site-a's process took TRAIN and SHARE, then died (its stream ended); DECIDE opens.

    Its deadline is `timeout` seconds away.
    """
    board = Board("digest")
    starts = {name: board.connect(name, make_binding("f", 1, WIRE["STAGE_JOIN"])) for name in NAMES}
    board.new_round(2)
    for stage in ("STAGE_TRAIN", "STAGE_BOUNDED_SHARE"):
        board.publish(NAMES, make_binding("f", 2, WIRE[stage]), pb.ACTION_RUN)
    dead = board.stream_tasks("site-a", starts["site-a"], lambda: True)
    assert positions([next(dead), next(dead)]) == [(2, WIRE["STAGE_TRAIN"]), (2, WIRE["STAGE_BOUNDED_SHARE"])]
    dead.close()
    board.disconnect("site-a")
    board.open_stage(
        DECIDE,
        expected,
        b"record",
        lambda peer, payload: None,
        max_upload_bytes=1,
        timeout=timeout,
        rejoinable=rejoinable,
    )
    return board


def test_a_rejoinable_stage_waits_for_a_site_whose_process_died_and_hands_its_new_process_the_task() -> None:
    board = restarted_after_share()
    waiter = waiting(board)
    board.deliver("site-b", DECIDE, b"tags")
    assert still_waits(waiter)  # gone, but a new process of it may take DECIDE up from what it kept
    fresh = stream(board, "site-a", make_binding("f", 0, WIRE["STAGE_JOIN"]))  # a new process: no round state
    task = next(fresh)
    assert positions([task]) == [(2, WIRE["STAGE_BOUNDED_DECIDE"])] and task.input == b"record"
    board.deliver("site-a", DECIDE, b"tags")
    assert settles(waiter)
    assert board.close_stage() == (frozenset({"site-a", "site-b"}), 8)


def test_a_site_restarted_again_while_the_rejoinable_stage_is_open_is_handed_it_by_its_newest_process() -> None:
    """Its first restarted process took DECIDE up and died before answering: the next one is handed it, and answers."""
    board = restarted_after_share()
    waiter = waiting(board)
    board.deliver("site-b", DECIDE, b"tags")
    second = stream(board, "site-a", make_binding("f", 0, WIRE["STAGE_JOIN"]))
    assert positions([next(second)]) == [(2, WIRE["STAGE_BOUNDED_DECIDE"])]
    second.close()
    board.disconnect("site-a")  # killed again before its tags left: site-a still owes DECIDE
    assert still_waits(waiter)
    third: list[pb.Task] = []
    taker = threading.Thread(
        target=lambda: third.append(next(stream(board, "site-a", make_binding("f", 0, WIRE["STAGE_JOIN"])))),
        daemon=True,
    )
    taker.start()
    taker.join(SETTLES_IN)
    assert positions(third) == [(2, WIRE["STAGE_BOUNDED_DECIDE"])], "its newest process is not handed what it owes"
    board.deliver("site-a", DECIDE, b"")  # it removed the file before it died: this one withdraws, and at once
    assert settles(waiter)
    assert board.close_stage()[0] == {"site-b"}


def test_a_site_lost_for_good_holds_the_rejoinable_stage_exactly_to_its_deadline() -> None:
    timeout = 2.0
    board = restarted_after_share(timeout=timeout)
    began = time.monotonic()
    waiter = waiting(board)
    board.deliver("site-b", DECIDE, b"tags")
    waiter.join(timeout + SETTLES_IN)
    took = time.monotonic() - began
    assert not waiter.is_alive() and timeout <= took <= timeout + SETTLES_IN, took
    assert board.close_stage()[0] == {"site-b"}


def test_a_stream_opened_beside_a_live_one_is_handed_the_rejoinable_stage_only_once_that_one_ended() -> None:
    """One process of a site answers at a time: a second (or a restart seen before its old connection's end)
    waits for the first stream to end, then takes the stage up, as a restarted process does."""
    board = restarted_after_share()
    handed: list[list[tuple[int, int]]] = []
    second = stream(board, "site-b", make_binding("f", 0, WIRE["STAGE_JOIN"]))
    taker = threading.Thread(target=lambda: handed.append(positions([next(second)])), daemon=True)
    taker.start()
    taker.join(STILL_WAITING)
    assert taker.is_alive() and handed == []  # site-b's stream from round 1 is still open
    board.disconnect("site-b")
    taker.join(SETTLES_IN)
    assert handed == [[(2, WIRE["STAGE_BOUNDED_DECIDE"])]]


def test_a_stream_opened_beside_a_live_one_is_not_handed_a_stage_its_site_answered_meanwhile() -> None:
    board = restarted_after_share()
    second = stream(board, "site-b", make_binding("f", 0, WIRE["STAGE_JOIN"]))
    taker = threading.Thread(target=lambda: list(second), daemon=True)
    taker.start()
    board.deliver("site-b", DECIDE, b"tags")  # its live process answered
    board.disconnect("site-b")
    board.finish(make_binding("f", 2, WIRE["STAGE_EVAL_UNMASK"]))
    taker.join(SETTLES_IN)
    assert not taker.is_alive()
    board.close_stage()
    assert [task.action for task in stream(board, "site-b", make_binding("f", 0, WIRE["STAGE_JOIN"]))] == [
        pb.ACTION_FINISHED
    ]


def test_a_site_that_took_a_rejoinable_stage_up_takes_the_rest_of_its_aggregation_and_no_other() -> None:
    board = restarted_after_share()
    fresh = stream(board, "site-a", make_binding("f", 0, WIRE["STAGE_JOIN"]))
    assert positions([next(fresh)]) == [(2, WIRE["STAGE_BOUNDED_DECIDE"])]
    board.deliver("site-a", DECIDE, b"tags")
    board.deliver("site-b", DECIDE, b"tags")
    board.close_stage()
    # VERIFY is not rejoinable, but site-a's new stream took this aggregation up: it is handed VERIFY and owed it.
    board.open_stage(VERIFY, ["site-a", "site-b"], b"tags", lambda peer, payload: None, max_upload_bytes=1, timeout=600)
    waiter = waiting(board)
    board.deliver("site-b", VERIFY, b"accepted")
    assert positions([next(fresh)]) == [(2, WIRE["STAGE_BOUNDED_VERIFY"])]
    assert still_waits(waiter)
    board.deliver("site-a", VERIFY, b"accepted")
    assert settles(waiter)
    board.close_stage()
    # The round's evaluation is another aggregation, which the process did not start: it sits it out, unwaited.
    evaluate = make_binding("f", 2, WIRE["STAGE_EVALUATE"])
    board.publish(NAMES, evaluate, pb.ACTION_RUN)
    advertise = make_binding("f", 2, WIRE["STAGE_EVAL_ADVERTISE_KEYS"])
    board.open_stage(advertise, NAMES, b"p", lambda peer, payload: None, max_upload_bytes=1, timeout=600.0)
    waiter = waiting(board)
    for name in ("site-b", "site-c"):
        board.deliver(name, advertise, b"key")
    assert settles(waiter)
    board.close_stage()
    board.new_round(3)
    board.publish(NAMES, make_binding("f", 3, WIRE["STAGE_TRAIN"]), pb.ACTION_RUN)
    assert positions([next(fresh)]) == [(3, WIRE["STAGE_TRAIN"])]


def test_a_site_back_after_the_rejoinable_stage_closed_sits_the_round_out() -> None:
    board = restarted_after_share()
    waiter = waiting(board)
    board.deliver("site-b", DECIDE, b"tags")
    board.deliver("site-a", DECIDE, b"")  # the process could not take its part up: it withdrew
    assert settles(waiter)
    board.close_stage()
    board.open_stage(VERIFY, ["site-b"], b"tags", lambda peer, payload: None, max_upload_bytes=1, timeout=600.0)
    board.close_stage()
    board.finish(make_binding("f", 2, WIRE["STAGE_EVAL_UNMASK"]))
    later = list(stream(board, "site-a", make_binding("f", 0, WIRE["STAGE_JOIN"])))
    assert [task.action for task in later] == [pb.ACTION_FINISHED]


def test_a_stage_not_declared_rejoinable_neither_waits_for_nor_hands_a_restarted_process_anything() -> None:
    board = restarted_after_share(rejoinable=False)
    waiter = waiting(board)
    board.deliver("site-b", DECIDE, b"tags")
    assert settles(waiter)  # site-a is gone for the rest of the round, as before
    board.finish(make_binding("f", 2, WIRE["STAGE_EVAL_UNMASK"]))
    fresh = list(stream(board, "site-a", make_binding("f", 0, WIRE["STAGE_JOIN"])))
    assert [task.action for task in fresh] == [pb.ACTION_FINISHED]


def test_a_rejoinable_stage_waits_for_no_verifier_whose_stream_ended() -> None:
    """The auditor keeps nothing of a round on disk for DECIDE: gone, it is not waited for, nor handed the stage."""
    board = restarted_after_share(expected=("site-b", "audit-co"))
    board.verifiers = frozenset({"audit-co"})
    board.connect("audit-co", make_binding("f", 2, WIRE["STAGE_JOIN"]))
    board.disconnect("audit-co")
    waiter = waiting(board)
    board.deliver("site-b", DECIDE, b"tags")
    assert settles(waiter)
    board.finish(make_binding("f", 2, WIRE["STAGE_EVAL_UNMASK"]))
    fresh = list(stream(board, "audit-co", make_binding("f", 0, WIRE["STAGE_JOIN"])))
    assert [task.action for task in fresh] == [pb.ACTION_FINISHED]
