"""Small trees for tests: the bundled examples' folder, and a writer of a tree from sources."""

from __future__ import annotations

from pathlib import Path

from kvtrace.rules.samples import SHARED_FILES

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def write_tree(root: Path, files: dict[str, str], shared: dict[str, str] = SHARED_FILES) -> Path:
    for rel, text in {**shared, **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root
