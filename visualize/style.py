"""Settings shared by every figure and chart: a font that can draw Chinese labels (matplotlib), and
SVG drawing for the app's Vega-Lite charts (their text is then in the page, where a test can read it)."""

from __future__ import annotations

import functools
import os

import matplotlib
from matplotlib import font_manager

# Tried in order; Debian's fonts-noto-cjk provides the first, other systems the others.
CJK_FONTS = ("Noto Sans CJK SC", "Noto Sans CJK JP", "Noto Serif CJK SC", "Source Han Sans SC", "WenQuanYi Zen Hei", "SimHei", "Microsoft YaHei", "PingFang SC")
# Their files' names (Noto, Source Han, WenQuanYi, SimHei, Microsoft YaHei, PingFang), lower case.
CJK_FILES = ("cjk", "sourcehan", "wqy", "simhei", "msyh", "pingfang")


@functools.cache
def use_cjk_font() -> str | None:
    """Put the first installed CJK font behind matplotlib's default, so 中文 labels are not boxes.

    matplotlib lists the system's fonts once, in its cache; a CJK font installed after that (say
    ``apt-get install fonts-noto-cjk`` on a machine that had drawn a figure before) is not in the
    list, so the system's font files are searched for one then.

    Returns the font used, or None when none is installed (labels in English still draw fine).
    """
    name = _first_cjk_font()
    if name is None:
        for path in font_manager.findSystemFonts():
            if any(part in os.path.basename(path).lower() for part in CJK_FILES):
                try:
                    font_manager.fontManager.addfont(path)
                except (OSError, RuntimeError):  # a file FreeType cannot read
                    continue
        name = _first_cjk_font()
    if name is not None:
        # An explicit list (not the generic "sans-serif") makes matplotlib fall back glyph by glyph.
        matplotlib.rcParams["font.family"] = ["DejaVu Sans", name]
    return name


def _first_cjk_font() -> str | None:
    installed = {f.name for f in font_manager.fontManager.ttflist}
    return next((name for name in CJK_FONTS if name in installed), None)


SVG_EMBED = {"embedOptions": {"renderer": "svg"}}


def as_svg(spec):
    """``spec`` (a Vega-Lite dict or an Altair chart) drawn as SVG in the app, not on a canvas.

    Streamlit's ``st.vega_lite_chart`` / ``st.altair_chart`` honour the spec's
    ``usermeta.embedOptions.renderer`` (vega-embed's option); left unset, Streamlit draws a chart with
    more than 2000 data rows on a canvas. In SVG every title, axis label and legend label is a
    ``<text>`` element: the browser test reads and measures them (clipped or untranslated text).
    Returns a new dict / chart; other usermeta entries are kept.
    """
    if isinstance(spec, dict):
        usermeta = dict(spec.get("usermeta") or {})
        usermeta["embedOptions"] = {**usermeta.get("embedOptions", {}), **SVG_EMBED["embedOptions"]}
        return {**spec, "usermeta": usermeta}
    return spec.properties(usermeta=SVG_EMBED)


def finish(fig, axes, out: str | None):
    """A paper figure's last touches: the first panel's legend, a tight layout, saved to ``out`` (PNG,
    150 dpi) when given. Returns the figure."""
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    if out:
        fig.savefig(out, dpi=150)
    return fig
