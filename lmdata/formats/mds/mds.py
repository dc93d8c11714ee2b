"""The MDS shard: ``[u32 n][u32 offsets × (n+1)][config JSON][samples]``, both directions.

A sample is ``[u32 size per variable-size column][column data in column order]``; columns are
sorted by name and fixed-size columns have no size prefix. Offsets are absolute file offsets.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from lmdata.errors import InvalidInputError, LmdataError
from lmdata.formats.mds.encodings import Coder, coder

EXTRA_BYTES_PER_SAMPLE = 4  # streaming counts one offset per sample against size_limit


def shard_config(
    columns: Mapping[str, str], compression: str | None, hashes: list[str], size_limit: int | None
) -> dict[str, Any]:
    """The per-shard config streaming embeds in each shard and repeats in index.json."""
    names = sorted(columns)
    encs = [columns[n] for n in names]
    sizes = []
    for n, e in zip(names, encs, strict=False):
        try:
            sizes.append(coder(e).size)
        except ValueError as err:
            raise InvalidInputError(f"column {n!r}: {err}") from None
    return {
        "column_encodings": encs,
        "column_names": names,
        "column_sizes": sizes,
        "compression": compression,
        "format": "mds",
        "hashes": hashes,
        "size_limit": size_limit,
        "version": 2,
    }


def config_bytes(config: Mapping[str, Any]) -> bytes:
    return json.dumps(config, sort_keys=True).encode("utf-8")


class SampleEncoder:
    """Encodes sample dicts for one column set (the MDSWriter's encode_sample)."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.plan: list[tuple[str, Coder, int | None]] = [
            (n, coder(e), s)
            for n, e, s in zip(
                config["column_names"],
                config["column_encodings"],
                config["column_sizes"],
                strict=False,
            )
        ]
        self.config = dict(config)
        self.config_data = config_bytes(config)
        self.extra_bytes_per_shard = 4 + 4 + len(self.config_data)

    def encode(self, sample: Mapping[str, Any]) -> bytes:
        sizes: list[int] = []
        data: list[bytes] = []
        for name, c, size in self.plan:
            try:
                value = sample[name]
            except KeyError:
                raise InvalidInputError(f"sample has no column {name!r}") from None
            if isinstance(value, bytes):
                datum = value  # streaming stores bytes as already encoded, for any encoding
            else:
                try:
                    datum = c.encode(value)
                except InvalidInputError as e:
                    raise InvalidInputError(f"column {name!r}: {e}") from None
            if size is None:
                sizes.append(len(datum))
            elif len(datum) != size:
                raise InvalidInputError(
                    f"column {name!r} ({c.name}) takes exactly {size} bytes, got {len(datum)}"
                )
            data.append(datum)
        if sizes:
            if max(sizes) > 0xFFFFFFFF:
                raise InvalidInputError("a column value over 4 GiB cannot be stored in MDS")
            return struct.pack(f"<{len(sizes)}I", *sizes) + b"".join(data)
        return b"".join(data)

    def shard(self, samples: list[bytes]) -> bytes:
        """One shard file from encoded samples."""
        n = len(samples)
        sizes = np.fromiter(map(len, samples), dtype=np.int64, count=n)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        offsets += 4 + 4 * (n + 1) + len(self.config_data)
        if int(offsets[-1]) > 0xFFFFFFFF:
            # streaming writes such a shard with wrapped offsets (issue #659); we refuse
            raise InvalidInputError(
                "this shard would exceed 4 GiB, past what uint32 offsets address; set a "
                "size_limit (for example '1gb')"
            )
        head = struct.pack("<I", n) + offsets.astype("<u4").tobytes() + self.config_data
        return head + b"".join(samples)


class SampleDecoder:
    """Decodes MDS sample bytes into dicts of the types streaming returns."""

    def __init__(
        self,
        names: tuple[str, ...],
        encodings: tuple[str, ...],
        sizes: tuple[int | None, ...],
        allow_unsafe_pickle: bool = False,
        select: tuple[str, ...] | None = None,
    ) -> None:
        self.plan: list[tuple[str, Callable[[bytes], Any], int | None, bool]] = []
        for n, e, s in zip(names, encodings, sizes, strict=False):
            c = coder(e, allow_unsafe_pickle)
            self.plan.append((n, c.decode, s, select is None or n in select))
        self.nvar = sum(1 for _, _, s, _ in self.plan if s is None)
        self.sizes = struct.Struct(f"<{self.nvar}I")
        self.head = 4 * self.nvar

    def __call__(self, data: bytes) -> dict[str, Any]:
        if len(data) < self.head:
            raise ValueError(f"sample of {len(data)} bytes is shorter than its size table")
        var = iter(self.sizes.unpack_from(data)) if self.nvar else iter(())
        pos = self.head
        out: dict[str, Any] = {}
        end_all = len(data)
        for name, dec, size, keep in self.plan:
            if size is None:
                size = next(var)
            end = pos + size
            if end > end_all:
                raise ValueError(f"column {name!r} runs {end - end_all} bytes past the sample")
            if keep:
                try:
                    out[name] = dec(data[pos:end])
                except LmdataError:
                    raise
                except (
                    ValueError,
                    TypeError,
                    IndexError,
                    KeyError,
                    struct.error,
                    ArithmeticError,
                    OSError,
                    SyntaxError,
                ) as e:
                    raise ValueError(f"column {name!r}: {type(e).__name__}: {e}") from None
            pos = end
        if pos != end_all:
            raise ValueError(f"sample has {end_all - pos} bytes after its last column")
        return out

    def compile(self) -> Callable[[bytes], dict[str, Any]]:
        """A function specialised to this column layout, several times faster than
        :meth:`__call__` on the random-access hot path. It checks the sizes once per sample;
        when anything fails it re-decodes with :meth:`__call__` for a precise error."""
        env: dict[str, Any] = {
            "_sizes": self.sizes.unpack_from,
            "_slow": self.__call__,
            "_from_bytes": int.from_bytes,
            "LmdataError": LmdataError,
        }
        body = ["def decode(data):", "    try:"]
        var = [f"v{k}" for k in range(self.nvar)]
        if var:
            body.append(f"        {', '.join(var)}, = _sizes(data)")
        fixed = sum(s for _, _, s, _ in self.plan if s is not None)
        total = " + ".join([str(self.head + fixed), *var])
        body.append(f"        if {total} != len(data):")
        body.append("            return _slow(data)")
        pos, k, items = str(self.head), 0, []
        for c, (name, dec, size, keep) in enumerate(self.plan):
            if size is None:
                end = f"p{c}"
                body.append(f"        {end} = {pos} + v{k}")
                k += 1
            else:
                end = f"p{c}"
                body.append(f"        {end} = {pos} + {size}")
            if keep:
                enc = getattr(dec, "__name__", "")
                piece = f"data[{pos}:{end}]"
                if enc == "_dec_str":
                    expr = f"{piece}.decode('utf-8')"
                elif enc == "_dec_int" and size == 8:  # any other size: the decoder refuses it
                    expr = f"_from_bytes({piece}, 'little', signed=True)"
                elif dec is bytes:
                    expr = piece
                else:
                    env[f"d{c}"] = dec
                    expr = f"d{c}({piece})"
                items.append(f"{name!r}: {expr}")
            pos = end
        body.append(f"        return {{{', '.join(items)}}}")
        body.append("    except LmdataError:")
        body.append("        raise")
        body.append("    except Exception:")
        body.append("        return _slow(data)")
        exec("\n".join(body), env)  # only repr()s of column names and integers go in
        return env["decode"]

    def column_span(self, data: bytes, column: int) -> tuple[int, int]:
        """(start, end) of one column inside sample bytes, without decoding."""
        var = iter(self.sizes.unpack_from(data)) if self.nvar else iter(())
        pos = self.head
        for k, (_, _, size, _) in enumerate(self.plan):
            if size is None:
                size = next(var)
            if k == column:
                return pos, pos + size
            pos += size
        raise IndexError(column)
