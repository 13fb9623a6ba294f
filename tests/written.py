"""Files that other processes are still writing."""

from pathlib import Path


def whole_lines(path: Path) -> list[str]:
    """The lines of a file another process appends to: the text after its last newline may be a line still being
    written, so it is left out."""
    return path.read_text().split("\n")[:-1]
