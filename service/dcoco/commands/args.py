"""Argument types the subcommands share, and the flags of a settings class.

`settings_flags` gives a command one flag per setting (`--max-batch-size` for
DCOCO_MAX_BATCH_SIZE): the name, the choices (from the setting's enum or Literal) and the
default come from the settings class, which stays the one definition. Values are checked by the
settings model itself (`settings_from`), so a flag takes exactly what its variable takes.
"""

import argparse
import enum
import types
from collections.abc import Iterable
from typing import Any, Literal, Union, get_args, get_origin


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def choices_of(annotation: Any) -> list[str] | None:
    """The values an enum or Literal setting takes (inside an Optional too), else None."""
    if get_origin(annotation) in (Union, types.UnionType):
        found = [choices_of(arg) for arg in get_args(annotation) if arg is not type(None)]
        return found[0] if len(found) == 1 else None
    if get_origin(annotation) is Literal:
        return [str(value) for value in get_args(annotation)]
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return [str(member.value) for member in annotation]
    return None


def settings_flags(
    parser: argparse.ArgumentParser,
    settings: Any,  # a pydantic settings class (pydantic is not imported here: too heavy)
    only: Iterable[str] | None = None,
    prefix: str = "DCOCO_",
) -> None:
    """A flag for each field of `settings` (or the ones named in `only`), which wins over its
    environment variable; unset flags leave the variable, or the default, in force."""
    wanted = set(only) if only is not None else None
    for name, field in settings.model_fields.items():
        if wanted is not None and name not in wanted:
            continue
        default = field.default_factory() if field.default_factory else field.default
        shown = getattr(default, "value", default)
        about = f": {field.description}" if field.description else ""
        help_text = f"{prefix}{name.upper()}{about} (default: {shown})".replace("%", "%%")
        flag = "--" + name.replace("_", "-")
        if field.annotation is bool:
            parser.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
            continue
        choices = choices_of(field.annotation)
        parser.add_argument(
            flag,
            default=None,
            choices=choices,
            metavar="{" + ",".join(choices) + "}" if choices else name.upper(),
            help=help_text,
        )
