"""Resending a corrected copy: an edited body checked like a webhook, previewed, then sent.

A CRM refuses a lead for a bad field; retrying sends the same bytes and gets
the same refusal. Here a person edits the body and relay stores the result as
a *new* event, linked to the original, delivered to the targets they choose
with a fresh cycle and an idempotency key of its own. The original is never
changed. The dashboard, the API and `relay resend` share this module:

    plan_resend(...)   checks (size, content type, JSON), restores masked
                       secrets, renders each target's request (`relay render`'s
                       logic): a ResendPlan to show before confirming
    plan.resend        what the store's `resend` verb takes once confirmed

Views mask secrets ("***"), and people edit what they are shown: a body that
held a configured secret comes back with "***" where it was, and gets the
secret back here, in the same places, before anything is sent.
"""

from __future__ import annotations

import contextlib
import re
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, replace

import orjson

from relay.config import Config, RouteConfig
from relay.core.budget import TemplateError
from relay.core.canonical import payload_digest
from relay.core.payload import Payload, media_type, parse_form
from relay.core.secrets import (
    MASK,
    Hidden,
    Masker,
    Segments,
    body_segments,
    request_masker,
    shown,
    shown_body,
)
from relay.kinds.target import Envelope
from relay.loader.registry import build_target
from relay.store import ClaimedDelivery, EventDetail, Header, Resend, Status
from relay.targets.base import unstored_event_id

# Headers that describe the original body, not the edited one.
_BODY_HEADERS = frozenset({"content-type", "content-length", "content-encoding"})
_MEDIA_TYPE = re.compile(r"^[A-Za-z0-9][\w!#$&^.+-]*/[A-Za-z0-9][\w!#$&^.+-]*$")


class EditRejected(Exception):
    """The edited copy cannot be sent; `status` is the HTTP answer that says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Preview:
    target: str
    type: str
    text: str | None  # what would be sent, secrets masked
    error: str | None = None  # the template fails for this body: it would be dead


@dataclass(frozen=True)
class ResendPlan:
    resend: Resend
    previews: tuple[Preview, ...]

    @property
    def failures(self) -> list[Preview]:
        return [preview for preview in self.previews if preview.error is not None]


def editable_body(detail: EventDetail, masker: Masker) -> str:
    """The body as a person may see and edit it: masked exactly as the event's
    page shows it (configured secrets, and the request's own credential fields).
    JSON comes indented, its letters as letters (not \\u escapes): the same
    content, and what is sent is what the person leaves in the box."""
    return _shown(detail, _edit_source(detail), masker)


# A form body is edited as its fields, decoded, one a line ("Name = Анна",
# "Email = anna@example.com"), and encoded back when it is sent: a Cyrillic
# name cannot be read or fixed as %D0%90%D0%BD..., nor an e-mail typed as %40.
FORM = "application/x-www-form-urlencoded"
FIELD_SEPARATOR = " = "
FIELDS_NOTE = (
    "# The form's fields, decoded: one `Name = value` a line. relay encodes them back"
    " when it sends;\n# a field left as it is goes out byte for byte as it came."
    " Leave each *** where it is.\n"
)


def editable_fields(detail: EventDetail, masker: Masker) -> str | None:
    """A urlencoded form's fields as `Name = value` lines (masked as the body
    is), or None when the body is no such form or its fields cannot be shown one
    a line and read back (a field without "=", a value with a line break...)."""
    if media_type(detail.payload.content_type) != FORM:
        return None
    try:
        return _fields_view(editable_body(detail, masker))
    except EditRejected:
        return None


def _decoded_pair(pair: str) -> tuple[str, str] | None:
    name, sep, value = pair.partition("=")
    if not sep:
        return None
    try:
        return (
            urllib.parse.unquote_plus(name, errors="strict"),
            urllib.parse.unquote_plus(value, errors="strict"),
        )
    except UnicodeDecodeError:
        return None


def _fields_view(wire: str) -> str | None:
    lines = []
    for pair in wire.split("&"):
        decoded = _decoded_pair(pair)
        if decoded is None:
            return None
        name, value = decoded
        unreadable = any(c in name + value for c in "\r\n") or FIELD_SEPARATOR in name
        if unreadable or name != name.strip() or name.startswith("#"):
            return None
        lines.append(f"{name}{FIELD_SEPARATOR}{value}")
    return "\n".join(lines) + "\n"


def fields_body(edited: str, detail: EventDetail, masker: Masker) -> bytes:
    """The edited `Name = value` lines as the urlencoded body to check and send.

    The text the wire form would have shown (masked) is the reference: a line
    equal to one of its fields becomes that field's bytes exactly as they came
    (a "***" included, which restore_secrets then puts the secret back into);
    any other line is encoded anew. So an unchanged field is never re-encoded
    (`%20` stays `%20`, not `+`), and a secret goes back only where it was."""
    wire = editable_body(detail, masker)
    originals = [(_decoded_pair(pair), pair) for pair in wire.split("&")]
    used = [False] * len(originals)
    pairs = []
    for number, line in enumerate(edited.replace("\r\n", "\n").split("\n"), start=1):
        if not line.strip() or (line.startswith("# ") and line + "\n" in FIELDS_NOTE):
            continue
        name, sep, value = line.partition(FIELD_SEPARATOR)
        if not sep:
            name, sep, value = line.partition("=")
            name, value = name.strip(), value.strip()
        if not sep:
            raise EditRejected(400, f"line {number}: expected `Name = value`, got {line[:80]!r}")
        for index, (decoded, pair) in enumerate(originals):
            if not used[index] and decoded == (name, value):
                used[index] = True
                pairs.append(pair)
                break
        else:
            # "*" kept as it is: a "***" typed here stays a mark restore_secrets sees.
            pairs.append(
                urllib.parse.quote_plus(name, safe="*")
                + "="
                + urllib.parse.quote_plus(value, safe="*")
            )
    return "&".join(pairs).encode("utf-8")


def _edit_source(detail: EventDetail) -> str:
    """The text the edit box starts from, before masking."""
    try:
        text = detail.payload.body.decode("utf-8")
    except UnicodeDecodeError:
        raise EditRejected(
            422, f"event {detail.event.id}: its body is not UTF-8 text and cannot be edited"
        ) from None
    kind = media_type(detail.payload.content_type)
    if kind == "application/json" or kind.endswith("+json"):
        # Not JSON after all (or numbers orjson cannot hold): the text as it came.
        with contextlib.suppress(orjson.JSONDecodeError, orjson.JSONEncodeError):
            text = orjson.dumps(
                orjson.loads(detail.payload.body), option=orjson.OPT_INDENT_2
            ).decode()
    return text


def _shown(detail: EventDetail, text: str, masker: Masker) -> str:
    return shown(_segments(detail, text, masker))


def _segments(detail: EventDetail, text: str, masker: Masker) -> Segments:
    own = request_masker(
        masker, detail.payload.query, detail.payload.content_type, detail.payload.body
    )
    return body_segments(text, detail.payload.content_type, own)


# The deliveries a corrected copy is for by default: those still owed to their
# target (a superseded one's copy is owed too). Not a delivered or resolved
# one (the target has it: a copy would be a second lead), nor a skipped one
# (its route's `when`, or a person, said no).
OWED = (Status.PENDING, Status.IN_FLIGHT, Status.DEAD, Status.SUPERSEDED)


def default_targets(detail: EventDetail) -> list[str]:
    """The targets whose delivery is not delivered (OWED); all of the event's
    when none is."""
    owed = [d.target for d in detail.event.deliveries if d.status in OWED]
    return owed or list(dict.fromkeys(d.target for d in detail.event.deliveries))


def plan_resend(
    config: Config,
    detail: EventDetail,
    edited: bytes,
    content_type: str | None,
    targets: Sequence[str],
    by: str,
    masker: Masker,
) -> ResendPlan:
    """Check the edited body as ingress would, and render it for every chosen target.

    Raises EditRejected: 413 too large, 415 no usable content type, 400 not
    valid for its type (or unchanged, or masked secrets edited), 422 the
    route or a target is no longer there.
    """
    event = detail.event
    route = config.routes.get(event.route)
    if route is None:
        raise EditRejected(422, f"route {event.route} is no longer in the config")
    kind = (content_type or detail.payload.content_type or "").strip()
    body = restore_secrets(edited, detail, masker, kind)
    check_body(route, body, kind)
    # Compared as content (JSON parsed, forms decoded): reformatting is no correction.
    same = payload_digest(body, kind) == payload_digest(
        detail.payload.body, detail.payload.content_type
    )
    if same and media_type(kind) == media_type(detail.payload.content_type):
        raise EditRejected(
            400, "the body is unchanged: to send it again as it is, use retry or requeue"
        )
    chosen = _targets(config, detail, targets)
    resend = Resend(
        original_id=event.id,
        headers=copy_headers(detail.payload.headers, kind),
        body=body,
        content_type=kind,
        targets=tuple(chosen),
        by=by,
    )
    return ResendPlan(resend, tuple(_preview(config, detail, resend, masker)))


def copy_headers(headers: Sequence[tuple[str, str]], content_type: str) -> tuple[Header, ...]:
    """The original's headers for the copy: those describing the old body replaced."""
    kept = [(n, v) for n, v in headers if n.lower() not in _BODY_HEADERS]
    return (*kept, ("Content-Type", content_type))


def check_body(route: RouteConfig, body: bytes, content_type: str) -> None:
    """The checks a webhook passes at ingress, for an edited body."""
    if len(body) > route.max_body_size:
        raise EditRejected(
            413,
            f"body of {len(body)} bytes is larger than route {route.name}'s"
            f" max_body_size ({route.max_body_size} bytes)",
        )
    kind = media_type(content_type)
    if not _MEDIA_TYPE.match(kind):
        raise EditRejected(
            415, f"content type {content_type!r}: expected a type like application/json"
        )
    if kind == "application/json" or kind.endswith("+json"):
        try:
            orjson.loads(body)
        except orjson.JSONDecodeError as error:
            raise EditRejected(400, f"body is not valid JSON: {error}") from None
    forms = ("application/x-www-form-urlencoded", "multipart/form-data")
    if kind in forms and parse_form(content_type, body) is None:
        raise EditRejected(400, f"body is not a valid {kind} form")


# Where a masked secret stood, as the box showed it: its line or field, back
# to the separator before it (at most this many characters).
_CONTEXT = 64
_SEPARATORS = re.compile(r"[\n&,{\[;]")
_SPACE = re.compile(r"\s+")


def restore_secrets(
    edited: bytes, detail: EventDetail, masker: Masker, content_type: str | None = None
) -> bytes:
    """Put back the secrets that the edit box showed as "***", each where it was;
    the copy is of `content_type` (None: the original's).

    The box showed `s0 *** s1 *** s2`, made from a text that reads
    `s0 SECRET1 s1 SECRET2 s2` (relay.core.secrets tells which pieces it masked).
    The edited body must still hold as many "***", and each must stand where
    it stood: after the same field or line (the box's form, or the API's raw
    one). A "***" moved into another field would carry the secret there,
    where no view masks it: refused, as is a copy that would show a restored
    secret in clear.
    """
    try:
        source = _edit_source(detail)
    except EditRejected:
        return edited  # not text: nothing was shown masked
    marks = _marks(_segments(detail, source, masker))
    if not any(secret is not None for secret, _ in marks):
        return edited
    try:
        edited_text = edited.decode("utf-8")
    except UnicodeDecodeError:
        raise EditRejected(400, "the edited body is not UTF-8 text") from None
    parts = edited_text.split(MASK)
    if len(parts) != len(marks) + 1:
        raise EditRejected(
            400,
            f"the body showed {len(marks)} masked secret(s) as {MASK}: keep each"
            f" {MASK} where it was (the secret goes back in its place), now {len(parts) - 1}",
        )
    restored = [parts[0]]
    secrets = []
    for (secret, before), part in zip(marks, parts[1:], strict=True):
        if secret is None:  # a "***" the sender wrote: it stays
            restored += [MASK, part]
            continue
        context = _context(before)
        if not _unspaced(restored[-1][-4 * _CONTEXT :]).endswith(_unspaced(context)):
            raise EditRejected(
                400,
                f"a {MASK} is not where a masked secret was (after {context.strip()!r}):"
                f" a secret goes back only in its own place; keep each {MASK} where it was",
            )
        restored[-1] = restored[-1][: len(restored[-1]) - len(secret.shown) + len(MASK)]
        restored += [secret.original, part]
        secrets.append(secret.original)
    body = "".join(restored)
    _check_copy_masks(detail, body, secrets, masker, content_type)
    return body.encode("utf-8")


def _marks(segments: Segments) -> list[tuple[Hidden | None, str]]:
    """Each "***" of the shown text in order: the secret it hides (None for one
    the sender wrote) and the shown text before it, since the previous one."""
    marks: list[tuple[Hidden | None, str]] = []
    before = ""
    for piece in segments:
        if isinstance(piece, Hidden):
            prefix = piece.shown[: -len(MASK)] if piece.shown.endswith(MASK) else piece.shown
            marks.append((piece, before + prefix))
            before = ""
            continue
        chunks = piece.split(MASK)
        for chunk in chunks[:-1]:
            marks.append((None, before + chunk))
            before = ""
        before += chunks[-1]
    return marks


def _context(before: str) -> str:
    """The end of `before` that places a "***": its field or line."""
    tail = before[-_CONTEXT:]
    separators = list(_SEPARATORS.finditer(tail))
    return tail[separators[-1].end() :] if separators else tail


def _unspaced(text: str) -> str:
    """Whitespace never changes which field a value is in (the box's indented
    JSON against the API's compact one)."""
    return _SPACE.sub("", text)


def _check_copy_masks(
    detail: EventDetail,
    body: str,
    secrets: list[str],
    masker: Masker,
    content_type: str | None,
) -> None:
    """The copy's own views must mask every secret put back in it: views read
    the copy by its own content type, which may not be the original's."""
    kind = content_type or detail.payload.content_type
    own = request_masker(masker, detail.payload.query, kind, body.encode("utf-8"))
    view = shown_body(body, kind, own)
    for secret in secrets:
        if secret in view:
            raise EditRejected(
                400,
                f"the copy would show a masked secret in clear (its credential field was"
                f" renamed or removed): keep the field, or delete its {MASK}",
            )


def _targets(config: Config, detail: EventDetail, wanted: Sequence[str]) -> list[str]:
    own = list(dict.fromkeys(d.target for d in detail.event.deliveries))
    chosen = list(dict.fromkeys(wanted)) or default_targets(detail)
    for name in chosen:
        if name not in own:
            raise EditRejected(
                400, f"target {name}: event {detail.event.id} goes to {', '.join(own) or 'none'}"
            )
        if name not in config.targets:
            raise EditRejected(422, f"target {name} is no longer in the config")
    if not chosen:
        raise EditRejected(400, "choose at least one target")
    return chosen


def unsent_envelope(route: str, shown_key: str, payload: Payload, now: float) -> Envelope:
    """What a target is given to preview an event not stored yet (`relay
    render`, the resend preview): the placeholder id 0, which no receiver ever
    sees (`unstored_event_id`), and `shown_key` for the key it will be sent with."""
    delivery = ClaimedDelivery(
        id=0,
        event_id=0,
        route=route,
        target="",
        attempts=0,
        attempts_in_cycle=0,
        manual=False,
        resume_status=None,
        resume_at=None,
        idempotency_key=shown_key,
        received_at=now,
        payload=payload,
    )
    return Envelope(delivery=delivery, attempt=1, sent_at=now)


def _preview(config: Config, detail: EventDetail, resend: Resend, masker: Masker) -> list[Preview]:
    """Each target's request for the copy, as `relay render` shows it."""
    envelope = unsent_envelope(
        detail.event.route,
        # The copy's id is given when it is stored, and sent as its key.
        "(the copy's own event id)",
        replace(
            detail.payload,
            headers=resend.headers,
            content_type=resend.content_type,
            body=resend.body,
        ),
        time.time(),
    )
    # The copy carries the original's credential fields: mask them as views do.
    masker = request_masker(
        masker, detail.payload.query, detail.payload.content_type, detail.payload.body
    )
    previews = []
    for name in resend.targets:
        target = config.targets[name]
        try:
            text = build_target(target).preview(envelope)
        except TemplateError as error:
            previews.append(Preview(name, target.type, None, masker.text(str(error))))
            continue
        shown = unstored_event_id(text, "(the copy's own event id)")
        previews.append(Preview(name, target.type, masker.text(shown)))
    return previews
