"""The lessons: notebooks in English (``en/``) and Chinese (``zh/``) built from one source each
(``src/``), with their solutions apart (``solutions/``). ``python -m lessons build`` writes the notebooks;
see ``lessons/build.py`` and ``lessons/README.md``."""
