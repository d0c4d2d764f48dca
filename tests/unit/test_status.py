"""One vocabulary for a delivery's life (relay.core.status): the words the
store writes, the API and the CLI show and the docs explain are the enum's
values, read here from where each of them is written."""

from __future__ import annotations

import re
from pathlib import Path

from relay.core.outcome import Verdict
from relay.core.status import ATTEMPT_OUTCOMES, Status, attempt_outcome
from relay.ops.views import said_of
from relay.store import AttemptKind, AttemptView
from relay.store import Status as StoreStatus

ROOT = Path(__file__).resolve().parents[2]
STATUSES = {status.value for status in Status}
# `status = 'dead'`, `status IN ('pending', 'in_flight')`, `status NOT IN (...)`
COMPARED = re.compile(r"status\s*(?:=|<>|!=|(?:NOT\s+)?IN)\s*\(?((?:'\w+',?\s*)+)")


def _section(path: str, start: str, end: str) -> str:
    text = (ROOT / path).read_text(encoding="utf-8")
    begin = text.index(start)
    return text[begin : text.index(end, begin)]


def test_the_store_speaks_the_one_vocabulary() -> None:
    assert StoreStatus is Status
    # Every status the SQL of either backend names, in a comparison or a list.
    named: set[str] = set()
    for path in (ROOT / "relay" / "store").glob("*.py"):
        text = path.read_text(encoding="utf-8")
        for match in re.finditer(
            r"status\s*(?:=|<>|!=|(?:NOT\s+)?IN)\s*\(?((?:'\w+',?\s*)+)", text
        ):
            named |= set(re.findall(r"'(\w+)'", match.group(1)))
    assert named, "no status found in the store's SQL: the pattern no longer reads it"
    assert named == STATUSES  # each state is queried, and no other


def test_the_docs_name_every_status_and_no_other() -> None:
    statuses = _section("docs/reference.md", "### Statuses", "### Retries")
    # The states as the paragraph lists them, what is said in brackets left out.
    listed = re.sub(r"\([^()]*\)", "", statuses.split("`attempts`")[0])
    said = set(re.findall(r"`(\w+)`", listed))
    assert said == STATUSES
    events = _section("docs/reference.md", "### `relay events`", "`--route R`")
    assert set(re.findall(r"`(\w+)`", events)) - {"S"} == STATUSES


def test_an_attempt_is_said_in_the_words_of_logs_and_metrics() -> None:
    assert ATTEMPT_OUTCOMES == ("success", "retry", "dead")
    said = {
        attempt_outcome(verdict, after)
        for verdict, after in [
            (Verdict.SUCCESS, Status.DELIVERED),
            (Verdict.RETRY, Status.PENDING),
            (Verdict.RETRY, Status.DEAD),  # the last retry
            (Verdict.FAIL, Status.DEAD),  # no retry could help
        ]
    }
    assert said == set(ATTEMPT_OUTCOMES)
    log = _section("docs/operate.md", "`outcome` is", "— the")
    assert re.findall(r"`(\w+)`", log) == ["outcome", *ATTEMPT_OUTCOMES]


def test_the_stored_verdicts_keep_their_words() -> None:
    # The attempts' outcome column holds the verdict: its values are stored data.
    assert [verdict.value for verdict in Verdict] == ["success", "retry", "fail"]


def test_a_stored_attempt_is_said_as_logs_and_metrics_say_it() -> None:
    # Screens read "fail" where logs and metrics said "dead" (issue 55).
    def attempt(outcome: str, next_at: float | None, kind: AttemptKind) -> AttemptView:
        return AttemptView(1, 1, 0.0, 0.1, outcome, 400, "x", b"", next_at, kind)

    assert said_of(attempt("fail", None, AttemptKind.CYCLE)) == "dead"
    assert said_of(attempt("retry", None, AttemptKind.CYCLE)) == "dead"  # the last retry
    assert said_of(attempt("retry", 50.0, AttemptKind.CYCLE)) == "retry"
    assert said_of(attempt("retry", None, AttemptKind.PROBE)) == "retry"  # waits for the next
    assert said_of(attempt("success", None, AttemptKind.MANUAL)) == "success"
