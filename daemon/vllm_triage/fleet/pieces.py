"""Server-side sharding: which of the fleet's buckets are this replica's, and the pieces a
tick asks for them in (``docs/deploy.md``, "Shards").

The scrape configuration gives every series of a server, and every DCGM series of its
pod, a bucket in one label (``vllm-triage render relabel``: Prometheus' ``hashmod`` of
the pod's namespace and name, so a server and its GPUs share it). Each tick asks which
buckets exist (the label values API, from the index), keeps those with
``bucket % count == index``, and packs them into pieces of about ``per_piece`` servers
(as many as the last tick saw in each bucket). Every query of the tick is asked once per
piece, with the piece's buckets added to its selectors: no replica asks for another's
servers, and no answer grows with the fleet. Replicas divide the buckets, so a new
replica count needs no change to the scrape configuration.

Series without the label (a rule not yet rolled out, or not on the DCGM job) are one
more piece, ``{label=""}``, read by every replica and divided by the hash of the
server's name, as without server-side sharding.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: The piece of the series without the shard label (or of every series, unsharded).
UNLABELLED = -1
#: Servers a piece holds at most, when nothing better is known: the largest answer
#: (a latency histogram's buckets, about 4 KiB per server) stays near 4 MiB.
PIECE_SERVERS = 1000
#: A bucket not seen last tick counts as this share of a piece (its size unknown).
UNKNOWN_SHARE = 8


@dataclass(frozen=True, slots=True)
class Piece:
    """One part of a tick's queries: its buckets and the matcher that selects them."""

    index: int
    buckets: tuple[int, ...] = ()
    #: Added to every selector of the piece's queries ("" when the fleet is unsharded).
    matcher: str = ""
    #: Whether vLLM's queries are asked (False: only DCGM's, for GPUs without the label).
    vllm: bool = True


def owned(values: Iterable[str], index: int, count: int) -> tuple[list[int], list[str]]:
    """The buckets among the label's ``values`` that are this replica's, and the values
    that are not bucket numbers (no replica owns those: said, never guessed)."""
    mine: list[int] = []
    odd: list[str] = []
    for value in values:
        if not value.isdigit() or len(value) > 9:
            odd.append(value)
        elif int(value) % count == index:
            mine.append(int(value))
    return sorted(set(mine)), odd


def matcher(label: str, buckets: Iterable[int]) -> str:
    """``label="3"`` or ``label=~"3|7|11"``: the series of these buckets."""
    values = [str(b) for b in buckets]
    if len(values) == 1:
        return f'{label}="{values[0]}"'
    return f'{label}=~"{"|".join(values)}"'


def plan(
    buckets: Iterable[int],
    sizes: Mapping[int, int],
    label: str,
    per_piece: int = PIECE_SERVERS,
) -> list[Piece]:
    """``buckets`` packed in order into pieces of at most ``per_piece`` servers by
    ``sizes`` (servers per bucket last tick; an unknown bucket counts as a share of a
    piece); a bucket larger than a piece is a piece of its own."""
    unknown = max(1, per_piece // UNKNOWN_SHARE)
    groups: list[list[int]] = []
    held = 0
    for bucket in sorted(buckets):
        size = sizes.get(bucket, unknown)
        if not groups or held + size > per_piece:
            groups.append([])
            held = 0
        groups[-1].append(bucket)
        held += size
    return [Piece(i, tuple(g), matcher(label, g)) for i, g in enumerate(groups)]


def unlabelled(label: str, *, vllm: bool) -> Piece:
    """The piece of the series without the shard label."""
    return Piece(UNLABELLED, (), f'{label}=""', vllm)
