"""For tests comparing datasets byte for byte where a file legitimately differs (a provenance
line naming the process or the encoder): the manifest is then compared as it would be had the
blanked bytes been written, every other field and entry still byte for byte."""

from __future__ import annotations

from lmdata.storage._digest import hash_bytes
from lmdata.storage.manifest import FileEntry, Manifest, is_manifest_name


def restate(files: dict[str, bytes], original: dict[str, bytes]) -> dict[str, bytes]:
    """``files`` (name -> bytes, some blanked from ``original``) with each manifest among
    them rewritten for the blanked bytes; first each of its entries is checked against the
    ``original`` bytes (the manifest is a function of the files)."""
    out = dict(files)
    for name, data in files.items():
        if not is_manifest_name(name.rsplit("/", 1)[-1]):
            continue
        m = Manifest.parse(data, name)
        folder = name.rsplit("/", 1)[0] + "/" if "/" in name else ""
        entries = []
        for e in m.files:
            key = folder + e.name
            if key in original:
                assert FileEntry.of(e.name, hash_bytes(original[key], m.block), e.records) == e, (
                    f"the manifest's entry for {key} is not of the file's bytes"
                )
            if key in files and files[key] != original.get(key):
                e = FileEntry.of(e.name, hash_bytes(files[key], m.block), e.records)
            entries.append(e)
        restated = Manifest(tuple(entries), m.block, m.made_by, m.format, m.records).to_bytes()
        if files == original:
            assert restated == data, f"{name} is not in the form lmdata writes"
        out[name] = restated
    return out
