"""The labs' seam: the engine runs a student's part in place of its own, through the same interface.

A *lab* is one part of the engine a student writes: some functions or methods of one engine module.
The model answer is the engine's own code, marked in that module (otter-grader's and nbgrader's
markers, with the lab's name)::

    def allocate(self) -> int:
        \"\"\"Take one block from the free list ...\"\"\"
        # BEGIN SOLUTION block_pool
        ...
        # END SOLUTION

The functions that hold a lab's regions are its *parts* (a method as ``Class.method``). ``python -m
lessons labs build`` cuts each lab's starter from the module (``labs/starters/<lab>.py``: the parts with
their signatures and docstrings, each region replaced by a TODO and ``raise NotImplementedError``).

Choosing an implementation: the environment variable ``LAB_IMPL`` (``python -m engine --impl``,
``python -m lessons grade --impl``):

- unset or ``solution``: the engine's own parts;
- ``starter``: every lab's starter (``labs/starters/<lab>.py``);
- a directory: ``<dir>/<lab>.py`` for each lab that file exists for (a student's copy of the starters);
- a file: one file, whose ``LAB = "<lab>"`` line names the lab whose parts it holds (a find-the-bug
  lab's file names the lab it is a seeded copy of);
- several of these joined by ``os.pathsep``: for each lab, the last entry that has it.

``LAB_ONLY`` (comma-separated lab names) limits the swap to those labs. ``python -m lessons grade``
grades each lab alone (``LAB_ONLY`` names that lab; the rest of the engine is its own), and all of a
student's parts together only when asked (``--together``).

Each engine module that holds labs calls :func:`plug_lab_parts` with its ``globals()`` on its last
line, so the swap happens before any other module imports a name from it. The student's file runs
in a namespace that starts as a copy of the engine module's (its imports and helpers are there), in
which the lab's own parts are stubs that raise "not written"; a top-level part replaces the module's
name, a method part is set on the engine's class (with any new helper method the student's class
adds), and each then reads the module's names live, as the engine's own part does. A Triton kernel module (``paged_kernels``, which imports
nothing of the engine) is plugged by the engine when it chooses the kernels (:func:`plug_module`).

Standard library only: this is the engine's lowest layer (``engine.core``, model-free).
"""

from __future__ import annotations

import ast
import os
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path

LAB_IMPL_ENV = "LAB_IMPL"
LAB_ONLY_ENV = "LAB_ONLY"
REPO = Path(__file__).resolve().parents[2]
STARTERS = REPO / "labs" / "starters"
BEGIN = re.compile(r"^(?P<indent>[ \t]*)# BEGIN SOLUTION(?:[ \t]+(?P<lab>[A-Za-z_][A-Za-z0-9_]*))?[ \t]*$")
END = re.compile(r"^[ \t]*# END SOLUTION[ \t]*$")
LAB_LINE = re.compile(r'^LAB = "(?P<lab>[A-Za-z_][A-Za-z0-9_]*)"', re.MULTILINE)
# The first line of a starter's body, in place of a solution region (the starters, and the handout's engine).
TODO = "# TODO({lab}): write this part (see the docstring and labs/README.md)"
TODO_LINE = re.compile(r"^(?P<indent>[ \t]*)# TODO\((?P<lab>[A-Za-z_][A-Za-z0-9_]*)\): write this part")


class LabImplError(ValueError):
    """A ``LAB_IMPL`` that cannot be used: a missing file, a file without its lab's parts, a marker
    out of place. The message names the file and the lab."""


@dataclass(frozen=True)
class Region:
    """One ``# BEGIN SOLUTION <lab>`` ... ``# END SOLUTION`` region: 1-based line numbers of its two
    marker lines, and the indentation of the BEGIN line."""

    lab: str
    begin: int
    end: int
    indent: str


@dataclass(frozen=True)
class Part:
    """A function of an engine module that holds a lab's solution regions.

    Attributes:
        qualname: ``name`` (module level) or ``Class.name`` (a method).
        node: its ``ast.FunctionDef`` (decorators included from ``node.decorator_list``).
        regions: its solution regions, in order.
    """

    qualname: str
    node: ast.FunctionDef
    regions: tuple[Region, ...]


def solution_regions(source: str, filename: str = "<source>") -> list[Region]:
    """Every solution region of a module's source, in order.

    Raises:
        LabImplError: a BEGIN without a lab name, nested or unclosed regions, an END without BEGIN.
    """
    regions, open_at = [], None
    for number, line in enumerate(source.splitlines(), 1):
        begin = BEGIN.match(line)
        if begin:
            if open_at is not None:
                raise LabImplError(f"{filename}:{number}: BEGIN SOLUTION inside the region opened on line {open_at[0]}")
            if not begin["lab"]:
                raise LabImplError(f"{filename}:{number}: BEGIN SOLUTION names no lab (write `# BEGIN SOLUTION <lab>`)")
            open_at = (number, begin["lab"], begin["indent"])
        elif END.match(line):
            if open_at is None:
                raise LabImplError(f"{filename}:{number}: END SOLUTION without a BEGIN SOLUTION")
            regions.append(Region(open_at[1], open_at[0], number, open_at[2]))
            open_at = None
    if open_at is not None:
        raise LabImplError(f"{filename}:{open_at[0]}: BEGIN SOLUTION is never closed")
    return regions


def starter_regions(source: str) -> list[Region]:
    """Each :data:`TODO` line of a module whose solution regions were cut out (the handout's engine,
    ``python -m lessons labs handout``), as a one-line region: it marks the part it sits in."""
    return [Region(m["lab"], number, number, m["indent"])
            for number, line in enumerate(source.splitlines(), 1) if (m := TODO_LINE.match(line))]


def lab_parts(source: str, filename: str = "<source>") -> dict[str, list[Part]]:
    """A module's labs -> their parts, in source order: the functions (module level, or methods of a
    module-level class) that enclose each lab's regions (in the handout's engine, its TODO lines).

    Raises:
        LabImplError: a region outside any such function, or a function holding regions of two labs.
    """
    # A per-week handout's module holds both: the handed-out labs' TODO lines, the others' regions.
    regions = sorted(solution_regions(source, filename) + starter_regions(source), key=lambda r: r.begin)
    if not regions:
        return {}
    functions: list[tuple[str, ast.FunctionDef]] = []
    for node in ast.parse(source, filename).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions.append((node.name, node))
        elif isinstance(node, ast.ClassDef):
            functions += [(f"{node.name}.{f.name}", f) for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
    labs: dict[str, list[Part]] = {}
    owner: dict[str, list[Region]] = {}
    nodes = {}
    for region in regions:
        for qualname, node in functions:
            if node.lineno < region.begin <= node.end_lineno:  # END comes after the last statement
                break
        else:
            raise LabImplError(f"{filename}:{region.begin}: a solution region must sit inside a function or method")
        owner.setdefault(qualname, []).append(region)
        nodes[qualname] = node
    for qualname, held in owner.items():
        names = {r.lab for r in held}
        if len(names) > 1:
            raise LabImplError(f"{filename}: {qualname} holds regions of labs {sorted(names)}; one function, one lab")
        labs.setdefault(held[0].lab, []).append(Part(qualname, nodes[qualname], tuple(held)))
    return labs


def chosen_file(lab: str, spec: str | None = None) -> Path | None:
    """The file whose parts replace ``lab``'s under ``LAB_IMPL`` (or ``spec``); None: the engine's own.

    Raises:
        LabImplError: ``LAB_IMPL`` names a path that does not exist.
    """
    spec = os.environ.get(LAB_IMPL_ENV, "") if spec is None else spec
    spec = spec.strip()
    if spec in ("", "solution"):
        return None
    only = os.environ.get(LAB_ONLY_ENV, "").strip()
    if only and lab not in {name.strip() for name in only.split(",")}:
        return None
    if os.pathsep in spec:  # several entries: the last one that has the lab wins
        found = [chosen_file(lab, entry) for entry in spec.split(os.pathsep) if entry.strip()]
        return next((path for path in reversed(found) if path is not None), None)
    if spec == "starter":
        path = STARTERS / f"{lab}.py"
        return path if path.is_file() else None
    path = Path(spec).expanduser()
    if path.is_dir():
        candidate = path / f"{lab}.py"
        return candidate if candidate.is_file() else None
    if not path.is_file():
        raise LabImplError(f"{LAB_IMPL_ENV}={spec}: no such file or directory (solution, starter, a directory or a .py file)")
    found = LAB_LINE.search(path.read_text(encoding="utf-8"))
    if found is None:
        raise LabImplError(f"{path}: no `LAB = \"<lab>\"` line naming the lab whose parts it holds")
    return path if found["lab"] == lab else None


def _not_written(lab: str, qualname: str, like: object) -> object:
    """A part that raises "not written", shaped as ``like`` (a staticmethod stays one): what a lab's
    part is while the student's file runs, so that the engine's own answer is not in its namespace."""

    def part(*args, **kwargs):
        raise NotImplementedError(f"lab {lab}: {qualname}")

    part.__name__ = part.__qualname__ = qualname.rpartition(".")[2]
    return staticmethod(part) if isinstance(like, staticmethod) else part


def _code_file(value: object) -> str | None:
    """The file a function (a staticmethod's, a Triton kernel's) was compiled from; None: no function."""
    value = getattr(value, "__func__", value)  # staticmethod, classmethod
    value = getattr(value, "fn", value)  # triton.jit
    code = getattr(value, "__code__", None)
    return code.co_filename if code is not None else None


def is_engines_own(part: object) -> bool:
    """Is ``part`` (a function or method, e.g. ``Scheduler._can_admit``) the engine's own code, not a student's
    plugged in (which keeps the file it was compiled from) nor any other function set in its place? A fast path
    that stands in for a part (the simulator's lock-step path) takes that path only when it is."""
    name = getattr(part, "__module__", None) or ""
    module = sys.modules.get(name)
    return name.partition(".")[0] == "engine" and module is not None and _code_file(part) == getattr(module, "__file__", None)


def _rebind(value: object, namespace: dict) -> object:
    """``value`` (a plain function, or a staticmethod of one) with ``namespace`` as its globals: the
    student's part then reads the engine module's names live, as the engine's own part does (a test
    that patches a module constant reaches it). Anything else is returned as it is."""
    inner = value.__func__ if isinstance(value, staticmethod) else value
    if not isinstance(inner, types.FunctionType):
        return value
    fn = types.FunctionType(inner.__code__, namespace, inner.__name__, inner.__defaults__, inner.__closure__)
    fn.__kwdefaults__, fn.__qualname__, fn.__doc__ = inner.__kwdefaults__, inner.__qualname__, inner.__doc__
    fn.__dict__.update(inner.__dict__)
    fn.__annotations__ = inner.__annotations__
    fn.__module__ = namespace.get("__name__", inner.__module__)
    return staticmethod(fn) if isinstance(value, staticmethod) else fn


def _load(path: Path, lab: str, namespace: dict, parts: list[Part]) -> types.ModuleType:
    """Run a student's file in a copy of the engine module's namespace in which the lab's own parts
    are "not written" stubs (the engine's answer is not there to be taken)."""
    for part in parts:
        cls_name, _, name = part.qualname.rpartition(".")
        if cls_name:
            cls = namespace[cls_name]
            setattr(cls, name, _not_written(lab, part.qualname, cls.__dict__.get(name)))
        else:
            namespace[name] = _not_written(lab, part.qualname, namespace.get(name))
    module = types.ModuleType(f"lab_impl_{lab}", namespace.get("__doc__"))
    module.__dict__.update({k: v for k, v in namespace.items() if not k.startswith("__")})
    module.__file__ = str(path)
    sys.modules[module.__name__] = module  # dataclasses, pickling and Triton look a function's module up
    code = compile(path.read_text(encoding="utf-8"), str(path), "exec", dont_inherit=True)
    exec(code, module.__dict__)
    return module


def _written_here(value: object, path: Path) -> bool:
    return _code_file(value) == str(path)


def plug_lab_parts(namespace: dict) -> list[str]:
    """Swap the chosen labs' parts into the engine module whose ``globals()`` this is (its last line
    calls it). Returns the names of the labs swapped (none without ``LAB_IMPL``).

    While the student's file runs, the lab's parts in the module are stubs that raise "not written":
    a part must be written in the file itself (a function taken from elsewhere, the engine's own
    included, is refused). Once plugged, the student's functions read the engine module's names live,
    and a helper the file adds joins the module.

    Raises:
        LabImplError: the chosen file lacks a part, or a part is not a function written in it (the
            message names the file, lab and part).
        Any exception the student's file raises at import, with its own file and line.
    """
    if os.environ.get(LAB_IMPL_ENV, "").strip() in ("", "solution"):
        return []
    filename = namespace["__file__"]
    labs = lab_parts(Path(filename).read_text(encoding="utf-8"), filename)
    swapped = []
    for lab, parts in labs.items():
        path = chosen_file(lab)
        if path is None:
            continue
        before = dict(namespace)
        module = _load(path, lab, namespace, parts)
        classes: dict[str, object] = {}
        for part in parts:
            cls_name, _, name = part.qualname.rpartition(".")
            if not cls_name:
                value = module.__dict__.get(name)
                if not _written_here(value, path):
                    raise LabImplError(f"{path}: lab {lab} needs a function `{name}` written in this file; the file defines none")
                namespace[name] = _rebind(value, namespace)
                continue
            stub = module.__dict__.get(cls_name)
            if not isinstance(stub, type) or stub is namespace[cls_name] or name not in stub.__dict__:
                raise LabImplError(f"{path}: lab {lab} needs `{part.qualname}`: a class `{cls_name}` with a method `{name}`")
            if not _written_here(stub.__dict__[name], path):
                raise LabImplError(f"{path}: lab {lab} needs `{part.qualname}` written in this file, as a method of `{cls_name}`")
            setattr(namespace[cls_name], name, _rebind(stub.__dict__[name], namespace))
            classes[cls_name] = stub
        for cls_name, stub in classes.items():  # helpers the student added to the class
            target = namespace[cls_name]
            for attr, value in stub.__dict__.items():
                if not attr.startswith("__") and not hasattr(target, attr):
                    setattr(target, attr, _rebind(value, namespace))
            module.__dict__[cls_name] = target  # the student's code sees the engine's class by its name
        for key, value in module.__dict__.items():  # the file's own helpers and constants join the module
            if key.startswith("__") or key == "LAB" or isinstance(value, type) or key in {p.qualname for p in parts}:
                continue
            if key not in before or before[key] is not value:
                namespace[key] = _rebind(value, namespace) if _written_here(value, path) else value
        swapped.append(lab)
    return swapped


def plug_module(module: types.ModuleType) -> list[str]:
    """:func:`plug_lab_parts` for a module that cannot import this one (the Triton kernels); its
    user calls it once it has imported the module."""
    if getattr(module, "_lab_parts_plugged", False):
        return []
    module._lab_parts_plugged = True
    return plug_lab_parts(module.__dict__)


def lab_modules(root: Path = REPO) -> dict[str, Path]:
    """Every lab with solution regions under ``root``'s ``engine`` and ``paged_kernels`` -> its module's file."""
    found: dict[str, Path] = {}
    for package in ("engine", "paged_kernels"):
        for path in sorted((root / package).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            if "# BEGIN SOLUTION" not in text or path == Path(__file__).resolve():  # this docstring's example
                continue
            for lab in lab_parts(text, str(path)):
                if lab in found:
                    raise LabImplError(f"lab {lab} has parts in {found[lab]} and {path}; a lab's parts sit in one module")
                found[lab] = path
    return found


def hung_part(frame: types.FrameType | None) -> dict:
    """Where a stopped step was, for a student: the innermost frame in a lab file (one with a
    ``LAB = "..."`` line), else the innermost frame. Returns ``{"lab", "file", "line", "code"}``
    (``lab`` None when no lab file was running)."""
    frames = []
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    for candidate in frames:  # innermost first
        try:
            text = Path(candidate.f_code.co_filename).read_text(encoding="utf-8")
        except OSError:
            continue
        found = LAB_LINE.search(text)
        if found:
            lines = text.splitlines()
            line = candidate.f_lineno
            return {"lab": found["lab"], "file": candidate.f_code.co_filename, "line": line,
                    "code": lines[line - 1].strip() if 0 < line <= len(lines) else ""}
    inner = frames[0] if frames else None
    return {"lab": None, "file": inner.f_code.co_filename if inner else None, "line": inner.f_lineno if inner else None, "code": ""}


class StepWatchdog:
    """Stops a step of a student's parts that runs past ``timeout_s`` seconds (an endless loop), saying
    which lab's part was running, with its file and line (:func:`hung_part`).

    ``with watchdog.step(n): ...`` arms it for one step of the calling thread; when it fires it calls
    ``on_hang(step, seconds, cause)`` from its own thread, which must end the process (``os._exit``):
    a Python thread cannot be stopped from outside. ``timeout_s`` None: never fires.
    """

    def __init__(self, timeout_s: float | None, on_hang):
        self.timeout_s, self.on_hang = timeout_s, on_hang

    def step(self, number: int):
        import contextlib
        import threading

        if self.timeout_s is None:
            return contextlib.nullcontext()
        watched = threading.get_ident()

        def fire() -> None:
            self.on_hang(number, self.timeout_s, hung_part(sys._current_frames().get(watched)))

        @contextlib.contextmanager
        def armed():
            timer = threading.Timer(self.timeout_s, fire)
            timer.daemon = True
            timer.start()
            try:
                yield
            finally:
                timer.cancel()

        return armed()
