"""Matplotlib settings shared by every figure: a font that can draw Chinese labels."""

from __future__ import annotations

import functools

import matplotlib
from matplotlib import font_manager

# Tried in order; Debian's fonts-noto-cjk provides the first, other systems the others.
CJK_FONTS = ("Noto Sans CJK SC", "Noto Sans CJK JP", "Noto Serif CJK SC", "Source Han Sans SC", "WenQuanYi Zen Hei", "SimHei", "Microsoft YaHei", "PingFang SC")


@functools.cache
def use_cjk_font() -> str | None:
    """Put the first installed CJK font behind matplotlib's default, so 中文 labels are not boxes.

    Returns the font used, or None when none is installed (labels in English still draw fine).
    """
    installed = {f.name for f in font_manager.fontManager.ttflist}
    for name in CJK_FONTS:
        if name in installed:
            # An explicit list (not the generic "sans-serif") makes matplotlib fall back glyph by glyph.
            matplotlib.rcParams["font.family"] = ["DejaVu Sans", name]
            return name
    return None
