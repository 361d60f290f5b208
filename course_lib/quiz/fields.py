"""Reading a quiz file's fields, with errors that name the file, the question and the fix."""

from __future__ import annotations

from typing import Any


class QuizFileError(ValueError):
    """A quiz file is malformed; the message names the file, the question and the fix."""


class Fields:
    """Reads one question's fields, raising QuizFileError that names where the problem is."""

    def __init__(self, data: dict[str, Any], where: str) -> None:
        self.data, self.where = data, where

    def fail(self, problem: str) -> QuizFileError:
        return QuizFileError(f"{self.where}: {problem}")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        if key not in self.data:
            if default is ...:
                raise self.fail(f"missing field '{key}'.")
            return default
        value = self.data[key]
        numeric = kind in (int, (int, float))
        if not isinstance(value, kind) or (numeric and isinstance(value, bool)):
            raise self.fail(f"field '{key}' must be {_TYPE_WORDS[kind]}, got {value!r}.")
        return value


_TYPE_WORDS = {str: "text", bool: "true or false", int: "a whole number", (int, float): "a number",
               list: "a list", dict: "a mapping"}
