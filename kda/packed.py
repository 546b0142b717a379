"""Packed sequences (``cu_seqlens``): where their chunks lie, as the kernels read it, built once per call.

A sequence of ``n`` tokens has ``ceil(n / C)`` chunks, the last one short; an empty sequence has none. Every
chunk-parallel kernel takes the table's ``chunks`` (one block per chunk of every sequence, one launch), and every
sequential pass its ``cu_seqlens``, ``chunk_offsets`` and ``seq_groups`` (``sequence_tables``).
"""

from __future__ import annotations

import collections
import functools
from typing import NamedTuple

import torch

from kda import launch
from kda.chunking import CHUNK_SIZE, ceildiv


class ChunkTable(NamedTuple):
    """Where the chunks of packed sequences lie (on the device, int32), built once per call."""
    chunks: torch.Tensor         # first token and length of every chunk, sequence by sequence  [NC, 2]
    cu_seqlens: torch.Tensor     # the sequences' boundaries                                     [N + 1]
    chunk_offsets: torch.Tensor  # index of each sequence's first chunk in ``chunks``            [N + 1]
    seq_groups: torch.Tensor     # first sequence of each group the state pass carries in one block [NG + 1]
    most_chunks: int | None = None   # the most chunks of any sequence, where the host knows it (chunk_table)
    bounds: tuple | None = None      # the boundaries, where the host knows them (chunk_table)


# The state pass carries, in one block, the packed sequences whose first chunk lies in one window of
# this many chunks: 1024 sequences of 1 to 64 tokens take 32 groups, not 1024 blocks per value stripe.
GROUP_CHUNKS = 32


def seq_groups(chunk_offsets: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """The groups of sequences, as the index of each group's first sequence and then ``N``: a new
    group starts where a sequence's first chunk ``chunk_offsets[n]`` falls in another window of
    ``window`` chunks than the sequence before it. A sequence longer than the window ends its group
    (the next sequence starts in a later window); an empty sequence joins the group of its offset."""
    windows = chunk_offsets[:-1] // (window or GROUP_CHUNKS)
    starts = torch.nonzero(windows[1:] != windows[:-1]).flatten() + 1
    N = chunk_offsets.shape[0] - 1
    return torch.cat([starts.new_zeros(1 if N > 0 else 0), starts, starts.new_full((1,), N)])


def kept_per_boundaries(build):
    """``build(bounds: tuple, device, chunk_size)`` kept for its last 8 arguments by value (``functools.lru_cache``)
    and, in front of that, by the identity of ``bounds``: ``kda.validate.read_bounds`` hands every layer of a model
    the one tuple it keeps, found here without hashing its ``N + 1`` ints again (8,192 boundaries: about 0.05 ms a
    call for each table)."""
    by_value = functools.lru_cache(maxsize=8)(build)
    by_identity: collections.OrderedDict = collections.OrderedDict()

    @functools.wraps(build)
    def kept(bounds: tuple, device: torch.device, chunk_size: int):
        key = (id(bounds), device, chunk_size)
        hit = by_identity.get(key)
        if hit is not None and hit[0] is bounds:          # the tuple is held here, so its id names it alone
            by_identity.move_to_end(key)
            return hit[1]
        built = by_value(bounds, device, chunk_size)
        by_identity[key] = (bounds, built)
        while len(by_identity) > 8:
            by_identity.popitem(last=False)
        return built
    return kept


def stateless_known(table, h0, output_final_state: bool, most_chunks: int | None = None) -> bool:
    """Whether ``table``'s packed sequences can be laid out anew (tiles, one stream of chunks): the host knows their
    boundaries, there is a token, no state comes in or goes out, and (``most_chunks``) none has more chunks."""
    return table is not None and table.bounds is not None and table.bounds[-1] > 0 and h0 is None \
        and not output_final_state and (most_chunks is None or (table.most_chunks is not None
                                                                and table.most_chunks <= most_chunks))


def chunk_table(bounds, device, chunk_size=CHUNK_SIZE) -> ChunkTable:
    """The chunk table of the packed sequences with boundaries ``bounds`` (a host list, as
    ``validate.check_cu_seqlens`` returns it): a sequence of ``n`` tokens has ``ceil(n / C)`` chunks, the
    last one short; an empty sequence has none. Built on the host and copied to ``device`` once per
    boundaries: every layer of a model sees the same ones (the last few tables are kept)."""
    return _chunk_table(tuple(bounds), torch.device(device), chunk_size)


@kept_per_boundaries
def _chunk_table(bounds: tuple, device: torch.device, chunk_size: int) -> ChunkTable:
    cu = torch.tensor(bounds, dtype=torch.int64)
    offsets = chunk_offsets(cu, chunk_size)
    to_device = lambda x: x.to(torch.int32).to(device, non_blocking=True)
    return ChunkTable(to_device(table_rows(cu, offsets, torch.arange(int(offsets[-1])), chunk_size)), to_device(cu),
                      to_device(offsets), to_device(seq_groups(offsets)),
                      int((offsets[1:] - offsets[:-1]).max()) if len(bounds) > 1 else 0, bounds)


def sequence_tiles(bounds: tuple, device, chunk_size=CHUNK_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiles of ``chunk_size`` rows over packed sequences of at most ``chunk_size`` tokens each (host ``bounds``),
    each tile whole sequences one after another, filled in order while the next one fits: ``(tiles [NT, 2], starts
    [T])`` on ``device``, int32, each tile's first token and length, and each token's sequence by its first token
    (what ``kda.kernels.scalar_gate.packed_tile_output`` masks pairs by). Empty sequences take no room. Cached as
    ``chunk_table`` is."""
    return _sequence_tiles(tuple(bounds), torch.device(device), chunk_size)


def sequence_tile_table(bounds, device, chunk_size=CHUNK_SIZE) -> tuple[ChunkTable, torch.Tensor]:
    """``(the chunk table of the tiles, starts)``: the tiles of ``sequence_tiles`` over the packed sequences with
    host ``bounds``, as packed "sequences" of one chunk each (their first tokens and ``T`` as the boundaries), and
    each token's sequence by its first token (``kda.gated_delta``'s tiles for a gate per channel). Cached as
    ``chunk_table`` is."""
    return _sequence_tile_table(tuple(bounds), torch.device(device), chunk_size)


@kept_per_boundaries
def _sequence_tile_table(bounds: tuple, device: torch.device, chunk_size: int) -> tuple[ChunkTable, torch.Tensor]:
    firsts = [first for first, _ in tile_spans(bounds, chunk_size)]
    _, starts = _sequence_tiles(bounds, device, chunk_size)
    return chunk_table([*firsts, bounds[-1]], device, chunk_size), starts


def tile_spans(bounds: tuple, chunk_size: int = CHUNK_SIZE) -> list[tuple[int, int]]:
    """``sequence_tiles``' tiles on the host: ``(first token, length)`` of each, in order. Tiles are contiguous
    and hold every token (empty sequences take none), so their first tokens and ``T`` are the boundaries of
    packed "sequences" of at most one chunk each (``sequence_tile_table``)."""
    tiles, first, fill = [], None, 0
    for s, e in zip(bounds[:-1], bounds[1:]):
        if e - s > chunk_size:
            raise ValueError(f"sequence_tiles takes sequences of at most {chunk_size} tokens, got {e - s}")
        if e == s:
            continue
        if first is not None and fill + e - s > chunk_size:
            tiles.append((first, fill))
            first = None
        if first is None:
            first, fill = s, 0
        fill += e - s
    if first is not None:
        tiles.append((first, fill))
    return tiles


@kept_per_boundaries
def _sequence_tiles(bounds: tuple, device: torch.device, chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    tiles = tile_spans(bounds, chunk_size)
    to_device = lambda x: x.to(torch.int32).to(device, non_blocking=True)
    return to_device(torch.tensor(tiles, dtype=torch.int64).reshape(-1, 2)), token_starts(bounds, device)


def token_starts(bounds: tuple, device) -> torch.Tensor:
    """Each token's sequence by its first token (``[T]`` int32 on ``device``), from host ``bounds``."""
    lengths = torch.tensor(bounds[1:]) - torch.tensor(bounds[:-1])
    starts = torch.repeat_interleave(torch.tensor(bounds[:-1]), lengths)
    return starts.to(torch.int32).to(device, non_blocking=True)


def sequence_rows(bounds, device, chunk_size=CHUNK_SIZE) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tiles of ``chunk_size`` rows over packed sequences of at most ``chunk_size`` tokens each, filled by best fit
    over the sequences longest first rather than in order (run 140's 1024 sequences of 1 to 64 tokens: 532 tiles,
    98.7% of their rows used, against 696 and 75% in order; 526 chunks as one sequence): ``(tiles [NT, 2], rows [NT,
    C], starts [T])`` on ``device``, int32: each tile's first token and length (``sequence_tiles``' form), the token
    each tile row holds (a sequence's tokens on rows one after another; the rows past the tile's length repeat its
    last token), and each token's sequence by its first token. ``packed_tile_output(gathered=True)`` reads its rows
    through ``rows``. Cached as ``chunk_table`` is."""
    return _sequence_rows(tuple(bounds), torch.device(device), chunk_size)


def best_fit_tiles(bounds: tuple, chunk_size: int = CHUNK_SIZE) -> list[list[int]]:
    """The sequences (by index) of each tile, each tile's in order of their tokens: best fit decreasing, each
    sequence, longest first, into the fullest tile it still fits (a list of tiles per free room makes that a
    search over at most ``chunk_size`` rooms). Empty sequences take no room."""
    lengths = [e - s for s, e in zip(bounds[:-1], bounds[1:])]
    if max(lengths, default=0) > chunk_size:
        raise ValueError(f"sequence_rows takes sequences of at most {chunk_size} tokens, got {max(lengths)}")
    tiles: list[list[int]] = []
    by_room: list[list[int]] = [[] for _ in range(chunk_size + 1)]
    for n in sorted(range(len(lengths)), key=lambda n: (-lengths[n], n)):
        size = lengths[n]
        if size == 0:
            break
        room = next((r for r in range(size, chunk_size + 1) if by_room[r]), None)
        if room is None:
            tiles.append([])
            tile, room = len(tiles) - 1, chunk_size
        else:
            tile = by_room[room].pop()
        tiles[tile].append(n)
        by_room[room - size].append(tile)
    return sorted(sorted(tile) for tile in tiles)


@kept_per_boundaries
def _sequence_rows(bounds: tuple, device: torch.device, chunk_size: int):
    rows, tiles = [], []
    for members in best_fit_tiles(bounds, chunk_size):
        tokens = [t for n in members for t in range(bounds[n], bounds[n + 1])]
        tiles.append((bounds[members[0]], len(tokens)))
        rows.append(tokens + [tokens[-1]] * (chunk_size - len(tokens)))
    to_device = lambda x: x.to(torch.int32).to(device, non_blocking=True)
    as_rows = lambda x, width: torch.tensor(x, dtype=torch.int64).reshape(-1, width)
    return to_device(as_rows(tiles, 2)), to_device(as_rows(rows, chunk_size)), token_starts(bounds, device)


def stream_table(bounds, device, chunk_size=CHUNK_SIZE) -> tuple[ChunkTable, torch.Tensor]:
    """``(the chunk table of the packed tokens as one sequence, starts)``: the chunks of ``C`` rows of all ``T``
    tokens whatever the boundaries (``kda.reference.packed_stream``; ``chunk_intra(stream=True)`` resets the state
    where a sequence starts), and each token's sequence by its first token. Cached as ``chunk_table`` is."""
    return _stream_table(tuple(bounds), torch.device(device), chunk_size)


@kept_per_boundaries
def _stream_table(bounds: tuple, device: torch.device, chunk_size: int) -> tuple[ChunkTable, torch.Tensor]:
    return chunk_table((0, bounds[-1]), device, chunk_size), token_starts(bounds, device)


def chunk_offsets(cu: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """``[N + 1]``: the index of each sequence's first chunk in the table, then the chunks in all (``cu`` int64,
    the boundaries)."""
    counts = ceildiv(cu[1:] - cu[:-1], chunk_size)
    return torch.cat([counts.new_zeros(1), counts.cumsum(0)])


def table_rows(cu: torch.Tensor, offsets: torch.Tensor, rows: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """``[R, 2]``: the first token and the length of the table's rows ``rows`` (each below ``offsets[-1]``), found
    by search, so that nothing is read back."""
    # the sequence of each row: offsets[n] <= row < offsets[n + 1]
    seq = torch.searchsorted(offsets[1:], rows, right=True).clamp(max=cu.shape[0] - 2)
    first = cu[seq] + (rows - offsets[seq]) * chunk_size
    return torch.stack([first, torch.minimum(cu[seq + 1] - first, torch.full_like(first, chunk_size))], dim=1)


def device_chunk_table(cu_seqlens: torch.Tensor, T: int, chunk_size=CHUNK_SIZE, window: int | None = None) -> ChunkTable:
    """The chunk table of ``chunk_table``, built on the device from ``cu_seqlens`` with nothing read back, so that a
    CUDA graph can capture it and replay it with other boundaries of the same ``T`` and ``N``. Its sizes are bounds
    that the shapes give: ``(T + N (C - 1)) // C`` rows of ``chunks`` (no ``N`` sequences of ``T`` tokens have more
    chunks) and ``NC // window + 1`` groups of sequences, one per window of first chunks, empty where no sequence
    starts in it (a block of the state pass then has nothing to do). The rows past the real chunks repeat the last
    real chunk: its block in a chunk kernel writes the bytes the real one writes, so no kernel needs to know
    where the table ends. ``T >= 1``. ``most_chunks`` stays ``None``: nothing is read back to learn it."""
    C, W = chunk_size, window or GROUP_CHUNKS
    cu = cu_seqlens.to(torch.int64)
    N = cu.shape[0] - 1
    rows_max = max(1, (T + N * (C - 1)) // C)
    offsets = chunk_offsets(cu, C)
    rows = torch.minimum(torch.arange(rows_max, device=cu.device), offsets[-1] - 1)    # past the end: the last
    groups = torch.searchsorted(offsets[:-1] // W, torch.arange(rows_max // W + 1, device=cu.device))
    int32 = lambda x: x.to(torch.int32)
    return ChunkTable(int32(table_rows(cu, offsets, rows, C)), int32(cu), int32(offsets),
                      int32(torch.cat([groups, groups.new_full((1,), N)])))


# Value columns per block of the kernels for packed sequences of one chunk each (scalar_gate.single_chunk_output,
# gated_state_pass.single_chunk_gated_output).
SINGLE_CHUNK_COLUMNS = 64


def fits_one_chunk(table, DV: int) -> bool:
    """Whether the single-chunk kernels can take the packed sequences of ``table``: the host knows that none has more
    than one chunk (``None``, a dense batch, and a table built on the device do not say), and ``DV`` splits into
    blocks of ``SINGLE_CHUNK_COLUMNS``."""
    return table is not None and table.most_chunks is not None and table.most_chunks <= 1 \
        and DV % SINGLE_CHUNK_COLUMNS == 0


def sequence_tables(table, B: int, device):
    """What a sequential pass takes for the packed sequences of ``table`` (``None``: a dense batch of
    ``B`` sequences): ``(states, lanes, tables)`` with ``states`` the sequences, ``lanes`` the blocks per
    head and value block (groups of packed sequences, ``seq_groups``) and ``tables`` the pass's last
    three arguments (``cu_seqlens, chunk_offsets, seq_groups``, or ``[1]`` stand-ins)."""
    if table is None:
        return B, B, [launch.stand_in(1, torch.int32, device)] * 3
    return (table.cu_seqlens.shape[0] - 1, table.seq_groups.shape[0] - 1,
            [table.cu_seqlens, table.chunk_offsets, table.seq_groups])
