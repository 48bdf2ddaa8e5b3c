"""The shape of csrc/ (csrc/README.md): folders are layers and includes point down them, no two
modules include each other even indirectly, no file is over 1,000 lines and no folder holds more
than 14 source files, and only python/ includes Python.h."""

import re
from collections import defaultdict
from pathlib import Path

CSRC = Path(__file__).resolve().parent.parent / "csrc"
# lowest first: a file may include headers of its own layer and of the layers before it
LAYERS = ["util", "format", "cpu", "model", "spec", "check", "python"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def sources():
    return sorted(p for p in CSRC.rglob("*") if p.suffix in (".c", ".h"))


def layer_of(path: Path) -> int:
    rel = path.relative_to(CSRC).parts
    if len(rel) == 1:  # specdec.h, the public API: below everything
        return -1
    return LAYERS.index(rel[0])


def module_of(path: Path) -> str:
    """A module is a .c and its .h: csrc/cpu/ops_cpu.[ch] -> cpu/ops_cpu."""
    return str(path.relative_to(CSRC).with_suffix(""))


def includes(path: Path):
    """The csrc headers `path` includes, resolved from csrc/'s root (the CUDA backend's headers,
    ../cuda/..., are outside these layers)."""
    for inc in INCLUDE.findall(path.read_text()):
        if inc.startswith("../"):
            continue
        target = CSRC / inc
        assert target.exists(), f"{path.relative_to(CSRC)} includes {inc!r}, not a csrc path"
        yield target


def test_every_folder_is_a_layer():
    for p in sources():
        rel = p.relative_to(CSRC).parts
        assert len(rel) == 1 or rel[0] in LAYERS, f"{p.relative_to(CSRC)} is in no layer"


def test_includes_point_down_the_layers():
    bad = [f"{p.relative_to(CSRC)} includes {t.relative_to(CSRC)}"
           for p in sources() for t in includes(p) if layer_of(t) > layer_of(p)]
    assert not bad, "includes that point up the layers:\n" + "\n".join(bad)


def test_no_cycle_between_modules():
    graph = defaultdict(set)
    for p in sources():
        for t in includes(p):
            if module_of(t) != module_of(p):
                graph[module_of(p)].add(module_of(t))
    state: dict = {}
    path: list = []

    def visit(m):
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                raise AssertionError("include cycle: " + " -> ".join(path[path.index(n):] + [n]))
            if n not in state:
                visit(n)
        path.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_file_and_folder_sizes():
    long = [f"{p.relative_to(CSRC)}: {n} lines" for p in sources()
            if (n := len(p.read_text().splitlines())) > 1000]
    assert not long, "files over 1,000 lines:\n" + "\n".join(long)
    per_folder = defaultdict(int)
    for p in sources():
        per_folder[p.parent] += 1
    full = [f"{d.relative_to(CSRC)}: {n}" for d, n in per_folder.items() if n > 14]
    assert not full, "folders over 14 source files:\n" + "\n".join(full)


def test_only_python_layer_includes_python_h():
    bad = [str(p.relative_to(CSRC)) for p in sources()
           if "Python.h" in p.read_text() and p.relative_to(CSRC).parts[0] != "python"]
    assert not bad, f"Python.h outside csrc/python/: {bad}"


def test_readme_names_every_folder():
    readme = (CSRC / "README.md").read_text()
    missing = [d for d in LAYERS if f"`{d}/`" not in readme]
    assert not missing, f"csrc/README.md does not describe {missing}"
