"""Structural-schema handling of custom resources as the real apiextensions server does it: prune unknown fields
(or report them under fieldValidation=Strict), apply defaults, validate (types, required, enums, bounds, lengths,
patterns, list types) and evaluate CEL `x-kubernetes-validations` with cel-python."""

from __future__ import annotations

import copy
import functools
import json
import re
from typing import Any

from .errors import FieldError

try:  # cel-python is part of the `local` extra; without it CEL rules are reported, not skipped silently.
    import celpy
    from celpy import celtypes
except ImportError:  # pragma: no cover
    celpy = None

_ROOT_KEEP = {"apiVersion", "kind", "metadata"}
_MAX_JSON_INT = 2**53


def _go_value(value: Any) -> str:
    if isinstance(value, dict):
        return '"object"'
    if isinstance(value, list):
        return '"array"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _type_ok(value: Any, schema: dict[str, Any]) -> bool:
    if value is None:
        return bool(schema.get("nullable"))
    if schema.get("x-kubernetes-int-or-string"):
        return (isinstance(value, int) and not isinstance(value, bool)) or isinstance(value, str)
    t = schema.get("type")
    if t is None:
        return True
    if t == "object":
        return isinstance(value, dict)
    if t == "array":
        return isinstance(value, list)
    if t == "string":
        return isinstance(value, str)
    if t == "integer":
        # As go-openapi's IsFloat64AJSONInteger: a float is an integer only if integral and within +-2^53.
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer() and abs(value) <= _MAX_JSON_INT
        )
    if t == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if t == "boolean":
        return isinstance(value, bool)
    return True


def prune(value: Any, schema: dict[str, Any], path: str, unknown: list[str], root: bool = False) -> Any:
    """Drop fields the schema does not declare; their paths go into `unknown` (for fieldValidation)."""
    if schema.get("x-kubernetes-preserve-unknown-fields") and not schema.get("properties"):
        return value
    if isinstance(value, dict) and (schema.get("type") == "object" or "properties" in schema or root):
        props = schema.get("properties") or {}
        addl = schema.get("additionalProperties")
        preserve = schema.get("x-kubernetes-preserve-unknown-fields", False)
        embedded = schema.get("x-kubernetes-embedded-resource", False)
        out = {}
        for key, sub in value.items():
            if (root or embedded) and key in _ROOT_KEEP:
                out[key] = sub
            elif key in props:
                out[key] = prune(sub, props[key], _join(path, key), unknown)
            elif isinstance(addl, dict):
                out[key] = prune(sub, addl, _join(path, key), unknown)
            elif addl is True or preserve:
                out[key] = sub
            else:
                unknown.append(_join(path, key))
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune(v, schema["items"], f"{path}[{i}]", unknown) for i, v in enumerate(value)]
    return value


def apply_defaults(value: Any, schema: dict[str, Any]) -> Any:
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key, sub in props.items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = apply_defaults(value[key], sub)
        addl = schema.get("additionalProperties")
        if isinstance(addl, dict):
            for key in value:
                if key not in props:
                    value[key] = apply_defaults(value[key], addl)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(v, schema["items"]) for v in value]
    return value


@functools.lru_cache(maxsize=1024)
def _cel_program(rule: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(rule))


def check_cel_rules(schema: dict[str, Any], path: str = "") -> list[FieldError]:
    """Compile every CEL rule of a CRD schema (a CRD with a rule that does not compile is refused)."""
    errors: list[FieldError] = []
    for i, rule in enumerate(schema.get("x-kubernetes-validations") or []):
        text = rule.get("rule") if isinstance(rule, dict) else None
        where = _join(path, f"x-kubernetes-validations[{i}].rule")
        if not isinstance(text, str) or not text:
            errors.append(FieldError(where, "Required value", "FieldValueRequired"))
            continue
        if celpy is None:
            errors.append(
                FieldError(where, "cel-python is not installed; install ftjob[local] to evaluate CEL")
            )
            continue
        try:
            _cel_program(text)
        except Exception as e:  # celpy raises its own parse error types
            errors.append(FieldError(where, f"Invalid value: {json.dumps(text)}: compilation failed: {e}"))
    for key, sub in (schema.get("properties") or {}).items():
        errors += check_cel_rules(sub, _join(path, f"properties[{key}]"))
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            errors += check_cel_rules(schema[key], _join(path, key))
    return errors


@functools.lru_cache(maxsize=1024)
def _is_transition(rule: str) -> bool:
    """A transition rule: one that reads oldSelf."""
    return re.search(r"\boldSelf\b", rule) is not None


def _cel_eval(rule: str, bindings: dict[str, Any]) -> Any:
    """Evaluate with bindings already converted by celpy.json_to_cel."""
    result = _cel_program(rule).evaluate(bindings)
    if isinstance(result, celpy.CELEvalError):
        raise ValueError(str(result.args[0] if result.args else result))
    return result


class Validator:
    def __init__(self, schema: dict[str, Any]):
        self.schema = schema
        self.errors: list[FieldError] = []

    def err(self, path: str, message: str, reason: str = "FieldValueInvalid") -> None:
        # The root has no field path; the real server prints it as "<nil>", and so does kubectl.
        self.errors.append(FieldError(path or "<nil>", message, reason))

    def validate(self, value: Any, old: Any, schema: dict[str, Any], path: str, root: bool = False) -> None:
        label = path or "body"
        if not _type_ok(value, schema):
            want = "integer or string" if schema.get("x-kubernetes-int-or-string") else schema.get("type")
            got = (
                "null"
                if value is None
                else {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
                    type(value), "number" if isinstance(value, float) else "integer"
                )
            )
            self.err(
                path,
                f'Invalid value: {_go_value(value)}: {label} in body must be of type {want}: "{got}"',
                "FieldValueTypeInvalid",
            )
            return
        if value is None:
            return
        if "enum" in schema and value not in schema["enum"]:
            allowed = ", ".join(_go_value(v) for v in schema["enum"])
            self.err(
                path,
                f"Unsupported value: {_go_value(value)}: supported values: {allowed}",
                "FieldValueNotSupported",
            )
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if "minimum" in schema:
                lo = schema["minimum"]
                if value < lo or (schema.get("exclusiveMinimum") and value == lo):
                    rel = "greater than" if schema.get("exclusiveMinimum") else "greater than or equal to"
                    self.err(path, f"Invalid value: {_go_value(value)}: {label} in body should be {rel} {lo}")
            if "maximum" in schema:
                hi = schema["maximum"]
                if value > hi or (schema.get("exclusiveMaximum") and value == hi):
                    rel = "less than" if schema.get("exclusiveMaximum") else "less than or equal to"
                    self.err(path, f"Invalid value: {_go_value(value)}: {label} in body should be {rel} {hi}")
            if schema.get("multipleOf") and value % schema["multipleOf"] != 0:
                self.err(
                    path,
                    f"Invalid value: {_go_value(value)}: {label} in body should be a multiple of "
                    f"{schema['multipleOf']}",
                )
        if isinstance(value, str):
            if "maxLength" in schema and len(value) > schema["maxLength"]:
                self.err(
                    path, f"Too long: may not be more than {schema['maxLength']} bytes", "FieldValueTooLong"
                )
            if "minLength" in schema and len(value) < schema["minLength"]:
                self.err(
                    path,
                    f"Invalid value: {_go_value(value)}: {label} in body should be at least "
                    f"{schema['minLength']} chars long",
                )
            if "pattern" in schema and not re.search(schema["pattern"], value):
                self.err(
                    path,
                    f"Invalid value: {_go_value(value)}: {label} in body should match '{schema['pattern']}'",
                )
        if isinstance(value, list):
            if "maxItems" in schema and len(value) > schema["maxItems"]:
                self.err(
                    path,
                    f"Too many: {len(value)}: must have at most {schema['maxItems']} items",
                    "FieldValueTooMany",
                )
            if "minItems" in schema and len(value) < schema["minItems"]:
                self.err(
                    path,
                    f"Invalid value: {len(value)}: {label} in body should have at least "
                    f"{schema['minItems']} items",
                )
            list_type = schema.get("x-kubernetes-list-type")
            if schema.get("uniqueItems") or list_type == "set":
                seen = []
                for i, v in enumerate(value):
                    if v in seen:
                        self.err(f"{path}[{i}]", f"Duplicate value: {_go_value(v)}", "FieldValueDuplicate")
                    seen.append(v)
            if list_type == "map":
                keys = schema.get("x-kubernetes-list-map-keys") or []
                seen_keys = []
                for i, v in enumerate(value):
                    k = tuple((v or {}).get(x) for x in keys) if isinstance(v, dict) else None
                    if k in seen_keys:
                        self.err(
                            f"{path}[{i}]",
                            f"Duplicate value: {json.dumps(dict(zip(keys, k, strict=False)))}",
                            "FieldValueDuplicate",
                        )
                    seen_keys.append(k)
            if isinstance(schema.get("items"), dict):
                for i, v in enumerate(value):
                    self.validate(v, None, schema["items"], f"{path}[{i}]")
        if isinstance(value, dict):
            props = schema.get("properties") or {}
            for req in schema.get("required") or []:
                if req not in value:
                    self.err(_join(path, req), "Required value", "FieldValueRequired")
            if "maxProperties" in schema and len(value) > schema["maxProperties"]:
                self.err(
                    path,
                    f"Too many: {len(value)}: must have at most {schema['maxProperties']} items",
                    "FieldValueTooMany",
                )
            if "minProperties" in schema and len(value) < schema["minProperties"]:
                self.err(
                    path,
                    f"Invalid value: {len(value)}: {label} in body should have at least "
                    f"{schema['minProperties']} properties",
                )
            old_map = old if isinstance(old, dict) else {}
            for key, sub in value.items():
                if root and key in ("apiVersion", "kind"):
                    continue
                if root and key == "metadata":
                    self.validate_metadata(sub, props.get("metadata") or {})
                    continue
                if key in props:
                    self.validate(sub, old_map.get(key), props[key], _join(path, key))
                elif isinstance(schema.get("additionalProperties"), dict):
                    self.validate(sub, old_map.get(key), schema["additionalProperties"], _join(path, key))
        self.run_cel(value, old, schema, path, root)

    def validate_metadata(self, meta: Any, schema: dict[str, Any]) -> None:
        props = schema.get("properties") or {}
        for key in ("name", "generateName"):
            if key in props and isinstance(meta, dict) and key in meta:
                self.validate(meta[key], None, props[key], f"metadata.{key}")

    def run_cel(self, value: Any, old: Any, schema: dict[str, Any], path: str, root: bool) -> None:
        rules = schema.get("x-kubernetes-validations") or []
        if not rules:
            return
        if celpy is None:
            self.err(
                path,
                "CEL validation rules cannot be evaluated: install cel-python (pip install 'ftjob[local]')",
            )
            return
        if root and isinstance(value, dict):
            # Like the real server: CEL sees only name and generateName of the metadata.
            value = dict(value)
            meta = value.get("metadata") or {}
            value["metadata"] = {k: meta[k] for k in ("name", "generateName") if k in meta}
            if isinstance(old, dict):
                old = dict(old)
                old_meta = old.get("metadata") or {}
                old["metadata"] = {k: old_meta[k] for k in ("name", "generateName") if k in old_meta}
        # Ratcheting, as kube-apiserver (CRDValidationRatcheting, on by default since 1.30): on an update, a rule
        # without oldSelf is not evaluated where the value is unchanged. A status write then evaluates no rule of
        # the spec, which was most of this server's time per status write.
        unchanged = old is not None and value == old
        rules = [r for r in rules if not (unchanged and not _is_transition(r["rule"]))]
        if not rules:
            return
        cel_self = celpy.json_to_cel(value)  # converted once for all rules of this node
        cel_old = celpy.json_to_cel(old) if old is not None else None
        for rule in rules:
            text = rule["rule"]
            transition = _is_transition(text)
            if transition and old is None:
                continue  # transition rules only run on updates where the old value exists
            bindings = {"self": cel_self}
            if transition:
                bindings["oldSelf"] = cel_old
            where = _join(path, rule["fieldPath"].lstrip(".")) if rule.get("fieldPath") else path
            reason = rule.get("reason") or "FieldValueInvalid"
            try:
                ok = _cel_eval(text, bindings)
            except Exception as e:
                self.err(
                    where, f"Invalid value: {_go_value(value)}: evaluating rule {text!r} failed: {e}", reason
                )
                continue
            if ok is True or (not isinstance(ok, bool) and bool(ok)):
                continue
            message = rule.get("message") or f"failed rule: {text}"
            if rule.get("messageExpression"):
                try:
                    message = str(_cel_eval(rule["messageExpression"], bindings))
                except Exception:
                    pass
            if reason == "FieldValueRequired":
                self.err(where, f"Required value: {message}", reason)
            elif reason == "FieldValueForbidden":
                self.err(where, f"Forbidden: {message}", reason)
            else:
                self.err(where, f"Invalid value: {_go_value(value)}: {message}", reason)


def process_custom_resource(
    obj: dict[str, Any], old: dict[str, Any] | None, schema: dict[str, Any]
) -> tuple[dict[str, Any], list[str], list[FieldError]]:
    """Prune, default and validate a custom resource. Returns (object, unknown field paths, errors)."""
    unknown: list[str] = []
    obj = prune(obj, schema, "", unknown, root=True)
    obj = apply_defaults(obj, schema)
    v = Validator(schema)
    v.validate(obj, old, schema, "", root=True)
    return obj, unknown, v.errors


def cel_types_available() -> bool:
    return celpy is not None and celtypes is not None
