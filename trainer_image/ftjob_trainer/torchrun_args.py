"""Reading torchrun's command line before torch is imported (the launcher parses it only to decide what to start
early; torchrun's own parser stays the one that runs it). The operator renders every torchrun flag as --flag=value.
"""

from __future__ import annotations

from typing import Any

BUILTIN_TRAINER = "ftjob_trainer.train"
SHUTDOWN_FLAGS = ("--shutdown-timeout=", "--shutdown_timeout=")


def builtin_trainer_args(argv: list[str]) -> list[str] | None:
    """The built-in trainer's own arguments (after `-m ftjob_trainer.train`), or None for another program."""
    for i, (a, b) in enumerate(zip(argv[:-1], argv[1:], strict=True)):
        if a in ("-m", "--module") and b == BUILTIN_TRAINER:
            return argv[i + 2 :]
    return None


def agent_flags_end(argv: list[str]) -> int:
    """Where torchrun's own flags end: at the program (`-m`/`--module` or the first word that is no flag). The
    operator renders every flag as --flag=value, so a word without a dash is the program."""
    return next(
        (i for i, a in enumerate(argv) if a in ("-m", "--module") or not a.startswith("-")), len(argv)
    )


def without_shutdown_flag(argv: list[str]) -> tuple[list[str], int | None]:
    """argv without torchrun's --shutdown-timeout=N (the program's own arguments untouched), and N."""
    end = agent_flags_end(argv)
    found = [a for a in argv[:end] if a.startswith(SHUTDOWN_FLAGS)]
    if not found:
        return argv, None
    seconds = int(found[-1].split("=", 1)[1])
    return [a for a in argv[:end] if not a.startswith(SHUTDOWN_FLAGS)] + argv[end:], seconds


def knows_flag(parser: Any, flag: str) -> bool:
    return any(flag in action.option_strings for action in parser._actions)


def most_nodes(argv: list[str]) -> int | None:
    """The most nodes torchrun's --nnodes=N or --nnodes=MIN:MAX allows (torchrun's default: 1); None where that
    cannot be read here (a value given as the next word, say)."""
    value = "1"
    for a in argv[: agent_flags_end(argv)]:
        if a == "--nnodes":
            return None
        if a.startswith("--nnodes="):
            value = a.split("=", 1)[1]
    try:
        return int(value.rsplit(":", 1)[-1])
    except ValueError:
        return None
