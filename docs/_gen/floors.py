"""The drawing of ddlaunch's floors: the layers contract of ``pyproject.toml`` (top: may
import what is below it) as bands, each top-level module of the package a box coloured by the
place its code runs in, and every import between two of them (grimp's graph, the one
``lint-imports`` checks) an arrow.

    python docs/_gen/floors.py          # writes docs/explanation/floors.svg
    python docs/_gen/floors.py --check  # exit 1 when the checked-in drawing is out of date

``tests/test_docs_site.py`` runs the check, so an import or a contract that changes the
picture fails CI until the drawing is regenerated. The output is deterministic: same code,
same bytes.
"""

from __future__ import annotations

import argparse
import html
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "docs" / "explanation" / "floors.svg"
PACKAGE = "ddlaunch"

# Where each top-level module's code runs (docs/explanation/architecture.md, "The four
# places"); a module not named here is shared by them. The colours are the legend's.
PLACES = {
    "login node": ("#dbeafe", ("entry", "cli", "api", "sweeps", "app")),
    "batch host": ("#fde68a", ("job",)),
    "ranks": ("#fecaca", ("examples", "train", "worker")),
    "compute-node probes": ("#bbf7d0", ("health",)),
    "shared": ("#e5e7eb", ()),
}

WIDTH, ROW, BOX_H, MARGIN, LEGEND = 960, 64, 34, 24, 40


@dataclass(frozen=True)
class Box:
    name: str
    x: float
    y: float
    w: float
    place: str

    @property
    def top(self) -> tuple[float, float]:
        return (self.x + self.w / 2, self.y)

    @property
    def bottom(self) -> tuple[float, float]:
        return (self.x + self.w / 2, self.y + BOX_H)


def layers() -> list[list[str]]:
    """The layers contract's rows, top first; siblings (``a : b``, ``a | b``) share a row."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c["type"] == "layers"]
    rows = []
    for layer in contract["layers"]:
        names = layer.replace(":", "|").split("|")
        rows.append([n.strip() for n in names if n.strip()])
    return rows


def place_of(name: str) -> str:
    for place, (_, names) in PLACES.items():
        if name in names:
            return place
    return "shared"


def imports_between(names: Sequence[str]) -> set[tuple[str, str]]:
    """(importer, imported) for every import between two different top-level modules."""
    import grimp

    graph = grimp.build_graph(PACKAGE, cache_dir=None)
    known = set(names)
    edges = set()
    for module in graph.modules:
        parts = module.split(".")
        if parts[0] != PACKAGE or len(parts) < 2 or parts[1] not in known:
            continue
        for imported in graph.find_modules_directly_imported_by(module):
            other = imported.split(".")
            inside = other[0] == PACKAGE and len(other) > 1 and other[1] in known
            if inside and other[1] != parts[1]:
                edges.add((parts[1], other[1]))
    return edges


# Rows of one module step across these fractions of the width, so that the arrows between
# far-apart floors do not all run through the boxes between them.
_STAGGER = (0.5, 0.22, 0.78, 0.36, 0.64)


def boxes(rows: list[list[str]]) -> dict[str, Box]:
    out = {}
    usable = WIDTH - 2 * MARGIN
    singles = 0
    for r, row in enumerate(rows):
        w = min(170.0, (usable - 16 * (len(row) - 1)) / len(row))
        span = w * len(row) + 16 * (len(row) - 1)
        x0 = MARGIN + (usable - span) / 2
        if len(row) == 1:
            x0 = MARGIN + usable * _STAGGER[singles % len(_STAGGER)] - w / 2
            singles += 1
        for i, name in enumerate(row):
            x = x0 + i * (w + 16)
            out[name] = Box(name, x, LEGEND + MARGIN + r * ROW, w, place_of(name))
    return out


def render_svg() -> str:
    rows = layers()
    placed = boxes(rows)
    edges = sorted(imports_between(list(placed)))
    height = LEGEND + 2 * MARGIN + len(rows) * ROW
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="13">',
        "<title>ddlaunch's floors: a module imports only modules drawn below it</title>",
        '<defs><marker id="a" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="6" '
        'markerHeight="6" orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#6b7280"/>'
        "</marker></defs>",
        f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
    ]
    x = MARGIN
    for place, (colour, _) in PLACES.items():
        out.append(
            f'<rect x="{x}" y="{MARGIN - 14}" width="18" height="14" fill="{colour}" '
            'stroke="#374151"/>'
        )
        out.append(f'<text x="{x + 24}" y="{MARGIN - 2}">{html.escape(place)}</text>')
        x += 30 + 9 * len(place) + 24
    for importer, imported in edges:
        (x1, y1), (x2, y2) = placed[importer].bottom, placed[imported].top
        bend = (y2 - y1) / 2
        out.append(
            f'<path d="M{x1:.1f},{y1:.1f} C{x1:.1f},{y1 + bend:.1f} {x2:.1f},{y2 - bend:.1f} '
            f'{x2:.1f},{y2:.1f}" fill="none" stroke="#6b7280" stroke-opacity="0.45" '
            'stroke-width="1" marker-end="url(#a)"/>'
        )
    for box in placed.values():
        colour = PLACES[box.place][0]
        out.append(
            f'<rect x="{box.x:.1f}" y="{box.y:.1f}" width="{box.w:.1f}" height="{BOX_H}" '
            f'rx="5" fill="{colour}" stroke="#374151"/>'
        )
        out.append(
            f'<text x="{box.x + box.w / 2:.1f}" y="{box.y + BOX_H / 2 + 5:.1f}" '
            f'text-anchor="middle">{html.escape(box.name)}</text>'
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    drawn = render_svg()
    if args.check:
        if not OUT.exists() or OUT.read_text() != drawn:
            print(f"{OUT.relative_to(REPO)} is out of date: python docs/_gen/floors.py")
            return 1
        return 0
    OUT.write_text(drawn)
    print(OUT.relative_to(REPO))
    return 0


if __name__ == "__main__":
    sys.exit(main())
