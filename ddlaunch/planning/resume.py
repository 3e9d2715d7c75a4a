"""The arguments a trainer is restarted with (pure): ``trainer.resume_args`` filled in with
the checkpoint found, added to ``launch.args`` so that an option given there already is
replaced, never given twice.

Options are recognised in the three spellings trainers' parsers accept: ``--flag value``
(two words; the value is the next word unless that starts with ``-``), ``--flag=value`` and
``key=value`` (Hydra, torchtune, Lightning's CLI overrides).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ddlaunch.config.trainers import substitute


def _key(word: str) -> str | None:
    """The option a word names: ``--flag`` / ``--flag=v`` -> ``--flag``; ``k=v`` -> ``k``."""
    if word.startswith("-"):
        return word.split("=", 1)[0]
    if "=" in word and not word.startswith("="):
        return word.split("=", 1)[0]
    return None


def _units(words: Sequence[str]) -> list[tuple[str | None, list[str]]]:
    """Split argv into (option, its words); positional words have option None."""
    out: list[tuple[str | None, list[str]]] = []
    i = 0
    while i < len(words):
        word = words[i]
        key = _key(word)
        takes_value = word.startswith("-") and "=" not in word
        if takes_value and i + 1 < len(words) and not words[i + 1].startswith("-"):
            out.append((key, [word, words[i + 1]]))
            i += 2
            continue
        out.append((key, [word]))
        i += 1
    return out


def with_resume_args(
    args: Sequence[str], resume_args: Sequence[str], values: Mapping[str, str]
) -> list[str]:
    """``args`` with ``resume_args`` (placeholders from ``values``) appended; options named
    in ``resume_args`` are first removed from ``args``."""
    filled = [substitute(word, dict(values)) for word in resume_args]
    new_units = _units(filled)
    replaced = {key for key, _ in new_units if key is not None}
    kept = [w for key, words in _units(args) if key is None or key not in replaced for w in words]
    return [*kept, *filled]


def resume_values(
    checkpoint: str, step: int | None, checkpoint_dir: str, files: Sequence[str] = ()
) -> dict[str, str]:
    """The placeholders of ``trainer.resume_args``; ``files``: the checkpoint's model files,
    relative to ``checkpoint_dir`` (one list override, torchtune's and Hydra's syntax)."""
    return {
        "checkpoint": checkpoint,
        "step": "" if step is None else str(step),
        "checkpoint_dir": checkpoint_dir,
        "checkpoint_files": "[" + ",".join(files) + "]",
    }
