"""Site templates as the guide "Cluster presets and site templates"
(docs/how-to/presets-templates.md) describes them: `templates.search_path` searched before
`$DDLAUNCH_TEMPLATE_PATH`, both before the built-in templates, one partial overridden by
`ddlaunch/templates/site-example/`, and a missing template one clear error, worded as the page
quotes it; and the documentation's config reference holding every key."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from ddlaunch.app.prepare import prepare
from ddlaunch.cli.reference import reference_lines
from ddlaunch.config.schema import Config

REPO = Path(__file__).resolve().parent.parent
SITE = REPO / "ddlaunch" / "templates" / "site-example"
PAGE = (REPO / "docs" / "how-to" / "presets-templates.md").read_text()


def test_the_page_names_the_site_example_and_the_search_order() -> None:
    assert "`ddlaunch/templates/site-example/` overrides only `partials/setup.sh.j2`" in PAGE
    templates = sorted(str(p.relative_to(SITE)) for p in SITE.rglob("*.j2"))
    assert templates == ["partials/setup.sh.j2"]
    assert "`templates.search_path` (config) and then `$DDLAUNCH_TEMPLATE_PATH`" in PAGE
    assert "--set 'templates.search_path=[ddlaunch/templates/site-example]'" in PAGE


def test_config_search_path_overrides_one_partial() -> None:
    script = prepare(
        "examples/mlp",
        [f"templates.search_path=[{SITE}]"],
        run_id="t",
        run_root="/runs",
        workdir="/w",
    ).script
    assert "module load cuda/12.4" in script
    assert "#SBATCH --nodes=2" in script  # the rest still comes from the built-in templates


def test_env_search_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDLAUNCH_TEMPLATE_PATH", str(SITE))
    script = prepare("examples/mlp", run_id="t", run_root="/runs", workdir="/w").script
    assert "module load cuda/12.4" in script


def test_config_path_wins_over_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = tmp_path / "partials"
    mine.mkdir()
    (mine / "setup.sh.j2").write_text("# mine\n")
    monkeypatch.setenv("DDLAUNCH_TEMPLATE_PATH", str(SITE))
    script = prepare(
        "examples/mlp",
        [f"templates.search_path=[{tmp_path}]"],
        run_id="t",
        run_root="/runs",
        workdir="/w",
    ).script
    assert "# mine" in script and "module load" not in script


def test_a_site_overrides_one_launch_mode(tmp_path: Path) -> None:
    """Each launch mode is a partial of its own: a site replaces one mode's attempt loop and
    the others, and the rest of the launch part, stay built in."""
    mine = tmp_path / "partials"
    mine.mkdir()
    (mine / "mode_plain.sh.j2").write_text("# site attempt loop: {{ plan.mode }}\n")
    script = prepare(
        "examples/mlp",
        [f"templates.search_path=[{tmp_path}]"],
        run_id="t",
        run_root="/runs",
        workdir="/w",
    ).script
    assert script.endswith("export DDLAUNCH_RELAUNCH=0\n# site attempt loop: plain\n")
    spares = prepare(
        "examples/mlp",
        [f"templates.search_path=[{tmp_path}]", "fault_tolerance.spare_nodes=1"],
        run_id="t",
        run_root="/runs",
        workdir="/w",
    ).script
    assert "site attempt loop" not in spares and "ddlaunch.job.hooks place" in spares


def test_missing_template_is_a_clean_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ddlaunch",
            "render",
            "examples/mlp",
            "--set",
            "templates.main=nope.j2",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: template 'nope.j2' not found in ")
    assert "`error: template 'nope.j2' not found in ...`" in PAGE  # the page quotes it
    assert "Traceback" not in proc.stderr


def test_docs_config_reference_lists_every_config_key() -> None:
    """The site's config page is generated at build time (docs/_gen/config_reference.py);
    its page() holds every line `ddlaunch config-reference` prints, in order. Loaded under
    its own module name, the generator writes nothing (it writes only under mkdocs)."""
    path = REPO / "docs" / "_gen" / "config_reference.py"
    spec = importlib.util.spec_from_file_location("docs_config_reference", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    page = module.page()
    at = 0
    for line in reference_lines(Config):
        found = page.find(line + "\n", at)
        assert found >= 0, f"docs config reference lacks or misorders {line!r}"
        at = found + len(line)
