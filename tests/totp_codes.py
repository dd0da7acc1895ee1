"""TOTP codes for output checkers in tests: each code new, and still valid when checked."""

from __future__ import annotations

import time

import pyotp

#: Seconds a time step must have left for a code of the step before it to be used: the server
#: accepts steps now - 1 to now + 1 as of its own check, so a code of the previous step made at
#: the end of this one would be refused if a step boundary passed before the check (a loaded
#: machine). It failed CI once that way.
MARGIN_SECONDS = 5


class OneTimeCodes:
    """TOTP codes of one checker, each new (a code works once; the server accepts the
    neighbouring time steps too, so this waits only when those were used)."""

    def __init__(self, totp: pyotp.TOTP):
        self.totp = totp
        self.last_step = 0

    def code(self) -> str:
        """A code not used yet."""
        while True:
            moment = time.time()
            now = self.totp.timecode(moment)
            left = self.totp.interval - moment % self.totp.interval
            lowest = now - 1 if left > MARGIN_SECONDS else now
            step = max(lowest, self.last_step + 1)
            if step <= now + 1:
                self.last_step = step
                return str(self.totp.generate_otp(step))
            time.sleep(1.0)
