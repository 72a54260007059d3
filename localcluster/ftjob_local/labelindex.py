"""Indexes that answer "which objects does this selector pick" and "which selectors pick this object" without
scanning every object of a kind, so that the node side's cost per event depends on the object that changed, not on
how many other jobs the cluster holds (issue 15).

- `LabelIndex`: objects (pods) by namespace and by each label pair, and by uid. `select(ns, match_labels)` walks
  the smallest bucket among the selector's pairs and checks the rest.
- `SelectorIndex`: objects that carry a selector (Services, NetworkPolicies) under one of their selector's pairs,
  the one whose bucket was smallest when the object came: a pair every job shares (the role) is passed over for
  one that names the job. `candidates(ns, labels)` returns a superset of the objects whose selector picks an object
  with those labels (callers check the whole selector); selectors without matchLabels pairs are always candidates.
Stdlib only; not thread-safe (each user keeps it on one thread).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name)


def _meta(obj: Obj) -> Obj:
    return obj.get("metadata") or {}


def key_of(obj: Obj) -> Key:
    m = _meta(obj)
    return m.get("namespace", "default"), m.get("name", "")


class LabelIndex:
    def __init__(self) -> None:
        self.objects: dict[Key, Obj] = {}
        self._by_label: dict[tuple[str, str, str], set[Key]] = defaultdict(set)
        self._by_uid: dict[str, Key] = {}
        self.visited = 0  # objects looked at by select(): what the tests bound

    def put(self, key: Key, obj: Obj | None) -> None:
        """Stores obj under key (its newest version), or forgets key when obj is None."""
        old = self.objects.pop(key, None)
        if old is not None:
            for pair in (_meta(old).get("labels") or {}).items():
                bucket = self._by_label.get((key[0], *pair))
                if bucket is not None:
                    bucket.discard(key)
                    if not bucket:
                        del self._by_label[(key[0], *pair)]
            if self._by_uid.get(_meta(old).get("uid", "")) == key:
                del self._by_uid[_meta(old)["uid"]]
        if obj is None:
            return
        self.objects[key] = obj
        for pair in (_meta(obj).get("labels") or {}).items():
            self._by_label[(key[0], *pair)].add(key)
        if _meta(obj).get("uid"):
            self._by_uid[_meta(obj)["uid"]] = key

    def select(self, namespace: str, match_labels: dict[str, str]) -> list[Obj]:
        """Objects of namespace whose labels hold every pair of match_labels (none for an empty selector, as a
        Service's selector; callers that mean "everything" say so themselves)."""
        if not match_labels:
            return []
        buckets = [self._by_label.get((namespace, k, v)) or set() for k, v in match_labels.items()]
        out = []
        for key in min(buckets, key=len):
            obj = self.objects[key]
            self.visited += 1
            labels = _meta(obj).get("labels") or {}
            if all(labels.get(k) == v for k, v in match_labels.items()):
                out.append(obj)
        return out

    def by_uid(self, uid: str) -> Obj | None:
        key = self._by_uid.get(uid)
        return self.objects.get(key) if key else None


class SelectorIndex:
    def __init__(self) -> None:
        self.objects: dict[Key, Obj] = {}
        self._where: dict[Key, tuple[str, str, str] | tuple[str]] = {}
        self._buckets: dict[tuple, set[Key]] = defaultdict(set)
        self.visited = 0  # candidates handed out: what the tests bound

    def put(self, key: Key, obj: Obj | None, match_labels: dict[str, str] | None = None) -> None:
        """Stores obj, whose selector's equality pairs are match_labels, or forgets key when obj is None."""
        where = self._where.pop(key, None)
        self.objects.pop(key, None)
        if where is not None:
            self._buckets[where].discard(key)
            if not self._buckets[where]:
                del self._buckets[where]
        if obj is None:
            return
        if match_labels:
            where = min(
                ((key[0], k, v) for k, v in sorted(match_labels.items())),
                key=lambda b: len(self._buckets.get(b) or ()),
            )
        else:
            where = (key[0],)
        self.objects[key], self._where[key] = obj, where
        self._buckets[where].add(key)

    def candidates(self, namespace: str, labels: dict[str, str]) -> list[Obj]:
        keys = set(self._buckets.get((namespace,)) or ())
        for pair in labels.items():
            keys |= self._buckets.get((namespace, *pair)) or set()
        self.visited += len(keys)
        return [self.objects[k] for k in sorted(keys)]
