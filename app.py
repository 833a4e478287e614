"""PagedAttention Lab: watch a real model fill a paged KV cache, one scheduler step at a time.

    streamlit run app.py

This file only wires the pages together; each page is in app_pages/, engine logic in engine/,
figures in visualize/.
"""

import os

# The page's own engine is the reference a student's parts are stepped beside: it always runs the engine's
# own parts. A LAB_IMPL the app was started with becomes the sidebar's lab implementation instead (it is
# taken out before any engine module is imported, and kept for every rerun of this script).
if "LAB_IMPL" in os.environ:
    os.environ["LAB_APP_IMPL"] = os.environ.pop("LAB_IMPL")

import streamlit as st  # noqa: E402

# The Kernel lab runs the Triton kernels, under Triton's interpreter where there is no GPU: importing
# kernels first sets TRITON_INTERPRET before anything else (torch's own Triton-backed ops included)
# imports Triton.
import paged_kernels  # noqa: F401
import torch

from app_pages import beside_vllm, classroom, compare, handover, kernel_lab, labs_page, lessons, live, send, whatif
from app_pages.common import refuse_unsafe_serving
from app_pages.sidebar import engine_settings, lab_choice, language, student_mode
from app_pages.state import torch_threads
from visualize.i18n import t

st.set_page_config(page_title="PagedAttention Lab", page_icon=":material/view_module:", layout="wide")
torch.set_num_threads(torch_threads())  # every rerun: cheap, and each script run is a new thread

lang = language()
refuse_unsafe_serving(lang)  # this machine only, 1 MB uploads: wherever `streamlit run` was started from
room = classroom.classroom()  # made at the app's first visit, which prints the teacher token in the terminal
if student_mode():  # the classroom's join link: the Send page only, no other page, no engine settings
    st.navigation([st.Page(send.page, title=t("page_send", lang), icon=":material/send:", url_path="home", default=True),
                   st.Page(send.page, title=t("page_send", lang), icon=":material/send:", url_path="send")],
                  position="hidden").run()
else:
    pages = [
        # The default page is served at the root ("/"); /live opens the same page (hidden from the menu), so
        # every page is reachable by its URL path.
        st.Page(live.page, title=t("page_live", lang), icon=":material/view_module:", url_path="home", default=True),
        st.Page(live.page, title=t("page_live", lang), icon=":material/view_module:", url_path="live", visibility="hidden"),
        st.Page(compare.page, title=t("page_compare", lang), icon=":material/compare:", url_path="compare"),
        st.Page(whatif.page, title=t("page_whatif", lang), icon=":material/calculate:", url_path="whatif"),
        st.Page(beside_vllm.page, title=t("page_vllm", lang), icon=":material/difference:", url_path="vllm"),
        st.Page(handover.page, title=t("page_handover", lang), icon=":material/swap_horiz:", url_path="handover"),
        st.Page(kernel_lab.page, title=t("page_kernel", lang), icon=":material/memory:", url_path="kernel"),
        st.Page(lessons.page, title=t("page_lessons", lang), icon=":material/menu_book:", url_path="lessons"),
        st.Page(labs_page.page, title=t("page_labs", lang), icon=":material/construction:", url_path="labs"),
        st.Page(classroom.page, title=t("page_classroom", lang), icon=":material/co_present:", url_path="classroom"),
        st.Page(send.page, title=t("page_send", lang), icon=":material/send:", url_path="send"),
    ]
    page = st.navigation(pages)
    if page.url_path == "classroom" and room.follower is not None:
        # The attached server's engine first; this browser's own settings (the Live engine page's) folded under it.
        classroom.server_sidebar(room, lang)
        settings = engine_settings(lang, st.sidebar.expander(t("own_settings", lang)))
    else:
        if page.url_path in ("", "home", "live", "labs"):  # a student's lab parts, beside the engine's ("": the default page)
            lab_choice(lang)
        settings = engine_settings(lang)
    st.session_state["settings"] = settings
    page.run()
