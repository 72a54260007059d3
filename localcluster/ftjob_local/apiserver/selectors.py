"""Label selectors (=, ==, !=, in, notin, exists, !exists) and field selectors (=, ==, != on dotted paths), and the
terms of a selector that the store's indexes can answer (`IndexTerms`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import bad_request
from .store import field_value

Matcher = Callable[[dict[str, Any]], bool]

_SET_RE = re.compile(r"^\s*(\S+)\s+(in|notin)\s*\((.*)\)\s*$")


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def parse_label_selector(text: str | None) -> Matcher:
    if not text:
        return lambda labels: True
    reqs: list[Matcher] = []
    for part in _split_top(text):
        m = _SET_RE.match(part)
        if m:
            key, op, vals = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",") if v.strip()}
            if op == "in":
                reqs.append(lambda lb, k=key, vs=vals: lb.get(k) in vs)
            else:
                reqs.append(lambda lb, k=key, vs=vals: lb.get(k) not in vs)
            continue
        if "!=" in part:
            key, val = (s.strip() for s in part.split("!=", 1))
            reqs.append(lambda lb, k=key, v=val: lb.get(k) != v)
        elif "==" in part or "=" in part:
            key, val = (s.strip() for s in re.split("==|=", part, maxsplit=1))
            reqs.append(lambda lb, k=key, v=val: lb.get(k) == v)
        elif part.startswith("!"):
            key = part[1:].strip()
            reqs.append(lambda lb, k=key: k not in lb)
        elif re.fullmatch(r"[A-Za-z0-9./_-]+", part):
            reqs.append(lambda lb, k=part: k in lb)
        else:
            raise bad_request(
                f"unable to parse requirement: {part!r} in labelSelector {text!r} "
                "(expected key, !key, key=value, key!=value, key in (a,b) or key notin (a,b))"
            )

    def match(labels: dict[str, Any]) -> bool:
        return all(r(labels) for r in reqs)

    return match


def label_selector_from_dict(selector: dict[str, Any] | None) -> Matcher:
    """A metav1.LabelSelector (matchLabels + matchExpressions) as a matcher."""
    if not selector:
        return lambda labels: True
    reqs: list[Matcher] = []
    for k, v in (selector.get("matchLabels") or {}).items():
        reqs.append(lambda lb, k=k, v=v: lb.get(k) == v)
    for expr in selector.get("matchExpressions") or []:
        k, op, vals = expr.get("key"), expr.get("operator"), set(expr.get("values") or [])
        if op == "In":
            reqs.append(lambda lb, k=k, vs=vals: lb.get(k) in vs)
        elif op == "NotIn":
            reqs.append(lambda lb, k=k, vs=vals: lb.get(k) not in vs)
        elif op == "Exists":
            reqs.append(lambda lb, k=k: k in lb)
        elif op == "DoesNotExist":
            reqs.append(lambda lb, k=k: k not in lb)
    return lambda labels: all(r(labels) for r in reqs)


def parse_field_selector(text: str | None) -> Matcher:
    """Any dotted path works (metadata.name, metadata.namespace, spec.nodeName, status.phase, involvedObject.uid...)."""
    if not text:
        return lambda obj: True
    reqs: list[Matcher] = []
    for part in _split_top(text):
        if "!=" in part:
            path, val = (s.strip() for s in part.split("!=", 1))
            reqs.append(lambda o, p=path, v=val: field_value(o, p) != v)
        elif "=" in part:
            path, val = (s.strip() for s in re.split("==|=", part, maxsplit=1))
            reqs.append(lambda o, p=path, v=val: field_value(o, p) == v)
        else:
            raise bad_request(
                f"invalid field selector requirement {part!r}: expected path=value or path!=value"
            )
    return lambda obj: all(r(obj) for r in reqs)


def object_matcher(params: Any, ns: str | None, name: str | None = None) -> Matcher:
    """Whether an object is in `ns` (None: any), is called `name` (None: any), and matches the request's
    labelSelector and fieldSelector."""
    labels = parse_label_selector(params.get("labelSelector"))
    fields = parse_field_selector(params.get("fieldSelector"))

    def match(obj: dict[str, Any]) -> bool:
        meta = obj["metadata"]
        if ns is not None and meta.get("namespace", "") != ns:
            return False
        if name is not None and meta["name"] != name:
            return False
        return labels(meta.get("labels") or {}) and fields(obj)

    return match


@dataclass(frozen=True)
class IndexTerms:
    """What every object a selector matches must have: labels key=value, label keys, field values. The store
    narrows to the smallest index among them; the full matcher still decides."""

    labels: tuple[tuple[str, str], ...] = ()
    label_keys: tuple[str, ...] = ()
    fields: tuple[tuple[str, str], ...] = ()


def index_terms(params: Any) -> IndexTerms:
    """The positive, single-valued requirements of a request's labelSelector and fieldSelector."""
    labels: list[tuple[str, str]] = []
    keys: list[str] = []
    for part in _split_top(params.get("labelSelector") or ""):
        m = _SET_RE.match(part)
        if m:
            vals = {v.strip() for v in m.group(3).split(",") if v.strip()}
            if m.group(2) == "in" and len(vals) == 1:
                labels.append((m.group(1), vals.pop()))
            elif m.group(2) == "in":
                keys.append(m.group(1))
        elif "!=" in part or part.startswith("!"):
            continue
        elif "=" in part:
            key, val = (s.strip() for s in re.split("==|=", part, maxsplit=1))
            labels.append((key, val))
        elif re.fullmatch(r"[A-Za-z0-9./_-]+", part):
            keys.append(part)
    fields: list[tuple[str, str]] = []
    for part in _split_top(params.get("fieldSelector") or ""):
        if "!=" not in part and "=" in part:
            path, val = (s.strip() for s in re.split("==|=", part, maxsplit=1))
            fields.append((path, val))
    return IndexTerms(tuple(labels), tuple(keys), tuple(fields))
