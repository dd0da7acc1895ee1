"""The one exception the grammar raises: `GrammarError`, pointing at the offending token."""

from __future__ import annotations

#: Longest filter or formula text accepted; longer input is refused before tokenising.
MAX_LENGTH = 10_000
#: Deepest nesting of parentheses, `not` and function calls accepted.
MAX_DEPTH = 40


class GrammarError(ValueError):
    """A filter or formula that is not in the grammar.

    `position` is the 0-based character offset of the offending token in `text` and `token` its
    text ('' at the end of input). `str(error)` shows the message, the text and a caret under the
    offending token, so a researcher can see what to fix.
    """

    def __init__(self, message: str, position: int, token: str, text: str = "") -> None:
        self.message = message
        self.position = position
        self.token = token
        self.text = text
        super().__init__(self._render())

    def _render(self) -> str:
        if not self.text or len(self.text) > 500 or "\n" in self.text:
            where = f" (at character {self.position})"
            return f"{self.message}{where}"
        caret = " " * self.position + "^" * max(1, len(self.token))
        return f"{self.message}\n    {self.text}\n    {caret}"
