"""The classroom's drawings: a student's own blocks outlined on the shared pool map, the QR code of
the address to join."""

from __future__ import annotations

import io

from engine.report import StepReport

HIGHLIGHT_COLOR = "#ff00aa"  # a student's own blocks: a colour no request gets (visualize.colors)


def blocks_of(report: StepReport, request_ids: set[int]) -> list[int]:
    """Physical blocks whose block tables after the step belong to any of ``request_ids``, in order."""
    return sorted({b for snap in report.block_tables if snap.request_id in request_ids for b in snap.block_table})


def highlight_blocks(spec: dict, blocks: list[int]) -> dict:
    """The pool map's Vega-Lite spec (``visualize.pool.pool_map_spec``) with ``blocks`` outlined
    thickly in :data:`HIGHLIGHT_COLOR`, under the block numbers (the spec's last layer stays last)."""
    if not blocks:
        return spec
    box = {k: v for k, v in spec["layer"][0]["encoding"].items() if k in ("x", "x2", "y", "y2", "tooltip")}
    layer = {"transform": [{"filter": {"field": "block", "oneOf": list(blocks)}}],
             "mark": {"type": "rect", "fillOpacity": 0, "stroke": HIGHLIGHT_COLOR, "strokeWidth": 4},
             "encoding": box}
    return {**spec, "layer": [*spec["layer"][:-1], layer, spec["layer"][-1]]}


def qr_svg(text: str, scale: int = 6) -> str:
    """The QR code of ``text`` as an SVG document (segno; error correction M, a quiet zone of 4 modules).

    Raises:
        ValueError: ``text`` is empty or too long for a QR code.
    """
    import segno

    if not text:
        raise ValueError("nothing to encode")
    qr = segno.make(text, error="m", micro=False)
    out = io.BytesIO()
    qr.save(out, kind="svg", scale=scale, border=4, xmldecl=False, svgns=True, title=text)
    return out.getvalue().decode("utf-8")
