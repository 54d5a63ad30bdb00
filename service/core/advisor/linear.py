"""A small dense linear solve for the calibration's normal equations (a handful of unknowns),
so that the advisor stays free of numerical libraries."""

from __future__ import annotations

from collections.abc import Sequence


def solve(matrix: Sequence[Sequence[float]], rhs: Sequence[float]) -> list[float]:
    """x with matrix · x = rhs, by Gaussian elimination with partial pivoting. The calibration's
    matrices are positive definite (the prior adds to the diagonal), so a pivot is never 0."""
    n = len(rhs)
    rows = [[*map(float, row), float(b)] for row, b in zip(matrix, rhs, strict=True)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(rows[r][col]))
        rows[col], rows[pivot] = rows[pivot], rows[col]
        for r in range(col + 1, n):
            factor = rows[r][col] / rows[col][col]
            rows[r] = [a - factor * b for a, b in zip(rows[r], rows[col], strict=True)]
    x = [0.0] * n
    for r in reversed(range(n)):
        known = sum(rows[r][c] * x[c] for c in range(r + 1, n))
        x[r] = (rows[r][n] - known) / rows[r][r]
    return x
