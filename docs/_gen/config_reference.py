"""Writes ``reference/config.md`` at build time (mkdocs-gen-files runs this file).

The page is made from ``reference_lines``, the very function ``ddlaunch config-reference``
prints, so a key added to the schema appears on the site without a page being edited, and
the site can never disagree with the CLI. The text is kept as printed (one code block per
section, concatenated they are the command's output line for line); the headings only give
search and the table of contents something to point at.
"""

from __future__ import annotations

from ddlaunch.cli.reference import reference_lines
from ddlaunch.config.schema import Config

INTRO = """\
# Config reference

Every config key with its type, default and meaning: the text `ddlaunch config-reference`
prints, generated from the schema when this site is built. How a config is put together
(presets, `--set`, validation errors) is in [Write a config](../how-to/configs.md).

`--set a.b=c` types its value as YAML; durations stay strings. A key under a section is
written `section.key` in `--set` and nested in the file.
"""


def sections(lines: list[str]) -> list[tuple[str, str, list[str]]]:
    """Group the printed lines by section: (name, doc, lines). A top-level line that is a
    section heading (``job:  doc``) opens one; top-level keys (``sbatch``, ``params``) share
    a last group, since they are not under any section."""
    groups: list[tuple[str, str, list[str]]] = []
    for line in lines:
        if line.startswith(" "):
            groups[-1][2].append(line)
            continue
        head = line.split(None, 1)[0]
        if head.endswith(":"):
            groups.append((head[:-1], line.split(":", 1)[1].strip(), [line]))
        elif groups and groups[-1][0] == "top-level keys":
            groups[-1][2].append(line)
        else:
            groups.append(("top-level keys", "Keys outside any section.", [line]))
    return groups


def page() -> str:
    parts = [INTRO]
    for name, doc, lines in sections(reference_lines(Config)):
        body = "\n".join(lines)
        parts.append(f"## {name}\n\n{doc}\n\n```text\n{body}\n```\n")
    return "\n".join(parts)


# mkdocs-gen-files runs this file with runpy.run_path (run name "<run_path>"); a test that
# imports it for page() writes nothing.
if __name__ in ("<run_path>", "__main__"):
    import mkdocs_gen_files

    with mkdocs_gen_files.open("reference/config.md", "w") as out:
        out.write(page())
