"""Differences between two configs as dicts, key by key: what a resume or a checkpoint load
compares, and the one wording of them in messages."""

from __future__ import annotations

from typing import Any


def config_differences(a: dict, b: dict, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, a's value, b's value) for every leaf that differs between two config dicts."""
    out: list[tuple[str, Any, Any]] = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        path = f"{prefix}{key}"
        if isinstance(va, dict) and isinstance(vb, dict):
            out.extend(config_differences(va, vb, path + "."))
        elif va != vb:
            out.append((path, va, vb))
    return out


def format_differences(diffs: list[tuple[str, Any, Any]], a_name: str, b_name: str) -> str:
    return "; ".join(f"{k}: {va!r} ({a_name}) vs {vb!r} ({b_name})" for k, va, vb in diffs)
