"""Pattern rules: the table that maps a tensor's fully qualified name to its layout pattern."""

from __future__ import annotations

import re
from typing import Any, Iterable

from lifeline.checkpoint._patterns import Pattern, Replicated
from lifeline.errors import LayoutError

__all__ = ["PatternRules"]


def _glob_to_regex(glob: str) -> re.Pattern:
    out = []
    for ch in glob:
        out.append("(.*)" if ch == "*" else "(.)" if ch == "?" else re.escape(ch))
    return re.compile("".join(out))


class PatternRules:
    """An ordered table of name rules: ``[(glob_or_regex, pattern), ...]``; first match wins.

    A rule's key is a glob (``str``: ``*`` and ``?`` capture as groups ``\\1``...), a regex
    string prefixed ``"re:"``, or a compiled :class:`re.Pattern`; it must match the whole
    fully qualified name. Unmatched names get ``default`` (``Replicated()``); pass
    ``default=None`` to make them a :class:`LayoutError`. A key of another type is a
    :class:`LayoutError`, an invalid regex a :class:`re.error`.
    """

    def __init__(self, rules: Iterable[tuple[Any, Pattern]] = (), default: Pattern | None = Replicated()) -> None:
        self._rules: list[tuple[re.Pattern, Pattern]] = []
        for key, pattern in rules:
            if isinstance(key, re.Pattern):
                rx = key
            elif isinstance(key, str) and key.startswith("re:"):
                rx = re.compile(key[3:])
            elif isinstance(key, str):
                rx = _glob_to_regex(key)
            else:
                raise LayoutError(f"rule key {key!r} must be a glob, 're:<regex>' or a compiled regex")
            self._rules.append((rx, pattern))
        self.default = default

    def match(self, fqn: str) -> Pattern:
        """The resolved pattern of ``fqn``. Raises :class:`LayoutError` when none applies."""
        for rx, pattern in self._rules:
            m = rx.fullmatch(fqn)
            if m is not None:
                resolve = getattr(pattern, "resolve", None)
                return resolve(m) if resolve is not None else pattern
        if self.default is None:
            raise LayoutError(f"no pattern rule matches tensor {fqn!r}; add a rule for it", key=fqn)
        return self.default

    def __repr__(self) -> str:
        return f"PatternRules({[(rx.pattern, p) for rx, p in self._rules]!r}, default={self.default!r})"
