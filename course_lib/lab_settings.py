"""The course's defaults for JupyterLab, installed into the environment JupyterLab runs from.

JupyterLab takes default-setting overrides from ``<app dir>/settings/overrides.d/*.json``
(``jupyterlab_server``), where the app dir is ``$JUPYTERLAB_DIR`` or ``<sys.prefix>/share/jupyter/lab``.
``./course`` writes the course's file there at every set-up check, so ``./course lab`` and every
learner's server under ``./course hub`` (the same environment) start with these defaults; a
learner's own settings still win. The file is written only when it differs, so a read-only
environment that already has it is never touched.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

SETTINGS = {
    # No "Would you like to receive official Jupyter news?" toast over the first lesson, and no
    # request to jupyter.org from a learner's server.
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false"},
}
FILE_NAME = "course.json"


def overrides_file() -> Path:
    """Where JupyterLab of this Python environment reads the course's overrides."""
    app_dir = os.environ.get("JUPYTERLAB_DIR") or Path(sys.prefix) / "share" / "jupyter" / "lab"
    return Path(app_dir) / "settings" / "overrides.d" / FILE_NAME


def install(path: Path | None = None) -> Path:
    """Write ``SETTINGS`` to ``path`` (default ``overrides_file()``) unless it already holds them."""
    path = path or overrides_file()
    text = json.dumps(SETTINGS, indent=1) + "\n"
    if not path.is_file() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return path


def main() -> int:
    try:
        install()
    except OSError as error:
        print(f"course: could not write JupyterLab's course settings ({error}); JupyterLab will offer "
              "Jupyter news on first open. Run ./course once as the environment's owner to fix it.", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
