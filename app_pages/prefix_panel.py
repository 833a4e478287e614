"""The Live engine page's view of the prefix cache beyond the pool map: the radix tree beside the
pool (``prefix_cache="radix"``), the CPU tier as a second strip of blocks (``kv_offload_blocks``),
each drawn from the step's report by ``visualize/radix.py``; live.py calls them with a line each."""

from __future__ import annotations

import streamlit as st

from visualize.i18n import t
from visualize.radix import cpu_tier_html, radix_tree_html


def radix_and_tier(report, lang: str, large: bool = False) -> None:
    """The tree after the step, with the path it evicted, then the CPU tier's strip (each only when
    the engine has it)."""
    tree = getattr(report, "radix_tree", None)
    if tree is not None:
        st.markdown(f"**{t('radix_tree_title', lang)}**")
        if tree.nodes or tree.evicted:
            st.markdown(radix_tree_html(tree, lang, large), unsafe_allow_html=True)
        else:
            st.caption(t("radix_empty", lang))
        st.caption(t("radix_legend", lang))
    tier = getattr(report, "kv_offload", None)
    if tier is not None:
        st.markdown(f"**{t('cpu_tier_title', lang, held=len(tier.cpu_held), capacity=tier.cpu_capacity)}**")
        st.markdown(cpu_tier_html(tier, lang, large), unsafe_allow_html=True)
