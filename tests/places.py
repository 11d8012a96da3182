"""Where the prose says things are (issue 37): the file paths, dotted module names and ``Class.member``
names that ``README.md``, ``docs/*.md`` and the docstrings and comments of ``app.py``, ``pipeline/``,
``bench/`` and ``tools/`` mention, and whether the repository still has each one there.

A mention is resolved the way a reader would look for it:

- ``path.py``: a file of the repository. One with a folder is found from the root, from ``pipeline/``
  or from the mentioning file's folder, or as the tail of a repository path (``hosting/runner.py``);
  a bare file name (``line.py``) is a file of that name anywhere in the repository.
- ``a.b.c``: its longest head that is the tail of a module's dotted name (``pipeline.serving.scheduler``,
  ``serving.scheduler`` or ``scheduler``; ``engine.runner`` is none) names the module; the rest is a name at the
  module's top level (defined or imported there), then members of that class. ``web/handler.x`` reads
  as ``web.handler.x``. ``Class.member``: a class of that name anywhere in the repository (by AST), and
  on it or on a base class the repository defines a method, property, nested class, class-level field
  or ``self.<member>``.
- ```Name`` (``path.py``)`` (and ``Name (path.py)`` for a class-like name, and in a docs code block
  ``path.py (Name, Other: ...)``): the file defines ``Name``, not only imports it, wherever a
  repository definition of that name exists at all (``torch.compile`` (``speedups.py``) says where it
  is used).

A dotted name is the repository's when its first part is one of its module or package names or a
capitalised (class-like) name; ``job.steps``, ``torch.cuda`` or ``gr.Blocks`` are not. A mention that
looks like the repository's but is someone else's (asyncio's ``loop`` variable against
``pipeline/engine/loop``, diffusers' ``DiffusionPipeline``) is excused by ``EXTERNAL``, one prefix and
its reason at a time, and only when the repository does not resolve it.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent

# What looks like the repository's but is not: a prefix (``a.b`` covers ``a.b`` and ``a.b.c``; a path
# prefix ends in ``/``), and whose it is.
EXTERNAL: dict[str, str] = {
    # Variables whose names are also module names here.
    "loop.call_soon_threadsafe": "asyncio's event loop (a variable), not pipeline/engine/loop",
    "loop.run_in_executor": "asyncio's event loop (a variable), not pipeline/engine/loop",
    "adapter.run": "an adapter object's run (the Adapter protocol's), not pipeline/ray/adapter.py",
    "app.tokens": "Gradio's App (the FastAPI app Gradio builds), not app.py",
    "site.results": "a Site's results (the variable site), not a name of pipeline/web/page/site.py",
    "base.config": "the base scheduler's config (a variable) in docs/design.md, not pipeline/serving/base.py",
    "scheduler.step": "a diffusers scheduler's step (a variable), not pipeline/serving/scheduler.py",
    "Class": "a placeholder, any scheduler class (Class.from_config) in docs/design.md",
    "helpers.special_args": "gradio.helpers, not tests/helpers.py",
    # Other libraries' classes.
    "Block": "gradio.blocks.Block",
    "ModularPipeline": "diffusers.ModularPipeline (its from_pretrained), not the app's modular.py",
    "Component": "gradio.components.Component",
    "GradioMCPServer": "gradio.mcp.GradioMCPServer",
    "LocalContext": "gradio.context.LocalContext",
    "Queue": "gradio.queueing.Queue",
    "Job": "gradio_client.Job",
    "DiffusionPipeline": "diffusers.DiffusionPipeline",
    "AutoPipelineForImage2Image": "diffusers.AutoPipelineForImage2Image",
    "AutoPipelineForInpainting": "diffusers.AutoPipelineForInpainting",
    "Image": "PIL.Image (Pillow), not a name of this repository",
    "StableDiffusionPipeline": "diffusers.StableDiffusionPipeline",
    "ControlNetModel": "diffusers.ControlNetModel",
    "StableDiffusionControlNetPipeline": "diffusers.StableDiffusionControlNetPipeline",
    "StableDiffusionImg2ImgPipeline": "diffusers.StableDiffusionImg2ImgPipeline",
    "DDIMScheduler": "diffusers.DDIMScheduler",
    "DeploymentHandle": "ray.serve.handle.DeploymentHandle",
    "DeploymentResponseGenerator": "ray.serve.handle.DeploymentResponseGenerator",
    "Module": "torch.nn.Module",
    "PngInfo": "PIL.PngImagePlugin.PngInfo",
    # Other places' files.
    "gradio/": "Gradio's own source files",
    "/tmp/": "scratch scripts of past measurements (the performance history), never in the repository",
}

# ``results.json`` or ``config.json`` is a file, not the attribute ``json`` of a module.
FILE_SUFFIXES = {
    "md", "json", "txt", "png", "jpg", "jpeg", "webp", "gif", "svg", "safetensors", "sh", "toml", "yaml",
    "yml", "html", "js", "css", "log", "pyi", "cfg", "ini", "bin", "pt", "gz", "csv", "lock", "whl", "zip",
}  # fmt: skip

_FILE = r"(?:/|\.\.?/)?(?:[\w.-]+/)*[\w-]+\.py"
PATH = re.compile(rf"(?<![\w./-])({_FILE})(?![\w-])")
DOTTED = re.compile(r"(?<![\w./-])(?>((?:[A-Za-z_]\w*/)*[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+))(?![\w/-])")
# ``Name`` (``path.py``), and ``Name (path.py)`` for a class-like name: the name, then its file.
PAIR = re.compile(rf"(`+)([A-Za-z_][\w.]*)(?:\(\))?\1 \((`+)({_FILE})\3[),;:]")
BARE_PAIR = re.compile(rf"(?<![\w.`])([A-Z]\w*[a-z]\w*(?:\.\w+)*) \(({_FILE})[),;:]")
# In a docs code block: ``path.py (Name, Other: what they are)``, one level of nested parentheses.
LISTED = re.compile(rf"(?<![\w./-])({_FILE}) \(([^()]*(?:\([^()]*\)[^()]*)*)\)")
URL = re.compile(r"https?://\S+")


@dataclass(frozen=True)
class Mention:
    source: str  # the mentioning file, relative to the root
    line: int
    kind: str  # "path", "name" or "pair"
    name: str
    where: str = ""  # a pair's file

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: " + (f"{self.name} in {self.where}" if self.where else self.name)


def _docstrings(tree: ast.Module) -> Iterator[ast.Constant]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                yield first.value


def prose(project: Project) -> Iterator[tuple[Path, int, str]]:
    """Every text that names places: each doc whole, each docstring and each comment (its file, first
    line and text)."""
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        yield doc, 1, doc.read_text()
    for file, tree in project.trees.items():
        if file == "app.py" or file.startswith(("pipeline/", "bench/", "tools/")):
            for doc in _docstrings(tree):
                yield ROOT / file, doc.lineno, doc.value
            for token in tokenize.generate_tokens(io.StringIO(project.sources[file]).readline):
                if token.type == tokenize.COMMENT:
                    yield ROOT / file, token.start[0], token.string


def _blank(pattern: re.Pattern[str], text: str) -> str:
    return pattern.sub(lambda m: " " * len(m.group()), text)


def mentions_in(path: Path, first_line: int, text: str) -> Iterator[Mention]:
    source = path.relative_to(ROOT).as_posix()
    text = _blank(URL, text)

    def line(offset: int) -> int:
        return first_line + text.count("\n", 0, offset)

    for m in PAIR.finditer(text):
        yield Mention(source, line(m.start()), "pair", m.group(2), m.group(4))
    for m in BARE_PAIR.finditer(text):
        yield Mention(source, line(m.start()), "pair", m.group(1), m.group(2))
    if path.suffix == ".md":
        for block in re.finditer(r"```.*?```", text, flags=re.S):
            for m in LISTED.finditer(block.group()):
                listed = re.sub(r"\([^()]*\)", "", m.group(2))  # RayAdapter(AdapterBase): a base, not a resident
                for name in re.findall(r"\b[A-Z]\w*[a-z]\w*\b", listed):
                    yield Mention(source, line(block.start() + m.start()), "pair", name, m.group(1))
    for m in PATH.finditer(text):
        yield Mention(source, line(m.start()), "path", m.group(1))
    for m in DOTTED.finditer(_blank(PATH, text)):
        if m.group(1).rsplit(".", 1)[1] not in FILE_SUFFIXES:
            yield Mention(source, line(m.start()), "name", m.group(1).replace("/", "."))


@dataclass
class Scope:
    """The names a module or a class has (each with the node that makes it) and a class's bases."""

    names: dict[str, ast.AST] = field(default_factory=dict)
    bases: list[str] = field(default_factory=list)


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return node.targets
    return [node.target] if isinstance(node, ast.AnnAssign | ast.AugAssign) else []


def _names(target: ast.expr) -> Iterator[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, ast.Tuple | ast.List):
        for element in target.elts:
            yield from _names(element)


def _class_scope(node: ast.ClassDef) -> Scope:
    bases = [b.value if isinstance(b, ast.Subscript) else b for b in node.bases]  # WaitLine[Entry]
    scope = Scope(bases=[b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in bases])
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            scope.names[item.name] = item
        for target in _targets(item):
            scope.names.update(dict.fromkeys(_names(target), item))
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):  # self.<member> = ...
            for inner in ast.walk(item):
                for target in _targets(inner):
                    if isinstance(target, ast.Attribute) and getattr(target.value, "id", "") == "self":
                        scope.names.setdefault(target.attr, inner)
    return scope


def _module_scope(tree: ast.Module) -> Scope:
    scope = Scope()
    body = list(tree.body)
    for node in tree.body:  # if TYPE_CHECKING: ..., try: ... except ImportError: ...
        if isinstance(node, ast.If | ast.Try):
            body += node.body + node.orelse + [s for h in getattr(node, "handlers", []) for s in h.body]
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            scope.names[node.name] = node
        for target in _targets(node):
            scope.names.update(dict.fromkeys(_names(target), node))
        if isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                scope.names.setdefault((alias.asname or alias.name).split(".")[0], node)
    return scope


def _module_name(file: str) -> tuple[str, ...]:
    parts = tuple(file.removesuffix(".py").split("/"))
    return parts[:-1] if parts[-1] == "__init__" else parts


class Project:
    """The repository's Python files, read and parsed once: its modules, their names and its classes."""

    def __init__(self) -> None:
        self.files = sorted(
            rel
            for p in ROOT.rglob("*.py")
            if not any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(ROOT).parts)
            # tests/stubs/ stands in for other packages (``spaces``): not the repository's modules
            if not (rel := p.relative_to(ROOT).as_posix()).startswith("tests/stubs/")
        )
        self.sources = {file: (ROOT / file).read_text() for file in self.files}
        self.trees = {file: ast.parse(source) for file, source in self.sources.items()}
        self.modules = {_module_name(file): _module_scope(tree) for file, tree in self.trees.items()}
        self.parts = {part for name in self.modules for part in name}
        self.classes: dict[str, list[ast.ClassDef]] = {}
        self.home: dict[int, str] = {}  # a class's file
        self.defined: dict[str, set[str]] = {}  # file -> the classes and functions it defines, at any depth
        for file, tree in self.trees.items():
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    self.classes.setdefault(node.name, []).append(node)
                    self.home[id(node)] = file
                if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                    self.defined.setdefault(file, set()).add(node.name)
        self.everywhere = {name for names in self.defined.values() for name in names}
        self.everywhere |= {
            name
            for scope in self.modules.values()
            for name, node in scope.names.items()
            if not isinstance(node, ast.Import | ast.ImportFrom)
        }
        self._scopes: dict[int, Scope] = {}

    def class_scope(self, node: ast.ClassDef) -> Scope:
        if id(node) not in self._scopes:
            self._scopes[id(node)] = _class_scope(node)
        return self._scopes[id(node)]

    def paths(self, path: str, source: str) -> list[str]:
        """The repository files ``path``, mentioned in ``source``, can mean."""
        if "/" not in path:
            return [f for f in self.files if f.rsplit("/", 1)[-1] == path]
        for base in ("", "pipeline/", str(Path(source).parent) + "/"):
            if (candidate := Path(base + path).as_posix()) in self.sources:
                return [candidate]
        return [f for f in self.files if f.endswith("/" + path.lstrip("./"))]

    def is_ours(self, name: str) -> bool:
        head = name.split(".")[0]
        return head in self.parts or (head[0].isupper() and any(c.islower() for c in head))

    def resolves(self, name: str) -> bool:
        parts = name.split(".")
        for module, scope in self.modules.items():
            for k in range(min(len(parts), len(module)), 0, -1):
                if tuple(parts[:k]) == module[-k:] and self._has(scope, parts[k:]):
                    return True
        return any(self._has(self.class_scope(node), parts[1:]) for node in self.classes.get(parts[0], []))

    def defines(self, file: str, name: str) -> bool:
        """``file`` defines ``name`` (``Class.member`` too): a class or function at any depth, or a
        top-level assignment; an import is not a definition."""
        head, *rest = name.split(".")
        if any(self._has(self.class_scope(c), rest) for c in self.classes.get(head, []) if self.home[id(c)] == file):
            return True
        top = self.modules[_module_name(file)].names.get(head)
        own = top is not None and not isinstance(top, ast.Import | ast.ImportFrom | ast.ClassDef)
        return not rest and (own or head in self.defined.get(file, set()))

    def has_definition(self, name: str) -> bool:
        """Whether the repository defines ``name``'s first part anywhere (else a pair names where
        someone else's name is used)."""
        return name.split(".")[0] in self.everywhere

    def _has(self, scope: Scope, rest: list[str], seen: frozenset[int] = frozenset()) -> bool:
        if not rest:
            return True
        node = scope.names.get(rest[0])
        if isinstance(node, ast.ClassDef):
            return self._has(self.class_scope(node), rest[1:])
        if node is not None:
            return True  # a function or a value: what it holds is not written down
        seen |= {id(scope)}
        return any(
            self._has(base, rest, seen)
            for name in scope.bases
            for base in map(self.class_scope, self.classes.get(name, []))
            if id(base) not in seen
        )


def external(name: str) -> str | None:
    """The ``EXTERNAL`` prefix ``name`` falls under, if any."""
    for prefix in EXTERNAL:
        if name == prefix or name.startswith(prefix if prefix.endswith("/") else prefix + "."):
            return prefix
    return None


def stale(found: Iterator[Mention] | list[Mention], project: Project, excused: set[str] | None = None) -> list[str]:
    """Each mention in ``found`` that names no place of the repository, with why. ``excused`` collects the
    ``EXTERNAL`` prefixes that excused one."""
    bad: list[str] = []
    for mention in found:
        if mention.kind == "path":
            ok, why = bool(project.paths(mention.name, mention.source)), "no such file"
        elif mention.kind == "pair":
            files = project.paths(mention.where, mention.source)
            ok = not files or not project.has_definition(mention.name)
            ok = ok or any(project.defines(f, mention.name) for f in files)
            why = "not defined there"
        else:
            ok = not project.is_ours(mention.name) or project.resolves(mention.name)
            why = "no such module, name or member"
        if not ok and (prefix := external(mention.name)):
            ok = True
            if excused is not None:
                excused.add(prefix)
        if not ok:
            bad.append(f"{mention} ({why})")
    return bad
