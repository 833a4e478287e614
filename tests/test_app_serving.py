"""The app serves this machine only, with uploads of at most MAX_UPLOAD_MB, wherever it is started from (.streamlit/config.toml
next to app.py, read by Streamlit >= 1.46; and the app's own check when a start overrides it)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "app.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp{,6} write them) listening on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/net/tcp")
def test_started_from_another_directory_it_listens_on_localhost_only(tmp_path):
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMLIT_")}
    server = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(APP), "--server.port", str(port)],
                              cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("the server did not answer")
        assert _listening(port) == {"0100007F"}  # 127.0.0.1, and no wildcard (00000000) or other interface
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.parametrize("option, value, shown", [
    ("server.address", "0.0.0.0", "server.address is 0.0.0.0"),
    ("server.address", None, "server.address is unset (every network interface)"),
    ("server.maxUploadSize", 200, "server.maxUploadSize is 200 MB"),
])
def test_a_start_that_overrides_the_config_is_refused(option, value, shown, monkeypatch):
    from streamlit import config

    from app_pages.common import serving_problem

    monkeypatch.setattr(config, "_main_script_path", str(APP))  # as `streamlit run app.py` sets it
    config.set_option("server.address", "127.0.0.1")
    config.set_option("server.maxUploadSize", 1)
    try:
        assert serving_problem() is None
        config.set_option(option, value)
        assert serving_problem() == shown
        if option == "server.address":
            monkeypatch.setenv("PAGEDATTENTION_LAB_ALLOW_REMOTE", "1")  # a teacher's deliberate choice
            assert serving_problem() is None
    finally:
        config.set_option("server.address", "127.0.0.1")
        config.set_option("server.maxUploadSize", 1)


def test_the_refusal_is_the_whole_page(monkeypatch):
    from streamlit import config

    from visualize.i18n import t

    monkeypatch.setattr(config, "_main_script_path", str(APP))
    config.set_option("server.address", "0.0.0.0")
    try:
        at = AppTest.from_file(str(APP), default_timeout=120)
        at.run()
    finally:
        config.set_option("server.address", "127.0.0.1")
    assert not at.exception, [e.value for e in at.exception]
    assert [e.value for e in at.error] == [t("serving_refused", "en", problem="server\\.address is 0\\.0\\.0\\.0",
                                              env="PAGEDATTENTION_LAB_ALLOW_REMOTE")]
    assert not at.main.title and not at.main.button  # nothing of the lab is served
    assert "--server.address 127.0.0.1" in at.error[0].value
    assert "PAGEDATTENTION_LAB_ALLOW_REMOTE=1" in t("serving_refused", "zh", problem="x", env="PAGEDATTENTION_LAB_ALLOW_REMOTE")


def test_a_class_of_phones_is_not_starved_by_a_full_collection_after_every_redraw(monkeypatch):
    """Each phone's Send page redraws once a second (a script run). Streamlit's default runs a full
    garbage collection after every run; over the loaded model's objects that holds the GIL long enough
    that five phones starved the app's event loop (new phones never got the page). The app's config
    turns it off, and Streamlit reads it wherever the app is started from."""
    from streamlit import config

    monkeypatch.setattr(config, "_main_script_path", str(APP))  # as `streamlit run app.py` sets it
    monkeypatch.chdir(ROOT.parent)
    config.get_config_options(force_reparse=True)
    try:
        assert config.get_option("runner.postScriptGC") is False
    finally:
        monkeypatch.undo()
        config.get_config_options(force_reparse=True)
