"""MkDocs hooks: the pages that are generated from the code at build time.

- ``architecture.md``: the marker ``<!-- generated: modules -->`` becomes a table of every product module,
  its docstring's first sentence and the product modules it imports (read with ``ast``, nothing imported).
- ``cli.md``: the marker ``<!-- generated: cli -->`` becomes the CLI reference, from the Typer app itself.
- ``clusters.md``: ``cluster/README.md`` (shipped in the wheel beside the recipes) as a page of the site.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from mkdocs.structure.files import File

REPO = Path(__file__).resolve().parents[1]
FOLDERS = ("orchestrator", "trials", "results", "cluster")


def _first_sentence(docstring: str | None) -> str:
    text = " ".join((docstring or "").split())
    sentence = re.split(r"(?<=\.)\s", text, maxsplit=1)[0]
    if len(sentence) > 180:
        sentence = sentence[:180].rsplit(" ", 1)[0] + " …"
    return sentence.replace("|", "\\|")


def _module_rows() -> list[str]:
    modules = {}
    for folder in FOLDERS:
        for path in sorted((REPO / folder).glob("*.py")):
            name = f"freezesweep.{folder}" + ("" if path.stem == "__init__" else f".{path.stem}")
            modules[name] = ast.parse(path.read_text(), str(path))
    rows = ["| module | what it is | product modules it imports |", "| --- | --- | --- |"]
    for name, tree in modules.items():
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("freezesweep."):
                subs = {f"{node.module}.{alias.name}" for alias in node.names} & modules.keys()
                imported |= subs or {node.module}
            elif isinstance(node, ast.Import):
                imported |= {a.name for a in node.names if a.name.startswith("freezesweep.")}
        uses = ", ".join(f"`{m.removeprefix('freezesweep.')}`" for m in sorted(imported - {name})) or "—"
        rows.append(f"| `{name}` | {_first_sentence(ast.get_docstring(tree))} | {uses} |")
    return rows


def _cli_reference() -> str:
    import typer
    from typer.cli import get_docs_for_click

    from freezesweep.orchestrator.cli import app

    command = typer.main.get_command(app)
    docs = get_docs_for_click(obj=command, ctx=typer.Context(command), name="freezesweep")
    return re.sub(r"^(#+) ", r"#\1 ", docs, flags=re.M)  # below the page's own title


def on_files(files, config):
    readme = (REPO / "cluster" / "README.md").read_text()
    files.append(File.generated(config, "clusters.md", content=readme))
    return files


def on_page_markdown(markdown, page, config, files):
    if "<!-- generated: modules -->" in markdown:
        markdown = markdown.replace("<!-- generated: modules -->", "\n".join(_module_rows()))
    if "<!-- generated: cli -->" in markdown:
        markdown = markdown.replace("<!-- generated: cli -->", _cli_reference())
    return markdown
