"""The sample order of mosaicml-streaming 0.13's ``StreamingDataset``, reproduced exactly.

An epoch's order is decided in three steps, each a pure function of its arguments here:

1. **Resampling** (:func:`resample`): each stream's ``choose`` (from ``proportion``,
   ``repeat`` or ``choose``, :func:`stream_choices`) is spread over its shards, whole repeats
   first and the remainder in granules of ``sampling_granularity`` from shards in a seeded
   random order; the result is a list of *shuffle units* (runs of samples of one shard) and
   the map from the resampled ("big") sample ids to the dataset's ("small") ones.
2. **Partition** (:func:`partition`): the big ids ``0..epoch_size`` are laid out as an array of
   shape (nodes, ranks per node, workers per rank, batches per worker, batch size): split into
   ``num_canonical_nodes`` contiguous ranges, interleaved, the first ``sample_in_epoch`` dropped,
   padded with repeats so every rank gets as many, then with -1 to whole worker batches.
3. **Shuffle** (:func:`shuffle`): a permutation of the big ids applied to the partition
   (``py1e``, streaming's default, and ``py1s``, ``py1br``, ``py2s``, ``naive``).

Every random draw comes from numpy ``default_rng`` generators seeded and called in the order
streaming calls them (the seed for the run, ``seed + epoch`` per epoch), which is what makes
the order the same, sample for sample; tests compare it with streaming itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lmdata.errors import InvalidInputError

SHUFFLE_ALGOS = ("py1e", "py1s", "py1br", "py2s", "naive")
PARTITION_ALGOS = ("orig", "relaxed")


def check_algos(shuffle_algo: str = "py1e", partition_algo: str = "relaxed") -> None:
    """Refuse a shuffle or partition algorithm streaming does not have, naming those it has."""
    if shuffle_algo not in SHUFFLE_ALGOS:
        raise InvalidInputError(
            f"shuffle_algo {shuffle_algo!r}: streaming's shuffles are {', '.join(SHUFFLE_ALGOS)}"
        )
    if partition_algo not in PARTITION_ALGOS:
        raise InvalidInputError(f"partition_algo must be one of {', '.join(PARTITION_ALGOS)}")


# ---- 1. resampling ---------------------------------------------------------------------------


def stream_choices(
    weights: list[tuple[str, float] | None],
    samples_per_stream: np.ndarray,
    epoch_size: int | None,
    seed: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(samples drawn from each stream per epoch, each stream's share of the epoch) from each
    stream's ``(kind, value)`` weight (kind ``proportion``, ``repeat`` or ``choose``; None for
    unweighted streams). The share is the weight asked for, not the rounded draw, when the
    streams are weighted relatively or the epoch size is given."""
    kinds = {w[0] if w else None for w in weights}
    relative = "proportion" in kinds
    if relative and kinds != {"proportion"}:
        raise InvalidInputError(
            "streams must all give proportion= or none of them (relative and absolute "
            "weights do not mix)"
        )
    samples = np.asarray(samples_per_stream, np.int64)
    if relative or (kinds == {None} and epoch_size):
        total = int(epoch_size) if epoch_size else int(samples.sum())
        if relative:
            share = np.array([w[1] for w in weights if w], np.float64)
        else:
            share = samples.astype(np.float64)
        share /= share.sum()
        choose = (total * share).astype(np.int64)
        # the samples lost to rounding go to streams picked at random, once each
        extra = np.random.default_rng(seed).choice(len(weights), total - choose.sum(), False)
        choose[extra] += 1
        return choose, share
    if epoch_size:
        raise InvalidInputError("epoch_size= needs streams weighted by proportion= (or none)")
    choose = samples.copy()
    for i, w in enumerate(weights):
        if w is not None and w[0] == "repeat":
            choose[i] = int(w[1] * samples[i])
        elif w is not None:
            choose[i] = int(w[1])
    return choose, choose / max(int(choose.sum()), 1)


def shard_choices(
    samples_per_shard: np.ndarray, choose: int, granularity: int, seed: int
) -> np.ndarray:
    """How many samples each shard of one stream contributes (``seed`` includes the epoch
    when the draw changes every epoch)."""
    sizes = np.asarray(samples_per_shard, np.int64)
    total = int(sizes.sum())
    if choose % total == 0:
        return sizes * (choose // total)
    out = sizes * (choose // total)
    left = choose % total
    # granules: each shard cut into runs of `granularity` samples, its last run shorter
    per_shard = (sizes + granularity - 1) // granularity
    granule_shard = np.repeat(np.arange(len(sizes)), per_shard)
    granule_size = np.full(len(granule_shard), granularity, np.int64)
    granule_size[np.cumsum(per_shard) - 1] = sizes - (per_shard - 1) * granularity
    for g in np.random.default_rng(seed).permutation(len(granule_shard)).tolist():
        take = min(left, int(granule_size[g]))
        out[granule_shard[g]] += take
        left -= take
        if not left:
            break
    return out


@dataclass(frozen=True)
class Sampling:
    """Everything resampling depends on besides the epoch."""

    samples_per_shard: np.ndarray  # every stream's shards, stream after stream
    shards_per_stream: np.ndarray
    choose_per_stream: np.ndarray
    seed: int
    granularity: int = 1
    balanced: bool = True  # sampling_method "balanced" (a new draw every epoch) or "fixed"
    shuffle: bool = False


def resample(s: Sampling, epoch: int, only: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(shuffle units, small id of each big id) of one epoch, of every stream or stream
    ``only`` (drawn as if it were the only one)."""
    pick_rng = np.random.default_rng(s.seed + epoch if s.balanced else s.seed)
    granule_seed = s.seed + epoch if (s.shuffle and s.balanced) else s.seed
    shard_starts = np.concatenate([[0], np.cumsum(s.samples_per_shard)])
    units: list[int] = []
    ids: list[np.ndarray] = []
    first_shard = 0
    for k, (n_shards, choose) in enumerate(
        zip(s.shards_per_stream.tolist(), s.choose_per_stream.tolist(), strict=True)
    ):
        shards = range(first_shard, first_shard + n_shards)
        first_shard += n_shards
        if only is not None and k != only:
            continue
        sizes = s.samples_per_shard[shards.start : shards.stop]
        per_shard = shard_choices(sizes, int(choose), s.granularity, granule_seed)
        for shard, size, take in zip(shards, sizes.tolist(), per_shard.tolist(), strict=True):
            if not size:  # an empty shard (streaming's writer can leave one) gives nothing
                continue
            whole, part = divmod(take, size)
            units += [size] * whole + ([part] if part else [])
            start = int(shard_starts[shard])
            ids += [np.arange(start, start + size, dtype=np.int64)] * whole
            if part:
                picked = pick_rng.choice(size, part, False)
                picked.sort()
                ids.append(start + picked.astype(np.int64))
    empty = np.zeros(0, np.int64)
    return np.array(units, np.int64), (np.concatenate(ids).astype(np.int64) if ids else empty)


# ---- 2. partition ----------------------------------------------------------------------------


def _check_nodes(canonical: int, physical: int) -> None:
    big, small = max(canonical, physical), min(canonical, physical)
    if big % small:
        raise InvalidInputError(
            f"num_canonical_nodes ({canonical}) and the number of nodes ({physical}) must "
            "divide one another"
        )


def _pad_to_multiple(ids: np.ndarray, k: int) -> np.ndarray:
    """Columns repeated at the end of a (nodes, m) array so that k divides m."""
    m = ids.shape[1]
    if m % k == 0:
        return ids
    missing = k - m % k
    if k + missing - 1 <= m:  # repeat the samples just before the last k-1
        extra = ids[:, m - k - missing + 1 : m - k + 1]
    else:  # too few samples: cycle through them
        extra = np.concatenate([np.tile(ids, missing // m), ids[:, : missing % m]], 1)
    return np.concatenate([ids, extra], 1)


def partition_orig(
    n: int, canonical: int, nodes: int, ranks: int, workers: int, batch: int, drop_first: int
) -> np.ndarray:
    """streaming's ``orig`` partition of big ids ``0..n`` (see the module docstring)."""
    _check_nodes(canonical, nodes)
    drop_first -= drop_first % nodes
    per_cn = -(-n // canonical)
    ratio = nodes // canonical if canonical < nodes else 0
    padding = (-per_cn) % ratio if ratio else 0
    width = per_cn + padding
    if n > canonical or (n == canonical and canonical >= nodes):
        starts = np.arange(canonical, dtype=np.int64) * n // canonical
        stops = np.arange(1, canonical + 1, dtype=np.int64) * n // canonical
        ids = starts[:, None] + np.arange(width, dtype=np.int64)[None, :]
        # a range one short repeats its last sample in its last column
        ids[:, per_cn - 1] -= (stops - starts < per_cn).astype(np.int64)
        if padding:  # (negative slice bounds, as streaming writes them)
            ids[:, -padding:] = ids[:, -2 * padding - ratio + 1 : -padding - ratio + 1]
    else:  # fewer samples than canonical nodes: cycle through them
        ids = np.resize(np.arange(n, dtype=np.int64), canonical * width).reshape(canonical, width)
    ids = ids.T.reshape(-1)[drop_first:].reshape(-1, nodes).T
    ids = _pad_to_multiple(ids, ranks).reshape(nodes, -1, ranks)
    per_rank, step = ids.shape[1], workers * batch
    fill = -(-per_rank // step) * step - per_rank
    if fill:
        ids = np.concatenate([ids, np.full((nodes, fill, ranks), -1, np.int64)], 1)
    ids = ids.transpose(0, 2, 1).reshape(nodes, ranks, -1, workers, batch)
    return ids.transpose(0, 1, 3, 2, 4)


def partition(
    algo: str,
    n: int,
    canonical: int,
    nodes: int,
    ranks: int,
    workers: int,
    batch: int,
    drop_first: int = 0,
    initial_nodes: int | None = None,
) -> np.ndarray:
    """The (nodes, ranks, workers, batches, batch) array of big ids, -1 where empty."""
    check_algos(partition_algo=algo)
    world = nodes * ranks
    if n + world - n % world < drop_first:
        raise InvalidInputError(f"cannot resume at sample {drop_first} of an epoch of {n} samples")
    same_shape = canonical % nodes == 0 if nodes <= canonical else nodes % canonical == 0
    if algo == "orig" or initial_nodes is None or same_shape:
        return partition_orig(n, canonical, nodes, ranks, workers, batch, drop_first)
    # relaxed: the initial run's partition, re-sliced for this world in traversal order
    global_batch, initial_devices = nodes * ranks * batch, initial_nodes * ranks
    if global_batch % initial_devices:
        raise InvalidInputError(
            f"the global batch size {global_batch} must stay divisible by the initial "
            f"{initial_devices} devices to resume on another number of nodes"
        )
    ids = partition_orig(
        n, canonical, initial_nodes, ranks, workers, global_batch // initial_devices, drop_first
    )
    ids = ids.transpose(3, 2, 0, 1, 4).reshape(-1, workers, nodes, ranks, batch)
    return ids.transpose(2, 3, 1, 0, 4)


# ---- 3. shuffle ------------------------------------------------------------------------------


def _shuffled(rng: np.random.Generator, n: int) -> np.ndarray:
    order = np.arange(n)
    rng.shuffle(order)
    return order


def _node_spans(
    units: np.ndarray, canonical: int, seed: int, epoch: int
) -> tuple[list[list[tuple[int, int]]], np.random.Generator]:
    """The shuffle units as spans of big ids, in the run's fixed order, cut at canonical node
    boundaries, each node's spans in this epoch's order; and the epoch's generator."""
    ends = np.cumsum(units).tolist()
    spans = [(e - int(u), e) for e, u in zip(ends, units.tolist(), strict=True)]
    spans = [spans[i] for i in _shuffled(np.random.default_rng(seed), len(spans)).tolist()]
    total = int(ends[-1]) if ends else 0
    nodes: list[list[tuple[int, int]]] = []
    at = done = 0
    for part in range(canonical):
        end = total * (part + 1) // canonical
        mine: list[tuple[int, int]] = []
        while at < len(spans):
            lo, hi = spans[at]
            if done + hi - lo > end:  # the span crosses the boundary: split it
                if done < end:
                    cut = lo + end - done
                    mine.append((lo, cut))
                    spans[at] = (cut, hi)
                    done = end
                break
            mine.append((lo, hi))
            done += hi - lo
            at += 1
        nodes.append(mine)
    rng = np.random.default_rng(seed + epoch)
    nodes = [[node[i] for i in _shuffled(rng, len(node)).tolist()] for node in nodes]
    return nodes, rng


def _py1s(units: np.ndarray, canonical: int, seed: int, epoch: int, block: int) -> np.ndarray:
    nodes, rng = _node_spans(units, canonical, seed, epoch)
    parts = []
    for lo, hi in (span for node in nodes for span in node):
        ids = np.arange(lo, hi, dtype=np.int64)
        rng.shuffle(ids)
        parts.append(ids)
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _py1e(units: np.ndarray, canonical: int, seed: int, epoch: int, block: int) -> np.ndarray:
    nodes, rng = _node_spans(units, canonical, seed, epoch)
    out = []
    for node in nodes:
        sizes = [hi - lo for lo, hi in node]
        n = sum(sizes)
        if n == 0:
            raise InvalidInputError(
                "a canonical node got no samples: the dataset has fewer samples than "
                "num_canonical_nodes; lower num_canonical_nodes"
            )
        samples = []
        for lo, hi in node:
            ids = np.arange(lo, hi, dtype=np.int64)
            rng.shuffle(ids)
            samples.append(ids)
        # each span's samples move by a random shift of at most half a (random) block
        positions = np.arange(n, dtype=np.float64)
        at = 0
        for size in sizes:
            reach = max((int(rng.integers(int(0.75 * block), int(1.25 * block))) - size) / 2, 0)
            low, high = max(-reach, -at), min(reach, n - at - size)
            positions[at : at + size] += rng.uniform(low=low, high=high, size=size)
            at += size
        out.append(np.concatenate(samples)[np.argsort(positions)])
    return np.concatenate(out)


def _py1br(units: np.ndarray, canonical: int, seed: int, epoch: int, block: int) -> np.ndarray:
    nodes, rng = _node_spans(units, canonical, seed, epoch)
    ids = np.concatenate(
        [np.arange(lo, hi, dtype=np.int64) for node in nodes for lo, hi in node]
        or [np.zeros(0, np.int64)]
    )
    stagger = rng.integers(0, int(0.75 * block), (canonical,))
    stop = 0
    for k, node in enumerate(nodes):
        start = stop
        stop += sum(hi - lo for lo, hi in node)
        blocks, end = [], start
        while end < stop:
            size = int(rng.integers(int(0.75 * block), int(1.25 * block)))
            lo = max(end - int(stagger[k]), start)
            hi = min(end + size - int(stagger[k]), stop)
            blocks.append((lo, hi))
            end += hi - lo
        for lo, hi in blocks:
            rng.shuffle(ids[lo:hi])
    return ids


def _py2s(units: np.ndarray, canonical: int, seed: int, epoch: int, block: int) -> np.ndarray:
    """Like py1s, but each unit's samples are also shuffled once for the run (before the cut
    into canonical nodes), and each node's spans are reordered and shuffled node by node."""
    fixed = np.random.default_rng(seed)
    ends = np.cumsum(units).tolist()
    spans = [(e - int(u), e) for e, u in zip(ends, units.tolist(), strict=True)]
    pieces = []
    for i in _shuffled(fixed, len(spans)).tolist():
        ids = np.arange(*spans[i], dtype=np.int64)
        fixed.shuffle(ids)
        pieces.append(ids)
    total = int(ends[-1]) if ends else 0
    nodes: list[list[np.ndarray]] = []
    at = done = 0
    for part in range(canonical):  # cut as _node_spans does, on the shuffled samples
        end = total * (part + 1) // canonical
        mine: list[np.ndarray] = []
        while at < len(pieces):
            ids = pieces[at]
            if done + len(ids) > end:
                if done < end:
                    mine.append(ids[: end - done])
                    pieces[at] = ids[end - done :]
                    done = end
                break
            mine.append(ids)
            done += len(ids)
            at += 1
        nodes.append(mine)
    rng = np.random.default_rng(seed + epoch)
    out = []
    for node in nodes:
        for i in _shuffled(rng, len(node)).tolist():
            ids = node[i].copy()
            rng.shuffle(ids)
            out.append(ids)
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def _naive(units: np.ndarray, canonical: int, seed: int, epoch: int, block: int) -> np.ndarray:
    return np.random.default_rng(seed + epoch).permutation(int(units.sum()))


_SHUFFLES = {"py1e": _py1e, "py1s": _py1s, "py1br": _py1br, "py2s": _py2s, "naive": _naive}


def shuffle(
    algo: str, units: np.ndarray, canonical: int, seed: int, epoch: int, block: int
) -> np.ndarray:
    """The epoch's permutation of big ids (``out[i]`` is what position ``i`` holds)."""
    check_algos(shuffle_algo=algo)
    return _SHUFFLES[algo](np.asarray(units, np.int64), canonical, seed, epoch, block)


# ---- the epoch -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Order:
    """The knobs of a dataset's order that stay fixed over a run."""

    sampling: Sampling
    epoch_size: int
    batch_size: int
    shuffle: bool = False
    algo: str = "py1e"
    block_size: int = 1 << 18
    partition_algo: str = "relaxed"
    batching: str = "random"
    proportions: tuple[float, ...] = ()  # each stream's share of the epoch (per_stream)


@dataclass(frozen=True)
class Layout:
    """Where an epoch's samples go: the canonical nodes, the physical world (nodes, ranks per
    node, workers per rank) and, on a resume, the nodes of the run that saved the state."""

    canonical: int
    nodes: int
    ranks: int
    workers: int
    initial_nodes: int | None = None


def epoch_ids(
    order: Order,
    epoch: int,
    sample_in_epoch: int,
    layout: Layout,
) -> np.ndarray:
    """The whole epoch as dataset sample ids, shaped (nodes, ranks, workers, batches, batch),
    -1 where a worker's last batch is short."""
    if order.batching == "per_stream":
        return _per_stream(order, epoch, sample_in_epoch, layout)
    return _ids(order, epoch, None, sample_in_epoch, layout)


def _ids(
    order: Order,
    epoch: int,
    stream: int | None,
    sample_in_epoch: int,
    layout: Layout,
) -> np.ndarray:
    """Resample, partition and shuffle the epoch (or one stream's part of it, alone)."""
    units, small = resample(order.sampling, epoch, stream)
    block = order.block_size
    if stream is not None:
        block = int(block * order.proportions[stream])
    big = partition(
        order.partition_algo,
        len(small) if stream is not None else order.epoch_size,
        layout.canonical,
        layout.nodes,
        layout.ranks,
        layout.workers,
        order.batch_size,
        sample_in_epoch,
        layout.initial_nodes,
    )
    if order.shuffle:
        perm = shuffle(order.algo, units, layout.canonical, order.sampling.seed, epoch, block)
        big = np.where(big >= 0, perm[np.maximum(big, 0)], -1)
    return np.where(big >= 0, small[np.maximum(big, 0)], -1)


def _per_stream(
    order: Order,
    epoch: int,
    sample_in_epoch: int,
    layout: Layout,
) -> np.ndarray:
    """streaming's ``per_stream`` batching: every global batch from one stream. Each stream is
    laid out alone, cut into global batches (a short last one dropped), and the batches of all
    streams are interleaved in a seeded random order of their streams, each stream's in order;
    a resume restarts at the last whole global batch."""
    nodes, ranks, workers = layout.nodes, layout.ranks, layout.workers
    glob = order.batch_size * nodes * ranks
    batches, counts = [], []
    for k in range(len(order.sampling.choose_per_stream)):
        ids = _ids(order, epoch, k, 0, layout)
        mine = ids.transpose(3, 2, 0, 1, 4).reshape(-1, glob)
        full = int(np.count_nonzero(mine.min(axis=1) >= 0))
        if not full:
            raise InvalidInputError(
                f"stream {k} has too few samples for one global batch of {glob} "
                "(batching_method='per_stream' needs at least one per stream)"
            )
        batches.append(mine[:full])
        counts.append(full)
    s = order.sampling
    seed = s.seed + epoch if (order.shuffle and s.balanced) else s.seed
    origins = np.repeat(np.arange(len(counts)), counts)
    np.random.default_rng(seed).shuffle(origins)
    firsts = np.cumsum(counts) - np.array(counts)
    pick = np.empty(len(origins), np.int64)
    for k, n in enumerate(counts):
        pick[origins == k] = firsts[k] + np.arange(n)
    out = np.concatenate(batches)[pick][sample_in_epoch // glob :]
    missing = (-len(out)) % workers  # whole rounds of worker batches, padded with -1
    if missing:
        out = np.concatenate([out, np.full((missing, glob), -1, np.int64)])
    return out.reshape(-1, workers, nodes, ranks, order.batch_size).transpose(2, 3, 1, 0, 4)
