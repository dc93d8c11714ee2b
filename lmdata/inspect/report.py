"""Statistics rendered for people: a terminal summary, a self-contained HTML page (inline SVG,
no dependencies) and a PNG (matplotlib, the optional ``plot`` extra)."""

from __future__ import annotations

import html
import os
from typing import Any

from lmdata._units import human_bytes


def _num(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.1f}" if abs(v) < 1e15 else f"{v:.3g}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


SPACE = "\u2423"  # ␣, shown for a space (DejaVu Sans, matplotlib's default font, has it)


def show_token(text: str | None) -> str:
    """A token's text made visible in one line, the same in the terminal, HTML and PNG: in
    quotes, ``\\n``, ``\\t``, ``\\r`` and other invisible characters escaped, and each space
    shown as ␣ (so ``'\\n␣␣␣'`` and ``'\\n␣'`` differ where a browser would collapse the
    spaces); a ␣ in the text itself is escaped as ``\\u2423``."""
    if text is None:
        return "?"
    return repr(text).replace(SPACE, "\\u2423").replace(" ", SPACE)


def _regroup(hist: dict[str, Any], rows: int) -> list[tuple[float, float, int]]:
    edges, counts = hist["edges"], hist["counts"]
    if not counts:
        return []
    step = max(1, -(-len(counts) // rows))
    out = []
    for i in range(0, len(counts), step):
        j = min(i + step, len(counts))
        out.append((edges[i], edges[j], sum(counts[i:j])))
    return out


def _sample_note(s: dict[str, Any]) -> str | None:
    sample = s.get("sample") or {}
    if not sample.get("sampled"):
        return None
    if sample.get("what") == "records":
        return (
            f"sampled {sample['records_read']:,} of {s['records']:,} records at random "
            f"(seed {sample['seed']}); length and field figures describe the sample, "
            "'estimated' totals scale it up. --full reads everything."
        )
    return (
        f"token frequencies from {sample['windows']:,} random windows of "
        f"{sample['window_tokens']:,} tokens ({sample['tokens_read']:,} of {s['tokens']:,}); "
        "counts and lengths are exact. --full reads everything."
    )


def text(s: dict[str, Any], width: int = 40) -> str:
    """The terminal summary."""
    lines = [f"{s['path']}  ({s.get('format')}, {s['kind']})"]
    if s.get("splits"):
        lines.append(
            f"split        {s.get('split') or s['splits'][0]} (of {', '.join(s['splits'])})"
        )
    if s.get("tokenizer"):
        lines.append(f"tokenizer    {s['tokenizer']}")
    lines.append(f"records      {s['records']:,}")
    if "tokens" in s:
        lines.append(f"tokens       {s['tokens']:,}")
    if s.get("max_token_id") is not None:
        lines.append(f"max token id {s['max_token_id']:,}")
    if s.get("model_vocab_size") is not None:
        lines.append(
            f"a model needs a vocabulary of at least {s['model_vocab_size']:,} (the "
            "tokenizer's, or the largest id + 1)"
        )
    if "text_bytes" in s and not (s.get("sample") or {}).get("sampled"):
        lines.append(f"text bytes   {s['text_bytes']:,} (UTF-8)")
    for k, v in (s.get("estimated") or {}).items():
        lines.append(f"estimated    {k.replace('_', ' ')}: {v:,} in all records")
    if "bytes_on_disk" in s:
        lines.append(f"on disk      {human_bytes(s['bytes_on_disk'])}")
    d = s.get("lengths")
    if d and d.get("count"):
        lines.append("")
        lines.append(
            f"length ({d['unit']} per record): min {d['min']:,}  p10 {d['p10']:,.0f}  "
            f"median {d['median']:,.0f}  mean {d['mean']:,.1f}  p90 {d['p90']:,.0f}  "
            f"p99 {d['p99']:,.0f}  max {d['max']:,}"
            + (f"  ({d['empty']:,} empty)" if d["empty"] else "")
        )
        groups = _regroup(d["histogram"], 12)
        peak = max((c for _, _, c in groups), default=0) or 1
        for lo, hi, c in groups:
            bar = "█" * round(width * c / peak)
            lines.append(f"  {lo:>12,.0f} - {hi:<12,.0f} {bar} {c:,}")
    top = s.get("top_tokens")
    if top:
        lines.append("")
        lines.append(f"most frequent token ids ({s.get('distinct_token_ids', 0):,} distinct seen):")
        for t in top:
            txt = f"  {show_token(t['text'])}" if "text" in t else ""
            lines.append(f"  {t['id']:>10,} {t['count']:>14,} {100 * t['share']:6.2f}%{txt}")
        if "text" not in top[0]:
            lines.append("  (--tokenizer FILE shows their text)")
    if s.get("sources"):
        lines.append("")
        lines.append("by source:")
        for name, v in s["sources"].items():
            lines.append(f"  {name:<30} {v['records']:>10,} records {v['characters']:>14,} chars")
    if s.get("attributes"):
        lines.append("")
        lines.append("attributes:")
        for name, v in s["attributes"].items():
            vals = v.get("values")
            extra = (
                f"  values min {_num(vals['min'])} mean {_num(vals['mean'])} "
                f"max {_num(vals['max'])}"
                if vals
                else ""
            )
            lines.append(f"  {name:<40} {v['records']:>8,} records {v['spans']:>10,} spans{extra}")
    notes = [n for n in (_sample_note(s), s.get("tokenizer_note")) if n]
    if notes:
        lines.append("")
        lines.extend(f"note: {n}" for n in notes)
    return "\n".join(lines)


def svg_histogram(hist: dict[str, Any], unit: str, width: int = 640, height: int = 200) -> str:
    """An inline SVG bar chart of a histogram (numbers only; nothing from the data as markup)."""
    counts, edges = hist.get("counts") or [], hist.get("edges") or []
    if not counts:
        return "<p>no records</p>"
    peak = max(counts) or 1
    pad_b, pad_l = 30, 50
    bw = (width - pad_l) / len(counts)
    bars = []
    for i, c in enumerate(counts):
        h = (height - pad_b - 10) * c / peak
        bars.append(
            f'<rect x="{pad_l + i * bw:.1f}" y="{height - pad_b - h:.1f}" '
            f'width="{max(bw - 1, 1):.1f}" height="{h:.1f}" fill="#4a7bd0">'
            f"<title>{edges[i]:,.0f} - {edges[i + 1]:,.0f} {html.escape(unit)}: {c:,}</title>"
            "</rect>"
        )
    scale = " (log scale)" if hist.get("scale") == "log" else ""
    axis = (
        f'<text x="{pad_l}" y="{height - 8}" font-size="11">{edges[0]:,.0f}</text>'
        f'<text x="{width}" y="{height - 8}" font-size="11" text-anchor="end">'
        f"{edges[-1]:,.0f}</text>"
        f'<text x="{(pad_l + width) / 2}" y="{height - 8}" font-size="11" text-anchor="middle">'
        f"{html.escape(unit)} per record{scale}</text>"
        f'<text x="0" y="12" font-size="11">{peak:,}</text>'
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'role="img" aria-label="length histogram">{"".join(bars)}{axis}</svg>'
    )


def _table(head: list[str], rows: list[list[Any]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_num(c))}</td>" for c in r) + "</tr>" for r in rows
    )
    return f"<table><tr>{th}</tr>{body}</table>"


_CSS = (
    "body{font:14px system-ui,sans-serif;margin:2em;max-width:60em}"
    "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 8px;"
    "text-align:right}th{background:#f4f4f4}td:first-child{text-align:left}"
    ".note{background:#fff6d5;padding:.5em}"
)


def html_page(s: dict[str, Any]) -> str:
    """A self-contained HTML report; every string from the dataset is escaped."""
    e = html.escape
    summary = [["records", s["records"]]]
    for k in ("tokens", "max_token_id", "text_bytes", "bytes_on_disk", "distinct_token_ids"):
        if s.get(k) is not None:
            summary.append([k.replace("_", " "), s[k]])
    for k, v in (s.get("estimated") or {}).items():
        summary.append([f"estimated {k.replace('_', ' ')}", v])
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>lmdata stats: "
        f"{e(str(s['path']))}</title><style>{_CSS}</style></head><body>",
        f"<h1>{e(str(s['path']))}</h1><p>{e(str(s.get('format')))} ({e(s['kind'])})</p>",
        _table(["", "value"], summary),
    ]
    note = _sample_note(s)
    if note:
        parts.append(f"<p class='note'>{e(note)}</p>")
    d = s.get("lengths")
    if d and d.get("count"):
        parts.append(f"<h2>Length ({e(d['unit'])} per record)</h2>")
        parts.append(svg_histogram(d["histogram"], d["unit"]))
        parts.append(
            _table(
                ["min", "p10", "median", "mean", "p90", "p99", "max", "empty"],
                [[d[k] for k in ("min", "p10", "median", "mean", "p90", "p99", "max", "empty")]],
            )
        )
    if s.get("top_tokens"):
        parts.append("<h2>Most frequent token ids</h2>")
        rows = [
            [t["id"], t["count"], f"{100 * t['share']:.2f}%", show_token(t.get("text"))]
            for t in s["top_tokens"]
        ]
        parts.append(_table(["id", "count", "share", "text"], rows))
    if s.get("sources"):
        parts.append("<h2>By source</h2>")
        rows = [[k, v["records"], v["characters"]] for k, v in s["sources"].items()]
        parts.append(_table(["source", "records", "characters"], rows))
    if s.get("attributes"):
        parts.append("<h2>Attributes</h2>")
        rows = []
        for k, v in s["attributes"].items():
            vals = v.get("values") or {}
            rows.append(
                [k, v["records"], v["spans"], *(vals.get(x, "") for x in ("min", "mean", "max"))]
            )
        parts.append(_table(["attribute", "records", "spans", "min", "mean", "max"], rows))
    if s.get("fields"):
        parts.append("<h2>Fields</h2>")
        rows = [[k, ", ".join(f"{t} {n:,}" for t, n in v.items())] for k, v in s["fields"].items()]
        parts.append(_table(["field", "types seen"], rows))
    parts.append("</body></html>\n")
    return "".join(parts)


def plot_png(s: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Histogram of record lengths, the most frequent tokens and the sources, as one PNG."""
    fig = figure(s)
    import matplotlib.pyplot as plt

    fig.savefig(os.fspath(path), dpi=100)
    plt.close(fig)


def figure(s: dict[str, Any]) -> Any:
    """The matplotlib figure :func:`plot_png` saves (token labels as :func:`show_token`)."""
    from lmdata._deps import require

    matplotlib = require("matplotlib", "--plot (a PNG; --html needs nothing extra)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p for p in ("lengths", "top_tokens", "sources") if s.get(p)]
    fig, axes = plt.subplots(len(panels) or 1, 1, figsize=(9, 3.2 * max(1, len(panels))))
    axes = list(axes) if len(panels) > 1 else [axes]
    for ax, p in zip(axes, panels, strict=False):
        if p == "lengths":
            d = s["lengths"]
            h = d["histogram"]
            if h["counts"]:
                ax.stairs(h["counts"], h["edges"], fill=True)
                if h["scale"] == "log":
                    ax.set_xscale("log")
            ax.set_xlabel(f"{d['unit']} per record")
            ax.set_ylabel("records")
            ax.set_title(f"length of {d['count']:,} records")
        elif p == "top_tokens":
            top = s["top_tokens"]
            labels = [
                show_token(t["text"]).replace("$", r"\$") if "text" in t else str(t["id"])
                for t in top
            ]
            ax.bar(range(len(top)), [t["count"] for t in top])
            ax.set_xticks(range(len(top)), labels, rotation=45, ha="right", fontsize=9)
            ax.set_title("most frequent tokens")
        else:
            names = list(s["sources"])[:20]
            ax.barh(names, [s["sources"][n]["records"] for n in names])
            ax.set_title("records by source")
    fig.suptitle(str(s["path"]), fontsize=9)
    fig.tight_layout()
    return fig
