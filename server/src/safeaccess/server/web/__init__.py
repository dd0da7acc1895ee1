"""The output checkers' web workspace, served under /review by the API's FastAPI application.

Checkers log in with a password (argon2id) and a TOTP code, in a server-side session held by a
Secure, HttpOnly, SameSite=Strict cookie; every form carries a CSRF token bound to the session.
Decisions go through `safeaccess.server.review.decisions`, the code path of the admin CLI.
"""

from safeaccess.server.web.routes import mount

__all__ = ["mount"]
