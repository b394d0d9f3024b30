"""Cells and tables of the bench's plain-text report (also Markdown: docs/decoding.md is made of them)."""

from __future__ import annotations


def mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.0f} MiB"


def timing(t: dict, unit: float = 1e3, suffix: str = "ms") -> str:
    """A Timing dict as `median [min-max] unit`: milliseconds by default, seconds with unit=1."""
    digits = 2 if unit == 1 else 1
    return f"{t['median'] * unit:.{digits}f} [{t['min'] * unit:.{digits}f}-{t['max'] * unit:.{digits}f}]" + (
        f" {suffix}" if suffix else "")


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) + " |"
    return [line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)]


def pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.0f}%"


def x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def other_load(machine: dict) -> str:
    """`; other processes: 0.01 cores busy before, 0.02 after` where the bench could measure it (Linux)."""
    before, after = machine.get("busy_cores_before"), machine.get("busy_cores_after")
    if before is None or after is None:
        return ""
    return f"; other processes kept {before:.2f} cores busy before the run, {after:.2f} after"
