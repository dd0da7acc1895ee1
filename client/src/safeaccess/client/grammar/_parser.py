"""A token cursor shared by the filter and formula parsers."""

from __future__ import annotations

from safeaccess.client.grammar.errors import MAX_DEPTH, GrammarError
from safeaccess.client.grammar.lexer import Token, tokenize


class Cursor:
    """Walks a token list; every error it raises points at the current token."""

    def __init__(self, text: str, what: str) -> None:
        self.text = text
        self.what = what
        self.tokens = tokenize(text, what)
        self.index = 0
        self.depth = 0

    @property
    def current(self) -> Token:
        return self.tokens[self.index]

    def peek(self, ahead: int = 1) -> Token:
        return self.tokens[min(self.index + ahead, len(self.tokens) - 1)]

    def advance(self) -> Token:
        tok = self.tokens[self.index]
        if tok.kind != "eof":
            self.index += 1
        return tok

    def error(self, message: str, tok: Token | None = None) -> GrammarError:
        tok = tok or self.current
        return GrammarError(message, tok.pos, tok.text, self.text)

    def is_op(self, *ops: str) -> bool:
        tok = self.current
        return tok.kind == "op" and tok.text in ops

    def is_keyword(self, *words: str) -> bool:
        tok = self.current
        return tok.kind == "ident" and tok.text.lower() in words

    def expect_op(self, op: str, context: str) -> Token:
        if not self.is_op(op):
            raise self.error(f"expected {op!r} {context}, found {self.current.describe()}")
        return self.advance()

    def enter(self) -> None:
        """Count one level of nesting; refuse input nested deeper than MAX_DEPTH."""
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.error(f"{self.what} is nested more than {MAX_DEPTH} levels deep")

    def leave(self) -> None:
        self.depth -= 1
