"""`nox -s tests -- ARGS` keeps one process per core for the fast tiers and a serial e2e tier,
whatever pytest arguments are given (tests/tiers.py); -n, --numprocesses and -p no:xdist
hand the layout to the user."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tiers import NO_TESTS, PARALLEL, PytestRun, asks_for_own_layout, pytest_runs

ROOT = Path(__file__).resolve().parents[2]


def test_no_arguments_run_the_fast_tiers_on_every_core_then_e2e_alone() -> None:
    assert pytest_runs([], ROOT) == [
        PytestRun(("-m", "not e2e", *PARALLEL)),
        PytestRun(("-m", "e2e")),
    ]


def test_the_readme_command_keeps_one_process_per_core() -> None:
    # `nox -s lint tests -- -m 'not e2e'`: one run, parallel (it was one serial pytest: 12 minutes)
    assert pytest_runs(["-m", "not e2e"], ROOT) == [PytestRun(("-m", "not e2e", *PARALLEL))]
    assert pytest_runs(["-mnot e2e", "-x"], ROOT) == [PytestRun(("-x", "-m", "not e2e", *PARALLEL))]


def test_other_arguments_go_to_both_tiers_and_an_empty_tier_passes() -> None:
    runs = pytest_runs(["-k", "trace", "-x"], ROOT)
    assert runs == [
        PytestRun(("-k", "trace", "-x", "-m", "not e2e", *PARALLEL), (0, NO_TESTS)),
        PytestRun(("-k", "trace", "-x", "-m", "e2e"), (0, NO_TESTS)),
    ]


def test_a_marker_expression_is_combined_with_each_tier() -> None:
    runs = pytest_runs(["-m", "integration or e2e"], ROOT)
    assert [r.args for r in runs] == [
        ("-m", "(integration or e2e) and not e2e", *PARALLEL),
        ("-m", "(integration or e2e) and e2e"),
    ]
    # only e2e tests can match: the e2e run alone, serial, with the expression as given
    assert pytest_runs(["-m", "e2e and not integration"], ROOT) == [PytestRun(("-m", "e2e and not integration"))]
    assert pytest_runs(["-m", "not (e2e or integration)"], ROOT) == [
        PytestRun(("-m", "not (e2e or integration)", *PARALLEL))
    ]


def test_paths_choose_the_tiers() -> None:
    unit = "tests/unit/test_mail.py::test_label"
    assert pytest_runs([unit], ROOT) == [PytestRun((unit, "-m", "not e2e", *PARALLEL))]
    e2e = "tests/e2e/test_own_queue.py"
    assert pytest_runs([e2e, "-k", "trace"], ROOT) == [PytestRun((e2e, "-k", "trace", "-m", "e2e"))]
    both = [r.args[-1] for r in pytest_runs(["tests", "--ignore", "tests/e2e"], ROOT)]
    assert both == ["auto", "e2e"]  # --ignore's value is not a path to collect


@pytest.mark.parametrize(
    "args",
    [["-n", "0"], ["-n4"], ["--numprocesses", "3"], ["--numprocesses=auto"], ["-p", "no:xdist"], ["-pno:xdist"]],
)
def test_the_users_own_layout_is_run_as_given(args: list[str]) -> None:
    assert asks_for_own_layout(args)
    given = [*args, "-m", "not e2e", "tests/e2e"]
    assert pytest_runs(given, ROOT) == [PytestRun(tuple(given))]


def test_a_plugin_other_than_xdist_keeps_the_layout() -> None:
    assert not asks_for_own_layout(["-p", "no:cacheprovider", "-k", "n"])
    assert pytest_runs(["-p", "no:cacheprovider"], ROOT)[0].args[-2:] == PARALLEL


def test_an_expression_it_cannot_read_prunes_nothing() -> None:
    runs = pytest_runs(["-m", "slow(level=2)"], ROOT)
    assert [r.args[-1] for r in runs] == ["auto", "(slow(level=2)) and e2e"]
