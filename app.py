"""PagedAttention Lab: watch a real model fill a paged KV cache, one scheduler step at a time.

    streamlit run app.py

This file only wires the pages together; each page is in app_pages/, engine logic in engine/,
figures in visualize/.
"""

import streamlit as st

from app_pages import compare, kernel_lab, lessons, live
from app_pages.sidebar import engine_settings, language
from visualize.i18n import t

st.set_page_config(page_title="PagedAttention Lab", page_icon="🧱", layout="wide")

lang = language()
settings = engine_settings(lang)
st.session_state["settings"] = settings

pages = [
    st.Page(live.page, title=t("page_live", lang), icon="🧱", url_path="live", default=True),
    st.Page(compare.page, title=t("page_compare", lang), icon="⚖️", url_path="compare"),
    st.Page(kernel_lab.page, title=t("page_kernel", lang), icon="🔬", url_path="kernel"),
    st.Page(lessons.page, title=t("page_lessons", lang), icon="📓", url_path="lessons"),
]
st.navigation(pages).run()
