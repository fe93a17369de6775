"""Properties of the pod scripts' JSON readers (issue 24): any truncation or nesting of a valid
document is either read whole or refused with the reader's documented refusal, never an
uncaught exception (a RecursionError, a half document taken for the whole).

The readers: weights_import (parse_json -> {UNREADABLE: why}; read_json -> TransferError, exit 5,
for a body cut short on every read), weights_stage.parse_json and first_token.read_json_file
(-> None), weights_select.check_local (-> "unreadable completion marker: ..."), and
warmstart coldstart --history's read_records (a bad record is skipped)."""

from __future__ import annotations

import io
import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from warmstart.coldstart import history
from warmstart.podside import first_token, weights_select
from warmstart.podside.common import shared as podside_common
from warmstart.podside.weights_import import s3 as weights_import_s3
from warmstart.podside.weights_import import settings as weights_import_settings
from warmstart.podside.weights_import import main as weights_import
from warmstart.podside.weights_stage import settings as weights_stage_settings
from warmstart.podside.weights_stage import main as weights_stage

leaves = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
documents = st.dictionaries(st.text(max_size=8), st.recursive(
    leaves, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=24),
    max_size=6)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def encode(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def depth(doc: Any) -> int:
    if isinstance(doc, dict):
        return 1 + max((depth(v) for v in doc.values()), default=0)
    if isinstance(doc, list):
        return 1 + max((depth(v) for v in doc), default=0)
    return 0


def nest(raw: bytes, levels: int, as_list: bool) -> bytes:
    return (b"[" * levels + raw + b"]" * levels) if as_list else (b'{"k":' * levels + raw + b"}" * levels)


def unnest(doc: Any, levels: int, as_list: bool) -> Any:
    for _ in range(levels):
        doc = [doc] if as_list else {"k": doc}
    return doc


cut = st.tuples(documents, st.floats(min_value=0, max_value=1, exclude_max=True))
nested = st.tuples(documents, st.integers(min_value=0, max_value=5000), st.booleans())


# ---- weights_import -------------------------------------------------------------------------


@FAST
@given(cut)
def test_import_parse_of_a_cut_document_is_whole_or_unreadable(case):
    doc, share = case
    raw = encode(doc)
    got = weights_import_s3.parse_json(raw[: int(len(raw) * share)])
    assert isinstance(got, dict) and weights_import.UNREADABLE in got


@FAST
@given(nested)
def test_import_parse_of_a_nested_document_is_whole_or_unreadable(case):
    doc, levels, as_list = case
    got = weights_import_s3.parse_json(nest(encode(doc), levels, as_list))
    if levels + depth(doc) <= weights_import.MAX_JSON_DEPTH:
        assert got == unnest(doc, levels, as_list)
    else:
        assert isinstance(got, dict) and weights_import.UNREADABLE in got


class _Client:
    """get_object as botocore answers it: a body stream and the Content-Length S3 sent."""

    def __init__(self, body: bytes, length: int) -> None:
        self.body, self.length = body, length

    def get_object(self, **_: Any) -> dict[str, Any]:
        return {"Body": io.BytesIO(self.body), "ContentLength": self.length}


@FAST
@given(cut, st.booleans())
def test_import_read_of_a_body_cut_short_is_never_taken_whole(case, length_cut_too):
    doc, share = case
    raw = encode(doc)
    body = raw[: int(len(raw) * share)]
    # The framing may say so (Content-Length of the whole), or a proxy may cut both: then only
    # the listed size tells.
    client = _Client(body, len(body) if length_cut_too else len(raw))
    try:
        got = weights_import.read_json(client, "b", "k", expected=len(raw), retries=1)
    except weights_import_settings.TransferError as exc:
        assert exc.exit_code == weights_import.EXIT_TRANSFER and "cut short" in str(exc)
    else:
        raise AssertionError(f"a cut body was read as {got!r}")
    assert weights_import.read_json(_Client(raw, len(raw)), "b", "k", expected=len(raw), retries=1) == doc


# ---- weights_stage / weights_select / first_token -------------------------------------------


@FAST
@given(cut)
def test_stage_parse_of_a_cut_document_is_none(case):
    doc, share = case
    raw = encode(doc)
    assert weights_stage.parse_json(raw[: int(len(raw) * share)]) is None


@FAST
@given(nested)
def test_stage_parse_of_a_nested_document_is_whole_or_none(case):
    doc, levels, as_list = case
    got = weights_stage.parse_json(nest(encode(doc), levels, as_list))
    assert got == (unnest(doc, levels, as_list) if levels + depth(doc) <= weights_stage_settings.MAX_JSON_DEPTH else None)


def _marker(doc: dict[str, Any]) -> dict[str, Any]:
    return {"format": weights_select.MARKER_FORMAT, "digest": "d", "source": "s3://b/m",
            "files": [{"key": "model.safetensors", "size": 3}], "extra": doc}


@FAST
@given(st.one_of(cut.map(lambda c: ("cut", c)), nested.map(lambda c: ("nest", c))))
def test_the_picker_reads_a_cut_or_nested_marker_whole_or_names_it_unreadable(case):
    kind, args = case
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "d").mkdir()
        (root / "d" / "model.safetensors").write_bytes(b"abc")
        marker = _marker(args[0])
        raw = encode(marker)
        if kind == "cut":
            raw, whole = raw[: int(len(raw) * args[1])], False
        else:
            levels, as_list = args[1], args[2]
            raw = raw[:-1] + b', "pad": ' + nest(b"0", levels, as_list) + b"}"
            whole = 1 + max(depth(marker) - 1, levels) <= weights_select.MAX_JSON_DEPTH
        (root / "d" / weights_select.MARKER).write_bytes(raw)
        why, _ = weights_select.check_local(root, "d", "s3://b/m")
    if whole:
        assert why is None
    else:
        assert why is not None and why.startswith("unreadable completion marker"), why


@FAST
@given(st.one_of(cut.map(lambda c: ("cut", c)), nested.map(lambda c: ("nest", c))))
def test_the_sidecar_reads_a_cut_or_nested_state_file_whole_or_skips_it(case):
    kind, args = case
    doc = args[0]
    raw = encode(doc)
    if kind == "cut":
        raw, want = raw[: int(len(raw) * args[1])], None
    else:
        levels, as_list = args[1], args[2]
        raw = nest(raw, levels, as_list)
        fits = levels + depth(doc) <= first_token.MAX_JSON_DEPTH and len(raw) <= first_token.MAX_STATE_BYTES
        want = unnest(doc, levels, as_list) if fits else None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.json"
        path.write_bytes(raw)
        assert first_token.read_json_file(path) == want
        outcomes, _ = first_token.read_state(Path(tmp))  # never raises
        assert isinstance(outcomes, dict)


# ---- warmstart coldstart --history ----------------------------------------------------------


class _Records:
    def __init__(self, bodies: list[bytes]) -> None:
        self.bodies = bodies

    def list_objects_v2(self, **_: Any) -> dict[str, Any]:
        return {"Contents": [{"Key": f"p/{i}.json", "Size": len(b), "LastModified": f"2026-01-0{i % 9 + 1}"}
                             for i, b in enumerate(self.bodies)]}

    def get_object(self, Key: str, **_: Any) -> dict[str, Any]:  # noqa: N803 - boto3's name
        return {"Body": io.BytesIO(self.bodies[int(Key[2:-5])])}


@FAST
@given(st.lists(nested, min_size=1, max_size=3))
def test_history_skips_nested_records_and_keeps_the_rest(cases):
    bodies = [nest(encode(d), levels, as_list) for d, levels, as_list in cases] + [b'{"flags": {}}']
    records = history.read_records(_Records(bodies), "b", "p/")
    assert {"flags": {}} in records and all(isinstance(r, dict) for r in records)


@FAST
@given(nested, st.integers(min_value=0, max_value=80))
def test_the_shared_depth_check_agrees_with_the_depth(case, limit):
    """The scripts share one nesting bound (podside_common.depth_ok, shipped in each script's
    ConfigMap folder); each passes its own MAX_JSON_DEPTH."""
    doc, levels, as_list = case
    deep = unnest(doc, min(levels, 200), as_list)
    assert podside_common.depth_ok(deep, limit) == (depth(deep) <= limit)
