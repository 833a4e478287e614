"""What a submission's source does that a lab's part has no need for: the grader flags it for the teacher.

A student's file runs in the same process as the lab's tests (it is a part of the engine), so some
ways around the grader cannot be closed from inside Python: finding the grader's key in memory,
reading another lab's model answer from the engine and keeping it for later, patching pytest. Each
needs one of the constructs below, which :func:`flags` finds in the file's syntax tree. A flag gives
and takes no marks: it is a line in the results for the teacher to read (Gradescope's hidden
visibility), beside the marks the tests gave.

Standard library only.
"""

from __future__ import annotations

import ast

# Modules a lab's part never needs: introspection of the running process, other processes, the grader.
FLAGGED_MODULES = {
    "inspect": "introspection (inspect)",
    "gc": "the garbage collector's list of live objects (gc)",
    "ctypes": "raw memory access (ctypes)",
    "_pytest": "pytest's internals (_pytest)",
    "pytest": "pytest itself",
    "importlib": "importing by name at run time (importlib)",
    "marshal": "loading compiled code (marshal)",
    "pickle": "loading pickled objects (pickle)",
    "subprocess": "other processes (subprocess)",
    "signal": "signals (signal)",
    "multiprocessing": "other processes (multiprocessing)",
    "builtins": "the builtins module",
    "lessons": "the course's own tools (lessons)",
    "labs": "the labs' tests (labs)",
    "traceback": "stack frames (traceback)",
    "linecache": "reading source files (linecache)",
    "shutil": "copying or removing files (shutil)",
    "socket": "the network (socket)",
    "lab_grade_plugin": "the grader's pytest plugin",
    "labkit": "the labs' test helpers (labkit)",
    "conftest": "the tests' conftest",
}
FLAGGED_CALLS = {
    "exec": "exec", "eval": "eval", "compile": "compile", "open": "open (reading or writing a file)",
    "__import__": "__import__", "globals": "globals()", "vars": "vars()", "breakpoint": "breakpoint()",
}
FLAGGED_ATTRIBUTES = {
    "_exit": "os._exit", "kill": "os.kill", "killpg": "os.killpg", "system": "os.system", "popen": "os.popen",
    "fork": "os.fork", "execv": "os.exec*", "execve": "os.exec*", "execvp": "os.exec*", "environ": "os.environ",
    "modules": "sys.modules", "_getframe": "sys._getframe (frames)", "settrace": "sys.settrace",
    "setprofile": "sys.setprofile", "argv": "sys.argv", "stdout": "sys.stdout", "stderr": "sys.stderr",
    "f_back": "frames (f_back)", "f_globals": "frames (f_globals)", "f_locals": "frames (f_locals)",
    "tb_frame": "frames (tb_frame)", "gi_frame": "frames (gi_frame)", "cr_frame": "frames (cr_frame)",
    "__globals__": "a function's globals (__globals__)", "__code__": "code objects (__code__)",
    "__closure__": "closures (__closure__)", "__builtins__": "__builtins__", "__subclasses__": "__subclasses__",
    "__wrapped__": "__wrapped__", "__loader__": "__loader__", "__spec__": "__spec__", "__file__": "__file__",
    "read_text": "reading a file (read_text)", "read_bytes": "reading a file (read_bytes)",
    "write_text": "writing a file (write_text)", "write_bytes": "writing a file (write_bytes)",
}
MODULE_ATTRIBUTES = {"_exit", "kill", "killpg", "system", "popen", "fork", "execv", "execve", "execvp", "environ", "modules",
                     "_getframe", "settrace", "setprofile", "argv", "stdout", "stderr"}
FLAGGED_STRINGS = {
    "/proc": "/proc", "results.json": "results.json", "junit": "a JUnit report", "conftest": "conftest.py",
    "hidden": "the hidden tests", "BEGIN SOLUTION": "a solution marker", "labs/tests": "the labs' tests",
    "engine/": "the engine's source files", "paged_kernels/": "the kernels' source files", ".py": "a Python file's name",
    "LAB_IMPL": "LAB_IMPL", "LAB_ONLY": "LAB_ONLY", "LAB_GRADE": "the grader's pipes",
}


def flags(source: str, lab_module: str | None = None, lab_modules: set[str] = frozenset()) -> list[str]:
    """The constructs in a submission's ``source`` that the teacher should look at, one line each
    with its line number (``"line 3: imports the lab's own engine module engine.core.block_pool"``).

    Args:
        lab_module: the dotted name of the engine module that holds this lab's parts.
        lab_modules: the dotted names of every engine module that holds a lab.

    A file that does not parse is flagged as such (the tests then report its syntax error).
    """
    try:
        tree = ast.parse(source)
    except SyntaxError as error:
        return [f"line {error.lineno}: does not parse ({error.msg})"]
    found: list[str] = []
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}

    def add(node: ast.AST, what: str) -> None:
        line = f"line {getattr(node, 'lineno', '?')}: {what}"
        if line not in found:
            found.append(line)

    def imported(node: ast.AST, name: str) -> None:
        top = name.split(".")[0]
        if name == lab_module:
            add(node, f"imports the lab's own engine module {name}")
        elif name in lab_modules or any(m.startswith(name + ".") for m in lab_modules if name in ("engine", "paged_kernels")):
            add(node, f"imports an engine module that holds labs ({name})")
        elif top in FLAGGED_MODULES:
            add(node, f"imports {FLAGGED_MODULES[top]}")
        elif top.startswith("test_"):
            add(node, f"imports a test module ({name})")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                imported(node, alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported(node, node.module)
            for alias in node.names:
                if node.module in ("os", "sys", "posix") and alias.name in MODULE_ATTRIBUTES:
                    add(node, f"uses {FLAGGED_ATTRIBUTES[alias.name]}")
                if f"{node.module}.{alias.name}" in lab_modules or f"{node.module}.{alias.name}" == lab_module:
                    imported(node, f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FLAGGED_CALLS:
            add(node, f"calls {FLAGGED_CALLS[node.func.id]}")
        elif isinstance(node, ast.Attribute) and node.attr in FLAGGED_ATTRIBUTES:
            if node.attr in MODULE_ATTRIBUTES and not (isinstance(node.value, ast.Name) and node.value.id in ("os", "sys", "posix")):
                continue  # self.fork(...) is the block manager's fork, not os.fork
            add(node, f"uses {FLAGGED_ATTRIBUTES[node.attr]}")
        elif isinstance(node, ast.Name) and node.id in ("__builtins__", "__loader__", "__spec__", "__file__"):
            add(node, f"uses {node.id}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            for needle, what in FLAGGED_STRINGS.items():
                if needle in node.value:
                    add(node, f"names {what} in a string")
    return found


def new_flags(source: str, starter: str, lab_module: str | None = None, lab_modules: set[str] = frozenset()) -> list[str]:
    """:func:`flags` of a submission less what its lab's starter already does (the engine module's
    own imports, say)."""
    given = {line.split(": ", 1)[1] for line in flags(starter, lab_module, lab_modules)}
    return [line for line in flags(source, lab_module, lab_modules) if line.split(": ", 1)[1] not in given]
