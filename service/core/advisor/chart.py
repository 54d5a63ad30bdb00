"""A stacked-bar SVG of each candidate's per-GPU memory against the budget line.

Written by hand (no plotting library in the service): one bar per candidate, stacked by what
holds the memory, the transient phase drawn as whichever of activations or step temporaries is
larger (that is what the peak counts), a dashed line at the usable budget, the plan outlined.
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape

from service.core.advisor.models import GIB, Candidate

COLOURS = {
    "params": "#4e79a7",
    "gradients": "#f28e2b",
    "optimizer": "#e15759",
    "buffers": "#76b7b2",
    "overhead": "#bab0ac",
    "activations": "#59a14f",
    "temporaries": "#edc948",
}
WIDTH, HEIGHT = 960, 420
LEFT, RIGHT, TOP, BOTTOM = 60, 20, 30, 150

Scale = Callable[[float], float]  # bytes to the SVG y coordinate


def stack_of(candidate: Candidate) -> list[tuple[str, int]]:
    """The bar's segments, bottom to top; they add up to the candidate's total."""
    b = candidate.per_gpu_bytes
    transient = ("activations", b.activations)
    if b.temporaries > b.activations:
        transient = ("temporaries", b.temporaries)
    return [
        ("params", b.params),
        ("gradients", b.gradients),
        ("optimizer", b.optimizer),
        ("buffers", b.buffers),
        transient,
        ("overhead", b.overhead),
    ]


def render_breakdown_svg(candidates: list[Candidate], budget_bytes: int, plan: Candidate) -> str:
    """The whole chart as an SVG document."""
    top = max([budget_bytes, *(c.per_gpu_bytes.total for c in candidates)]) * 1.08
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / max(1, len(candidates))

    def y(nbytes: float) -> float:
        return TOP + plot_h * (1 - nbytes / top)

    parts = [_header(), _axis(top, y)]
    for index, candidate in enumerate(candidates):
        parts.append(_bar(candidate, LEFT + index * slot, slot, y, candidate == plan))
    budget_y = y(budget_bytes)
    parts.append(
        f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{budget_y:.1f}" y2="{budget_y:.1f}" '
        'stroke="#000" stroke-dasharray="6 4"/>'
    )
    parts.append(
        f'<text x="{WIDTH - RIGHT}" y="{budget_y - 4:.1f}" text-anchor="end">'
        f"budget {budget_bytes / GIB:.1f} GiB</text>"
    )
    parts.append(_legend())
    parts.append("</svg>\n")
    return "\n".join(parts)


def _header() -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="11">\n'
        "<title>Predicted per-GPU memory by candidate</title>\n"
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#fff"/>'
    )


def _axis(top: float, y: Scale) -> str:
    ticks = []
    step = _tick_step(top / GIB)
    value = 0.0
    while value * GIB <= top:
        ty = y(value * GIB)
        ticks.append(
            f'<line x1="{LEFT - 4}" x2="{LEFT}" y1="{ty:.1f}" y2="{ty:.1f}" stroke="#000"/>'
            f'<text x="{LEFT - 6}" y="{ty + 4:.1f}" text-anchor="end">{value:g}</text>'
        )
        value += step
    label = (
        f'<text x="14" y="{TOP + 10}" transform="rotate(-90 14 {TOP + 10})" '
        'text-anchor="end">GiB per GPU</text>'
    )
    axis = f'<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{y(0):.1f}" stroke="#000"/>'
    return "\n".join([axis, label, *ticks])


def _tick_step(top_gib: float) -> float:
    for step in (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100):
        if top_gib / step <= 10:
            return float(step)
    return 200.0


def _bar(candidate: Candidate, x: float, slot: float, y: Scale, chosen: bool) -> str:
    width = max(1.0, slot * 0.8)
    left = x + (slot - width) / 2
    parts, bottom = [], 0
    for name, nbytes in stack_of(candidate):
        if nbytes <= 0:
            continue
        upper, lower = y(bottom + nbytes), y(bottom)
        parts.append(
            f'<rect x="{left:.1f}" y="{upper:.1f}" width="{width:.1f}" '
            f'height="{lower - upper:.2f}" fill="{COLOURS[name]}"/>'
        )
        bottom += nbytes
    label = escape(candidate.label())
    if chosen:
        parts.append(
            f'<rect x="{left - 1:.1f}" y="{y(bottom) - 1:.1f}" width="{width + 2:.1f}" '
            f'height="{y(0) - y(bottom) + 2:.1f}" fill="none" stroke="#000" '
            'stroke-width="2"/>'
        )
        label = "\u25b6 " + label
    base = y(0) + 6
    parts.append(
        f'<text x="{left + width / 2:.1f}" y="{base:.1f}" font-size="8" '
        f'transform="rotate(60 {left + width / 2:.1f} {base:.1f})">{label}</text>'
    )
    tooltip = f"{label}: {candidate.per_gpu_bytes.total / GIB:.2f} GiB"
    return f"<g><title>{tooltip}</title>{''.join(parts)}</g>"


def _legend() -> str:
    items = []
    for index, (name, colour) in enumerate(COLOURS.items()):
        x = LEFT + index * 120
        items.append(
            f'<rect x="{x}" y="8" width="10" height="10" fill="{colour}"/>'
            f'<text x="{x + 14}" y="17">{name}</text>'
        )
    return "\n".join(items)
