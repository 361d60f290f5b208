"""The README's Architecture holds as code: `lint-imports` keeps every contract in `.importlinter`
(layers that only import downwards, independent packages, no training code in quant, no drawing
outside the widgets), and the README's one-line-per-file list names exactly the packages and
modules the contract gives a layer. On a broken contract the test prints lint-imports' report:
the rule and the chain of imports that breaks it."""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from course_lib.paths import REPO_ROOT

CONTRACTS = REPO_ROOT / ".importlinter"


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """Run lint-imports on the course_lib under ``root`` with ``root``'s .importlinter, writing no cache."""
    command = Path(sys.executable).with_name("lint-imports")
    if not command.exists():
        raise RuntimeError(f"{command} is missing: import-linter is a test dependency; run ./course test "
                           "(it installs the [test] extras) or pip install -e '.[test]'.")
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(command), "--no-cache", "--no-logo"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)


def test_lint_imports_keeps_every_contract():
    run = lint_imports(REPO_ROOT)
    assert run.returncode == 0, "An import breaks .importlinter's contracts:\n" + run.stdout + run.stderr
    assert "0 broken" in run.stdout


def test_an_upward_import_fails_with_its_chain(tmp_path):
    """The contract is not vacuous: a copy of course_lib whose engine imports a widget fails, naming the import."""
    def sources_only(folder, names):
        return [n for n in names if n == "__pycache__" or not (n.endswith(".py") or (Path(folder) / n).is_dir())]

    shutil.copytree(REPO_ROOT / "course_lib", tmp_path / "course_lib", ignore=sources_only)
    shutil.copy(CONTRACTS, tmp_path / ".importlinter")
    simulated = tmp_path / "course_lib" / "engine" / "simulated.py"
    simulated.write_text(simulated.read_text() + "\nfrom course_lib.widgets.timeline import plot_slot_timeline\n")
    run = lint_imports(tmp_path)
    assert run.returncode != 0
    assert "course_lib.engine is not allowed to import course_lib.widgets" in run.stdout
    assert "course_lib.engine.simulated -> course_lib.widgets.timeline" in run.stdout


def contract_layers() -> set[str]:
    """Every top-level module named in the layers contract."""
    parser = configparser.ConfigParser()
    parser.read(CONTRACTS)
    lines = parser["importlinter:contract:layers"]["layers"].splitlines()
    return {name.strip() for line in lines if line.strip() for name in re.split(r"[:|]", line)}


def readme_architecture_list() -> set[str]:
    """The top-level entries of course_lib/ in the README's Architecture list (``perf/`` -> ``perf``)."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Architecture"):]
    section = section[:section.index("\n## ", 1)]
    return {match.group(1) for match in re.finditer(r"^  (\w+)(?:/|\.py)\s", section, re.MULTILINE)}


def test_the_readme_map_lists_what_the_contract_layers():
    on_disk = {p.stem if p.is_file() else p.name for p in (REPO_ROOT / "course_lib").iterdir()
               if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    assert contract_layers() == on_disk, "give every top-level module of course_lib a layer in .importlinter"
    assert readme_architecture_list() == on_disk, "list every top-level module of course_lib in README's Architecture"
