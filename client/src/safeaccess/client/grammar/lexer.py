"""Tokeniser shared by the filter and formula parsers.

Hand-written so that the accepted character set is exactly what the grammar needs: ASCII
identifiers, decimal numbers, quoted strings and a fixed set of operators. Nothing is evaluated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from safeaccess.client.grammar.errors import MAX_LENGTH, GrammarError

TokenKind = Literal["ident", "number", "string", "op", "eof"]

# Longest operators first so that '<=' is not read as '<' followed by '='.
_OPERATORS = (
    "**",
    "==",
    "!=",
    "<>",
    "<=",
    ">=",
    "<",
    ">",
    "=",
    "~",
    "+",
    "-",
    "*",
    ":",
    "(",
    ")",
    ",",
)
_IDENT_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_IDENT_CHARS = _IDENT_START | frozenset("0123456789")
_DIGITS = frozenset("0123456789")
_SPACE = frozenset(" \t\r\n")


@dataclass(frozen=True, slots=True)
class Token:
    """One token: its kind, its source text, its value (numbers and strings) and its offset."""

    kind: TokenKind
    text: str
    pos: int
    value: int | float | str | None = None

    def describe(self) -> str:
        """How to name this token in an error message."""
        return "end of input" if self.kind == "eof" else repr(self.text)


def tokenize(text: str, what: str) -> list[Token]:
    """Split `text` into tokens, ending with an 'eof' token. `what` names the input in errors."""
    if not isinstance(text, str):
        raise GrammarError(f"{what} must be a string, not {type(text).__name__}", 0, "")
    if len(text) > MAX_LENGTH:
        raise GrammarError(
            f"{what} is {len(text)} characters long; the limit is {MAX_LENGTH}", MAX_LENGTH, ""
        )
    tokens: list[Token] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in _SPACE:
            i += 1
        elif ch in _IDENT_START:
            j = i + 1
            while j < n and text[j] in _IDENT_CHARS:
                j += 1
            tokens.append(Token("ident", text[i:j], i))
            i = j
        elif ch in _DIGITS or (ch == "." and i + 1 < n and text[i + 1] in _DIGITS):
            tok = _number(text, i)
            tokens.append(tok)
            i += len(tok.text)
        elif ch in "'\"":
            tok = _string(text, i, what)
            tokens.append(tok)
            i += len(tok.text)
        else:
            op = next((o for o in _OPERATORS if text.startswith(o, i)), None)
            if op is None:
                raise GrammarError(f"unexpected character {ch!r} in {what}", i, ch, text)
            tokens.append(Token("op", op, i))
            i += len(op)
    tokens.append(Token("eof", "", n))
    return tokens


def _number(text: str, start: int) -> Token:
    n = len(text)
    j = start
    while j < n and text[j] in _DIGITS:
        j += 1
    is_float = False
    if j < n and text[j] == ".":
        is_float = True
        j += 1
        while j < n and text[j] in _DIGITS:
            j += 1
    if j < n and text[j] in "eE":
        k = j + 1
        if k < n and text[k] in "+-":
            k += 1
        if k < n and text[k] in _DIGITS:
            is_float = True
            j = k
            while j < n and text[j] in _DIGITS:
                j += 1
    raw = text[start:j]
    if j < n and (text[j] in _IDENT_CHARS or text[j] == "."):
        # '12abc' or '1.2.3' is neither a number nor a name.
        end = j
        while end < n and (text[end] in _IDENT_CHARS or text[end] == "."):
            end += 1
        raise GrammarError(f"malformed number {text[start:end]!r}", start, text[start:end], text)
    value: int | float
    if is_float:
        value = float(raw)
        if not math.isfinite(value):
            raise GrammarError(f"number {raw!r} is out of range", start, raw, text)
    else:
        if len(raw) > 30:
            raise GrammarError(f"integer {raw!r} has too many digits", start, raw, text)
        value = int(raw)
    return Token("number", raw, start, value)


def _string(text: str, start: int, what: str) -> Token:
    """A quoted string; the quote character is escaped by doubling it, as in SQL."""
    quote = text[start]
    n = len(text)
    j = start + 1
    parts: list[str] = []
    while j < n:
        ch = text[j]
        if ch == quote:
            if j + 1 < n and text[j + 1] == quote:
                parts.append(quote)
                j += 2
                continue
            return Token("string", text[start : j + 1], start, "".join(parts))
        parts.append(ch)
        j += 1
    raise GrammarError(
        f"unterminated string in {what}: close it with {quote}", start, text[start:], text
    )
