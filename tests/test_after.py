"""``submit --after``, the pure part (``policy.chain``): every branch of the parsing, of the
decision about a predecessor, of the dependency string and its rewrite, of which dependents
a resume moves and of what status says."""

from __future__ import annotations

import pytest

from ddlaunch.errors import UserError
from ddlaunch.policy import chain
from ddlaunch.policy.chain import AfterRef, DependentJob, Edge, Predecessor, Waited


@pytest.mark.parametrize(
    ("text", "run", "cond"),
    [
        ("train-1", "train-1", "ok"),
        ("train-1:ok", "train-1", "ok"),
        ("train-1:any", "train-1", "any"),
        ("train-1:started", "train-1", "started"),
        ("/runs/train-1:any", "/runs/train-1", "any"),
    ],
)
def test_after_parses_a_run_and_its_condition(text: str, run: str, cond: str) -> None:
    assert chain.parse_after(text) == AfterRef(run, cond)


def test_after_refuses_an_unknown_condition_and_a_missing_run() -> None:
    with pytest.raises(UserError) as err:
        chain.parse_after("train-1:done")
    assert str(err.value) == (
        "--after 'train-1:done': unknown condition 'done' (expected ok, any or started: "
        "RUN:ok waits for it to complete, RUN:any for it to end, RUN:started for it to start)"
    )
    with pytest.raises(UserError) as err:
        chain.parse_after(":any")
    assert str(err.value) == "--after ':any': expected RUN[:ok|:any|:started], got no run"


def test_the_same_run_twice_is_refused() -> None:
    assert chain.parse_all(["a", "b:any"]) == [AfterRef("a", "ok"), AfterRef("b", "any")]
    with pytest.raises(UserError) as err:
        chain.parse_all(["a", "a:any"])
    assert str(err.value) == "--after names 'a' twice (a:ok, a:any): give one condition per run"


def test_env_name_upper_cases_and_replaces_every_other_character() -> None:
    assert chain.env_name("llama-8b.pre train") == "DDLAUNCH_AFTER_LLAMA_8B_PRE_TRAIN_DIR"
    assert chain.env_name("mlp") == "DDLAUNCH_AFTER_MLP_DIR"


def pred(state: str, condition: str = "ok", job_id: str | None = "41") -> Predecessor:
    return Predecessor("train-1", "/runs/train-1", "mlp", condition, job_id, state)


@pytest.mark.parametrize("state", ["PENDING", "RUNNING", "SUSPENDED"])
@pytest.mark.parametrize(
    ("condition", "kind"), [("ok", "afterok"), ("any", "afterany"), ("started", "after")]
)
def test_a_predecessor_still_to_come_gets_its_edge(state: str, condition: str, kind: str) -> None:
    decision = chain.decide(pred(state, condition))
    assert (decision.edge, decision.note) == (Edge(kind, "41"), None)


@pytest.mark.parametrize("condition", ["ok", "any", "started"])
def test_a_completed_predecessor_is_not_waited_for(condition: str) -> None:
    decision = chain.decide(pred("COMPLETED", condition))
    assert decision.edge is None
    assert decision.note == "train-1 already completed: not waiting for it"


@pytest.mark.parametrize("state", ["FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "SUBMIT_FAILED"])
def test_ok_after_a_run_that_ended_otherwise_is_refused(state: str) -> None:
    with pytest.raises(UserError) as err:
        chain.decide(pred(state))
    assert str(err.value) == (
        f"--after train-1: the run ended {state}, so it can never complete as it is: resume "
        "it first (ddlaunch resume train-1) or use --after train-1:any"
    )


@pytest.mark.parametrize("condition", ["any", "started"])
def test_any_or_started_after_a_failed_run_leaves_the_edge_out(condition: str) -> None:
    decision = chain.decide(pred("FAILED", condition))
    assert decision.edge is None
    assert decision.note == "train-1 already ended (FAILED): not waiting for it"


def test_a_run_never_submitted_is_refused_and_an_unknown_ending_too() -> None:
    with pytest.raises(UserError) as err:
        chain.decide(pred("UNKNOWN", job_id=None))
    assert str(err.value) == (
        "--after train-1: the run has no Slurm job to wait for (it was never submitted); "
        "submit it first (ddlaunch resume train-1)"
    )
    # A job the controller forgot, and a run directory that does not say how it ended:
    # an edge would be lifted by Slurm at once, so :ok cannot be promised.
    with pytest.raises(UserError, match="the run ended UNKNOWN"):
        chain.decide(pred("UNKNOWN"))
    assert chain.decide(pred("UNKNOWN", "any")).edge is None


def test_the_dependency_joins_the_configured_one_first() -> None:
    edges = [Edge("afterok", "41"), Edge("after", "42")]
    assert chain.dependency([]) is None
    assert chain.dependency([], "singleton") == "singleton"
    assert chain.dependency(edges) == "afterok:41,after:42"
    assert chain.dependency(edges, "afterany:7") == "afterany:7,afterok:41,after:42"
    assert chain.dependency([], "afterany:7?afterok:8") == "afterany:7?afterok:8"


@pytest.mark.parametrize("configured", ["afterok:7,", "afterok", "afterok:x", "later:7", ","])
def test_a_configured_dependency_that_is_no_list_of_edges_cannot_take_after(
    configured: str,
) -> None:
    with pytest.raises(UserError, match=r"cannot be joined with --after: .* is not a dependency"):
        chain.dependency([Edge("afterok", "41")], configured)


def test_a_configured_list_of_edges_takes_after() -> None:
    configured = "singleton,afterok:7:8_2,after:9+5"
    assert chain.dependency([Edge("afterok", "41")], configured) == f"{configured},afterok:41"


def test_a_configured_or_dependency_cannot_take_after() -> None:
    with pytest.raises(UserError) as err:
        chain.dependency([Edge("afterok", "41")], "afterany:7?afterok:8")
    assert str(err.value) == (
        "job.dependency 'afterany:7?afterok:8' joins its edges with '?' (any one of them), "
        "which cannot be combined with --after (all of them: Slurm does not mix ',' and "
        "'?'); drop one of the two"
    )


@pytest.mark.parametrize(
    ("current", "expected", "changed"),
    [
        ("afterok:41(unfulfilled)", "afterok:51", True),
        ("afterok:41(failed)", "afterok:51", True),  # the moved edge is a new wait
        ("afterok:40:41(failed)", "afterok:40:51", True),
        ("after:41+5(unfulfilled)", "after:51+5", True),
        # The other edges keep their state: a failed one stays failed.
        ("afterany:7(failed),afterok:41(unfulfilled)", "afterany:7(failed),afterok:51", True),
        (
            "afterok:39(unfulfilled)?afterok:41(unfulfilled)",
            "afterok:39(unfulfilled)?afterok:51",
            True,
        ),
        ("afterok:410(unfulfilled)", "afterok:410(unfulfilled)", False),  # not a prefix match
        ("afterok:51(unfulfilled)", "afterok:51(unfulfilled)", False),  # moved already
        ("singleton(unfulfilled),afterok:41", "singleton(unfulfilled),afterok:51", True),
        ("afterok:41_*(unfulfilled)", "afterok:41_*(unfulfilled)", False),  # an array's
    ],
)
def test_rewrite_replaces_the_old_jobs_only(current: str, expected: str, changed: bool) -> None:
    assert chain.rewrite(current, ["41"], "51") == (chain.Rewrite(expected, changed))


def test_rewrite_replaces_any_earlier_job_of_the_run() -> None:
    # A move that failed at the first resume is made at the second.
    assert chain.rewrite("afterok:41(failed)", ["41", "45"], "51").dependency == "afterok:51"


def test_shown_dependency() -> None:
    assert chain.shown_dependency("(null)") == ""
    assert chain.shown_dependency(None) == ""
    assert chain.shown_dependency("afterok:41(failed)") == "afterok:41(failed)"


def job(
    state: str | None, dependency: str = "afterok:41(unfulfilled)", job_id: str | None = "60"
) -> DependentJob:
    return DependentJob("eval-1", "/runs/eval-1", job_id, state, dependency)


def test_only_pending_dependents_on_an_old_job_are_moved() -> None:
    pending = job("PENDING")
    others = [
        job("RUNNING"),  # started: left alone
        job("COMPLETED", ""),
        job(None, ""),  # the controller forgot it
        job("PENDING", ""),  # its dependency is met already
        job("PENDING", "afterok:99(unfulfilled)"),  # edited by hand: not ours to move
        job("PENDING", job_id=None),  # never submitted
    ]
    assert chain.moves([pending, *others], ["41"], "51") == [chain.Move(pending, "afterok:51")]
    assert chain.moves(others, ["41"], "51") == []


def waited(state: str, condition: str = "ok", job_id: str | None = "41") -> Waited:
    return Waited("train-1", job_id, condition, state)


@pytest.mark.parametrize(
    ("condition", "words"), [("ok", "complete"), ("any", "end"), ("started", "start")]
)
def test_a_dependent_says_what_it_waits_for(condition: str, words: str) -> None:
    assert chain.waiting("Dependency", [waited("RUNNING", condition)]) == (
        f"waiting for train-1 (job 41) to {words}"
    )


def test_a_dependent_lists_only_what_it_still_waits_for() -> None:
    items = [
        waited("COMPLETED"),
        Waited("prep-2", "42", "any", "RUNNING"),
        Waited("warm-3", None, "started", "RUNNING"),
    ]
    assert chain.waiting("Dependency", items) == "waiting for prep-2 (job 42) to end"
    # Every one met as far as the run directories know: Slurm has not caught up yet.
    assert chain.waiting("Dependency", [waited("COMPLETED")]) == (
        "waiting for train-1 (job 41) to complete"
    )
    assert chain.waiting("Dependency", [waited("PENDING", "started", None)]) == (
        "waiting for train-1 to start"
    )


def test_a_dependency_never_satisfied_names_the_run_and_what_to_do() -> None:
    assert chain.waiting("DependencyNeverSatisfied", [waited("CANCELLED")]) == (
        "train-1 ended CANCELLED: resume it (ddlaunch resume train-1) or cancel this run"
    )
    # Resumed meanwhile, or its ending unknown: Slurm's own reason stays.
    assert chain.waiting("DependencyNeverSatisfied", [waited("RUNNING")]) is None
    assert chain.waiting("DependencyNeverSatisfied", [waited("UNKNOWN")]) is None


def test_no_note_for_other_reasons_or_runs_after_nothing() -> None:
    assert chain.waiting("Priority", [waited("RUNNING")]) is None
    assert chain.waiting("Dependency", []) is None
