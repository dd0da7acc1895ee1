"""`python -m safeaccess.sandbox.runner`: answer one request (see `safeaccess.sandbox.runner`)."""

import os

from safeaccess.sandbox.runner import main

if __name__ == "__main__":
    status = main()
    # The response is written and flushed; skip interpreter teardown (finalising pandas and
    # friends takes longer than many analyses) so the sandbox is gone as soon as possible.
    os._exit(status)
