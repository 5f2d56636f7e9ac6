"""Print (or refresh) the gateway configuration table from ``dtq_gateway.settings``.

Usage:
    python scripts/gen_config_doc.py            # print the markdown table
    python scripts/gen_config_doc.py --write    # replace the table in README.md and
                                                # docs/configuration.md
    python scripts/gen_config_doc.py --check    # exit 1 when a copy is stale

The table is built from ``dataclasses.fields(Settings)``: the help text in each
field's metadata, the environment variable, the command-line flag and the
default. In the documents it sits between the markers ``<!-- config-table:start -->``
and ``<!-- config-table:end -->``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dtq_gateway.settings import Settings, env_name

START, END = "<!-- config-table:start -->", "<!-- config-table:end -->"
DOCUMENTS = (ROOT / "README.md", ROOT / "docs" / "configuration.md")


def _default(f: dataclasses.Field) -> str:
    value = f.default
    if value == "" or value is None:
        return "(empty)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def table() -> str:
    """The markdown table: one row per Settings field, in declaration order."""
    rows = ["| Environment variable | Flag | Default | Meaning |",
            "|---|---|---|---|"]
    for f in dataclasses.fields(Settings):
        help_ = f.metadata.get("help", "")
        if f.metadata.get("secret"):
            help_ += " Secret: shown as `***` in logs."
        flag = "--" + f.name.replace("_", "-")
        rows.append(f"| `{env_name(f.name)}` | `{flag}` | {_default(f)} | {_cell(help_)} |")
    return "\n".join(rows) + "\n"


def splice(document: str, new_table: str) -> str:
    """Replace the text between the markers of ``document`` with ``new_table``.

    Raises:
        ValueError: The markers are missing or out of order.
    """
    start, end = document.find(START), document.find(END)
    if start < 0 or end < start:
        raise ValueError(f"markers {START} / {END} not found")
    return document[:start + len(START)] + "\n" + new_table + document[end:]


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="update the documents in place")
    mode.add_argument("--check", action="store_true", help="exit 1 when a document is stale")
    args = parser.parse_args(argv)
    current = table()
    if not (args.write or args.check):
        sys.stdout.write(current)
        return 0
    stale = []
    for path in DOCUMENTS:
        text = path.read_text()
        fresh = splice(text, current)
        if fresh != text:
            stale.append(str(path.relative_to(ROOT)))
            if args.write:
                path.write_text(fresh)
    if args.check and stale:
        print(f"stale configuration table in {', '.join(stale)}: "
              "run python scripts/gen_config_doc.py --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
