"""A dataset's published DP mock on the client: the centre's signature over the manifest and
the file's SHA-256 are checked before the records are used.

A mock is synthetic data for writing and rehearsing sequences. Results on it predict nothing
about the real data's results or verdicts.
"""

from __future__ import annotations

import base64
import hashlib
import io
from typing import TYPE_CHECKING, Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

if TYPE_CHECKING:
    import pandas as pd
from safeaccess.client.protocol import canonical

LABEL = "DP MOCK (synthetic): results predict nothing about the real data or its verdicts"


class MockInvalid(ValueError):
    """The mock's signature or hash does not check out: do not use it."""


def verify_mock(
    payload: dict[str, Any], server_key: Ed25519PublicKey
) -> tuple[dict[str, Any], bytes]:
    """(manifest, Parquet bytes) of a `GET /v1/datasets/{name}/mock` answer, after checking the
    centre's signature over the manifest and the file's SHA-256 against it."""
    try:
        manifest = dict(payload["manifest"])
        signature = base64.b64decode(str(payload["signature"]), validate=True)
        data = base64.b64decode(str(payload["data"]), validate=True)
    except (KeyError, TypeError, ValueError) as exc:
        raise MockInvalid("the mock answer is malformed") from exc
    try:
        server_key.verify(signature, canonical.dumps(manifest))
    except InvalidSignature as exc:
        raise MockInvalid("the mock's manifest is not signed by the centre's key") from exc
    if hashlib.sha256(data).hexdigest() != manifest.get("sha256"):
        raise MockInvalid("the mock's file does not match its signed manifest")
    if manifest.get("mock") is not True:
        raise MockInvalid("the signed manifest does not describe a mock")
    return manifest, data


def mock_frame(manifest: dict[str, Any], data: bytes) -> pd.DataFrame:
    """The mock's records, labelled as a mock (`frame.attrs['safeaccess_mock']`)."""
    import pandas as pd

    frame = pd.read_parquet(io.BytesIO(data))
    frame.attrs["safeaccess_mock"] = {"label": LABEL, **manifest}
    return frame
