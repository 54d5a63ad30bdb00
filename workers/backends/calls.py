"""Requests this process sent to each kind of cluster, counted for the reconcile's metrics.

The Kubernetes backend counts every API request and the Slurm backend every client command
(each is one RPC to slurmctld or slurmdbd); a pass reads the counter before and after it polls.
"""

from __future__ import annotations

from collections import Counter

_SENT: Counter[str] = Counter()


def count_call(kind: str) -> None:
    _SENT[kind] += 1


def calls_sent(kind: str) -> int:
    return _SENT[kind]
