"""Pure parts of the embedded API server: strategic merge patch, selectors, structural schemas and CEL rules."""

from __future__ import annotations

import pytest
from ftjob_local.apiserver.errors import ApiError
from ftjob_local.apiserver.patch import merge_patch, strategic_merge_patch
from ftjob_local.apiserver.protobuf import decode
from ftjob_local.apiserver.schema import check_cel_rules, process_custom_resource
from ftjob_local.apiserver.selectors import (
    label_selector_from_dict,
    parse_field_selector,
    parse_label_selector,
)

POD = {
    "metadata": {"finalizers": ["a"], "labels": {"x": "1"}},
    "spec": {
        "containers": [
            {
                "name": "main",
                "image": "i",
                "env": [{"name": "A", "value": "1"}],
                "ports": [{"containerPort": 80}],
            },
            {"name": "side", "image": "s"},
        ],
        "tolerations": [{"key": "k"}],
    },
}


@pytest.mark.parametrize(
    "patch,check",
    [
        # lists with a merge key merge by it; other lists are replaced
        (
            {"spec": {"containers": [{"name": "main", "image": "j"}]}},
            lambda p: [c["image"] for c in p["spec"]["containers"]] == ["j", "s"],
        ),
        (
            {"spec": {"tolerations": [{"key": "other"}]}},
            lambda p: p["spec"]["tolerations"] == [{"key": "other"}],
        ),
        (
            {"spec": {"containers": [{"name": "side", "$patch": "delete"}]}},
            lambda p: [c["name"] for c in p["spec"]["containers"]] == ["main"],
        ),
        (
            {"spec": {"containers": [{"name": "main", "env": [{"name": "B", "value": "2"}]}]}},
            lambda p: (
                p["spec"]["containers"][0]["env"]
                == [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]
            ),
        ),
        (
            {"spec": {"containers": [{"name": "main", "ports": [{"containerPort": 81}]}]}},
            lambda p: [x["containerPort"] for x in p["spec"]["containers"][0]["ports"]] == [80, 81],
        ),
        ({"metadata": {"finalizers": ["b"]}}, lambda p: p["metadata"]["finalizers"] == ["a", "b"]),
        (
            {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}},
            lambda p: p["metadata"]["finalizers"] == [],
        ),
        ({"metadata": {"labels": {"x": None, "y": "2"}}}, lambda p: p["metadata"]["labels"] == {"y": "2"}),
        (
            {"spec": {"$retainKeys": ["containers"], "tolerations": None}},
            lambda p: list(p["spec"]) == ["containers"],
        ),
        (
            {"spec": {"containers": [{"name": "only", "image": "o"}, {"$patch": "replace"}]}},
            lambda p: p["spec"]["containers"] == [{"name": "only", "image": "o"}],
        ),
        (
            {"$setElementOrder/x": [], "spec": {"$patch": "replace", "tolerations": []}},
            lambda p: p["spec"] == {"tolerations": []},
        ),
    ],
)
def test_strategic_merge_patch(patch, check):
    before = str(POD)
    assert check(strategic_merge_patch(POD, patch))
    assert str(POD) == before  # the original is never modified


def test_merge_patch_replaces_lists_and_removes_nulls():
    assert merge_patch({"a": [1, 2], "b": {"c": 1, "d": 2}}, {"a": [3], "b": {"c": None}}) == {
        "a": [3],
        "b": {"d": 2},
    }


@pytest.mark.parametrize(
    "selector,labels,expected",
    [
        ("a=1", {"a": "1"}, True),
        ("a==1", {"a": "2"}, False),
        ("a!=1", {}, True),
        ("a in (1, 2),b", {"a": "2", "b": "x"}, True),
        ("a notin (1,2)", {"a": "1"}, False),
        ("!a", {"b": "1"}, True),
        ("a,!b", {"a": "1", "b": "2"}, False),
        ("", {"x": "y"}, True),
    ],
)
def test_label_selectors(selector, labels, expected):
    assert parse_label_selector(selector)(labels) is expected


def test_bad_label_selector_says_what_is_accepted():
    with pytest.raises(ApiError) as e:
        parse_label_selector("a b c")
    assert e.value.code == 400 and "key in (a,b)" in e.value.message


def test_label_selector_objects_and_field_selectors():
    sel = label_selector_from_dict(
        {
            "matchLabels": {"a": "1"},
            "matchExpressions": [
                {"key": "b", "operator": "In", "values": ["x"]},
                {"key": "c", "operator": "DoesNotExist"},
            ],
        }
    )
    assert sel({"a": "1", "b": "x"}) and not sel({"a": "1", "b": "x", "c": "1"})
    pod = {"metadata": {"name": "p"}, "spec": {"nodeName": "n"}, "status": {"phase": "Running"}}
    assert parse_field_selector("spec.nodeName=n,status.phase!=Failed")(pod)
    assert not parse_field_selector("metadata.name=q")(pod)


SCHEMA = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "properties": {
                "size": {"x-kubernetes-int-or-string": True},
                "note": {"type": "string", "nullable": True, "pattern": "^[a-z]*$"},
                "ports": {
                    "type": "array",
                    "x-kubernetes-list-type": "map",
                    "x-kubernetes-list-map-keys": ["name"],
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string"},
                            "port": {"type": "integer", "default": 80},
                        },
                    },
                },
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "limits": {"type": "object", "additionalProperties": {"type": "integer"}},
                "mode": {
                    "type": "string",
                    "default": "a",
                    "x-kubernetes-validations": [
                        {
                            "rule": "self == oldSelf || oldSelf == 'a'",
                            "message": "mode can only change from a",
                        }
                    ],
                },
                "count": {
                    "type": "integer",
                    "default": 1,
                    "x-kubernetes-validations": [
                        {"rule": "self < 5", "messageExpression": "'count ' + string(self) + ' >= 5'"}
                    ],
                },
            },
        },
    },
}


def test_schema_prunes_defaults_and_keeps_preserved_fields():
    obj = {
        "apiVersion": "g/v1",
        "kind": "K",
        "metadata": {"name": "x"},
        "spec": {
            "size": "10Gi",
            "note": None,
            "ports": [{"name": "a"}],
            "free": {"any": {"thing": 1}},
            "limits": {"cpu": 2},
            "junk": 1,
        },
        "top": 2,
    }
    out, unknown, errors = process_custom_resource(obj, None, SCHEMA)
    assert errors == [] and sorted(unknown) == ["spec.junk", "top"]
    assert out["spec"]["ports"] == [{"name": "a", "port": 80}] and out["spec"]["mode"] == "a"
    assert out["spec"]["free"] == {"any": {"thing": 1}} and out["metadata"] == {"name": "x"}


def test_schema_errors_and_transition_rules():
    obj = {
        "spec": {
            "size": 1.5,
            "note": "UP",
            "ports": [{"name": "a"}, {"name": "a"}],
            "limits": {"cpu": "x"},
            "count": 7,
        }
    }
    _, _, errors = process_custom_resource(obj, None, SCHEMA)
    text = sorted(e.text() for e in errors)
    assert text == [
        "spec.count: Invalid value: 7: count 7 >= 5",
        'spec.limits.cpu: Invalid value: "x": spec.limits.cpu in body must be of type integer: "string"',
        "spec.note: Invalid value: \"UP\": spec.note in body should match '^[a-z]*$'",
        'spec.ports[1]: Duplicate value: {"name": "a"}',
        'spec.size: Invalid value: 1.5: spec.size in body must be of type integer or string: "number"',
    ]
    old = {"spec": {"mode": "b"}}
    _, _, errors = process_custom_resource({"spec": {"mode": "c"}}, old, SCHEMA)
    assert [e.text() for e in errors] == ['spec.mode: Invalid value: "c": mode can only change from a']
    _, _, errors = process_custom_resource({"spec": {"mode": "c"}}, {"spec": {"mode": "a"}}, SCHEMA)
    assert errors == []


def test_rules_are_not_evaluated_again_where_an_update_left_the_value_unchanged():
    # kube-apiserver's validation ratcheting: a value that already broke a rule may stay as it is (a status write
    # must not fail over the spec), a changed one is checked, and transition rules always run.
    old = {"spec": {"count": 7, "mode": "b"}, "status": {"n": 1}}
    assert (
        process_custom_resource({"spec": {"count": 7, "mode": "b"}, "status": {"n": 2}}, old, SCHEMA)[2] == []
    )
    _, _, errors = process_custom_resource({"spec": {"count": 8, "mode": "b"}}, old, SCHEMA)
    assert [e.text() for e in errors] == ["spec.count: Invalid value: 8: count 8 >= 5"]
    _, _, errors = process_custom_resource({"spec": {"count": 7, "mode": "c"}}, old, SCHEMA)
    assert [e.text() for e in errors] == ['spec.mode: Invalid value: "c": mode can only change from a']


def test_integer_fields_take_integral_numbers_only_up_to_2_to_the_53():
    """As go-openapi's IsFloat64AJSONInteger: 4.0 is an integer, 1e30 (beyond 2^53) is not."""
    ok = {"spec": {"limits": {"cpu": 4.0, "mem": float(2**53)}}}
    assert process_custom_resource(ok, None, SCHEMA)[2] == []
    _, _, errors = process_custom_resource(
        {"spec": {"limits": {"cpu": 1e30, "mem": -(2.0**54)}}}, None, SCHEMA
    )
    assert sorted(e.text() for e in errors) == [
        'spec.limits.cpu: Invalid value: 1e+30: spec.limits.cpu in body must be of type integer: "number"',
        "spec.limits.mem: Invalid value: -1.8014398509481984e+16: "
        'spec.limits.mem in body must be of type integer: "number"',
    ]


def test_cel_rules_that_do_not_compile_are_reported():
    errors = check_cel_rules({"type": "object", "x-kubernetes-validations": [{"rule": "self.a <="}]})
    assert len(errors) == 1 and errors[0].field == "x-kubernetes-validations[0].rule"


def test_protobuf_secret_envelope():
    def field(num: int, payload: bytes) -> bytes:
        return bytes([num << 3 | 2, len(payload)]) + payload

    meta = field(1, b"s") + field(11, field(1, b"owner") + field(2, b"helm"))
    secret = (
        field(1, meta)
        + field(2, field(1, b"release") + field(2, b"\x00\x01"))
        + field(3, b"helm.sh/release.v1")
    )
    envelope = b"k8s\x00" + field(1, field(1, b"v1") + field(2, b"Secret")) + field(2, secret)
    assert decode(envelope) == {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "helm.sh/release.v1",
        "metadata": {"name": "s", "labels": {"owner": "helm"}},
        "data": {"release": "AAE="},
    }


def test_printer_column_paths_follow_kubernetes_jsonpath():
    from ftjob_local.apiserver.tables import parse_column_path

    obj = {
        "metadata": {"labels": {"app.kubernetes.io/name": "x"}},
        "status": {"conditions": [{"type": "A", "status": "False"}, {"type": "Ready", "status": "True"}]},
    }
    found = lambda p: [m.value for m in parse_column_path(p).find(obj)]  # noqa: E731
    assert found('.status.conditions[?(@.type=="Ready")].status') == ["True"]
    assert found(r".metadata.labels.app\.kubernetes\.io/name") == ["x"]
    assert found("{.status.conditions[0].type}") == ["A"]
