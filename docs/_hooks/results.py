"""MkDocs hook: publish the benchmark tables and figures of ``benchmarks/results/`` in the site.

Each ``benchmarks/results/NAME.md`` becomes the page ``results/NAME.md`` and each figure
``results/NAME.png``, read from where the benchmark scripts write them, so the site always shows
the committed results and nothing is copied by hand.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File


def on_files(files, config):
    """Add every table (``.md``) and figure (``.png``) of ``benchmarks/results/``."""
    results = Path(config["config_file_path"]).parent / "benchmarks" / "results"
    for path in sorted(results.iterdir()):
        if path.suffix in (".md", ".png"):
            files.append(File.generated(config, f"results/{path.name}", abs_src_path=str(path)))
    return files
