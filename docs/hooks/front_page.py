"""MkDocs hook: the site's front page is the repository's README.md.

The README links to the documentation pages by their repository paths (``docs/configuration.md``)
so that it reads right on a forge; on the site those pages sit beside the front page, so the
hook drops the ``docs/`` prefix.  The README is then checked by ``mkdocs build --strict`` like
every other page: a link to a missing page or anchor fails the build.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri != "index.md":
        return markdown
    readme = Path(config.config_file_path).parent / "README.md"
    return readme.read_text(encoding="utf-8").replace("](docs/", "](")
