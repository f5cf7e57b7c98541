"""Keep the README and the pages under docs/ true: short front page, links that lead
somewhere, and commands, scripts and modules that exist."""

from __future__ import annotations

import ast
import configparser
import importlib
import importlib.util
import re
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
INDEX = DOCS / "index.md"
PICTURE = DOCS / "images" / "timeline.png"

#: What the venv gets from its packages rather than from this project's console scripts.
VENV_BINARIES = frozenset({"spark-submit", "airflow", "pytest", "ruff", "python", "pip"})

FENCE = re.compile(r"^(```|~~~)(.*)$")
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")
INLINE_CODE = re.compile(r"`[^`]*`")
SCRIPT = re.compile(r"(?<![\w./-])scripts/([\w.-]+)")
VENV_BIN = re.compile(r"(?<![\w./-])\.venv/bin/([\w.-]+)")
PYTHON_M = re.compile(r"\bpython3? -m ([A-Za-z_][\w.]*)")
LIST_ITEM = re.compile(r"^\s*([-*+]|\d+[.)])\s")


def pages() -> list[Path]:
    """The README and every page under docs/."""
    return [README, *sorted(DOCS.glob("*.md"))]


def docs_pages() -> list[Path]:
    """The pages under docs/, the index aside."""
    return [page for page in sorted(DOCS.glob("*.md")) if page != INDEX]


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def code_blocks(text: str) -> list[tuple[str, list[str]]]:
    """Fenced blocks (with their info string) and indented blocks (info ""), in order.

    An indented run counts as code only after a blank line that does not continue a list
    item, as Markdown reads it.
    """
    blocks: list[tuple[str, list[str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence:
            body = []
            i += 1
            while i < len(lines) and not lines[i].startswith(fence.group(1)):
                body.append(lines[i])
                i += 1
            blocks.append((fence.group(2).strip(), body))
            i += 1
            continue
        if lines[i].startswith("    ") and i > 0 and not lines[i - 1].strip():
            before = next((line for line in reversed(lines[: i - 1]) if line.strip()), "")
            if not (before.startswith((" ", "\t")) or LIST_ITEM.match(before)):
                body = []
                while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                    body.append(lines[i][4:])
                    i += 1
                blocks.append(("", [line for line in body if line.strip()]))
                continue
        i += 1
    return blocks


def prose(text: str) -> str:
    """The text outside fenced blocks and inline code, where links are links."""
    kept, fence = [], None
    for line in text.splitlines():
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)
        elif fence is not None and line.startswith(fence):
            fence = None
        elif fence is None:
            kept.append(line)
    return INLINE_CODE.sub("", "\n".join(kept))


def links(page: Path) -> list[tuple[bool, str]]:
    """(is an image, target) of every relative link on the page."""
    return [
        (bang == "!", target)
        for bang, _, target in LINK.findall(prose(page.read_text(encoding="utf-8")))
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target)
    ]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = INLINE_CODE.sub(lambda code: code.group(0).strip("`"), heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {
        slug(line.lstrip("#"))
        for line in prose(page.read_text(encoding="utf-8")).splitlines()
        if re.match(r"^#{1,6} ", line)
    }


def console_scripts() -> set[str]:
    """The commands setup.cfg declares, which the install puts in .venv/bin."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg", encoding="utf-8")
    entries = config["options.entry_points"]["console_scripts"]
    return {line.split("=")[0].strip() for line in entries.splitlines() if "=" in line}


def test_the_readme_is_a_front_page() -> None:
    """The details live under docs/; the README only has to get a reader started."""
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 160, f"README.md has {len(lines)} lines; move details to docs/"


def test_the_readme_starts_with_the_demo_and_the_test_commands() -> None:
    """CI (.ci/run) and new readers both rely on these two commands coming first."""
    commands = [
        line.split("#")[0].split()[0]
        for _, body in code_blocks(README.read_text(encoding="utf-8"))
        for line in body
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert commands[:2] == ["scripts/demo", "scripts/test"]


def test_the_front_page_picture_exists() -> None:
    """The README shows it first; it comes from scripts/demo's timeline chart."""
    assert any(
        is_image and (README.parent / target).resolve() == PICTURE
        for is_image, target in links(README)
    ), "the README must show docs/images/timeline.png"
    assert PICTURE.is_file(), f"{rel(PICTURE)} is missing: add the demo's timeline chart"


@pytest.mark.parametrize("page", pages(), ids=rel)
def test_relative_links_lead_to_existing_files_and_headings(page: Path) -> None:
    """A page moved or a heading renamed must not leave dead links behind."""
    broken = []
    for is_image, target in links(page):
        if is_image:
            continue  # images are checked by their own tests
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no such heading in {rel(file)}")
    assert not broken, f"{rel(page)}: " + "; ".join(broken)


def test_every_docs_page_is_listed_in_the_index() -> None:
    """A page nobody links to is a page nobody finds."""
    listed = {(DOCS / target.partition("#")[0]).resolve() for _, target in links(INDEX)}
    missing = [rel(page) for page in docs_pages() if page.resolve() not in listed]
    assert not missing, f"docs/index.md does not link to {missing}"


@pytest.mark.parametrize("page", docs_pages(), ids=rel)
def test_every_docs_page_has_a_title_and_links_back_to_the_index(page: Path) -> None:
    """Each page is read on its own (GitHub, an editor): it names itself and leads home."""
    text = prose(page.read_text(encoding="utf-8"))
    assert text.startswith("# "), f"{rel(page)} must start with a '# Title'"
    titles = [line for line in text.splitlines() if line.startswith("# ")]
    assert len(titles) == 1, f"{rel(page)}: headings inside a page use ##, got {titles}"
    assert any(
        (page.parent / target.partition("#")[0]).resolve() == INDEX for _, target in links(page)
    ), f"{rel(page)} does not link back to index.md"


@pytest.mark.parametrize("page", pages(), ids=rel)
def test_scripts_and_venv_commands_exist(page: Path) -> None:
    """A command the docs tell readers to run must be there to run."""
    text = page.read_text(encoding="utf-8")
    known = console_scripts() | VENV_BINARIES
    missing = [f"scripts/{name}" for name in SCRIPT.findall(text)]
    missing = [name for name in missing if not (ROOT / name).is_file()]
    missing += [f".venv/bin/{name}" for name in VENV_BIN.findall(text) if name not in known]
    assert not missing, f"{rel(page)} names commands that do not exist: {sorted(set(missing))}"


def module_exists(name: str) -> bool:
    """A module of this repository (as a file), or one the venv can import."""
    path = ROOT.joinpath(*name.split("."))
    if path.with_suffix(".py").is_file() or (path / "__init__.py").is_file():
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


@pytest.mark.parametrize("page", pages(), ids=rel)
def test_python_m_modules_exist(page: Path) -> None:
    """`python -m x.y` fails at once if x.y was renamed; the docs must follow."""
    names = PYTHON_M.findall(page.read_text(encoding="utf-8"))
    missing = [name.rstrip(".") for name in names if not module_exists(name.rstrip("."))]
    assert not missing, f"{rel(page)} runs modules that do not exist: {missing}"


@pytest.mark.parametrize("page", pages(), ids=rel)
def test_python_examples_import_what_exists(page: Path) -> None:
    """Examples are copied into real jobs and DAGs: every name they import must exist."""
    missing = []
    for info, body in code_blocks(page.read_text(encoding="utf-8")):
        if info != "python":
            continue
        for node in ast.walk(ast.parse("\n".join(body))):
            if isinstance(node, ast.ImportFrom) and node.module:
                try:
                    module = importlib.import_module(node.module)
                except ImportError:
                    missing.append(node.module)
                    continue
                missing += [
                    f"{node.module}.{alias.name}"
                    for alias in node.names
                    if not hasattr(module, alias.name)
                ]
            elif isinstance(node, ast.Import):
                missing += [alias.name for alias in node.names if not module_exists(alias.name)]
    assert not missing, f"{rel(page)} imports what does not exist: {missing}"


def test_the_front_page_dag_builds(tmp_path: Path) -> None:
    """The README's DAG is the first thing a user copies: it must build as Airflow builds
    it from a file, with its profile validated and the job's entry file found."""
    (dag_code,) = [
        "\n".join(body)
        for info, body in code_blocks(README.read_text(encoding="utf-8"))
        if info == "python" and "with DAG(" in "\n".join(body)
    ]
    dag_file = tmp_path / "readme_dag.py"
    dag_file.write_text(dag_code, encoding="utf-8")
    namespace = runpy.run_path(str(dag_file))
    launch, live = namespace["launch"], namespace["live"]
    assert launch.dag.task_ids == [launch.task_id, live.task_id]
    assert Path(launch.application).is_file()
    assert live.upstream_task_ids == {launch.task_id}
