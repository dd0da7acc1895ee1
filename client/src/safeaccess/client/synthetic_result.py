"""A released `synthetic_data` step on the client: the file (hash-checked), the noisy marginals
with their sigmas, the tree, the privacy and utility reports."""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd


class SyntheticFileMismatch(ValueError):
    """The downloaded file is not the one the (receipt-checked) output names."""


def check_file(output: dict[str, Any], data: bytes) -> bytes:
    """`data` if its SHA-256 is the one in the released output, else raise."""
    expected = str(output.get("file", {}).get("sha256", ""))
    got = hashlib.sha256(data).hexdigest()
    if got != expected:
        raise SyntheticFileMismatch(
            f"the downloaded file has SHA-256 {got}, the released output names {expected}"
        )
    return data


#: What to install to read synthetic records, said in one line when it is missing.
INSTALL_HINT = "pip install './client[synthetic]'"


def read_records(data: bytes) -> pd.DataFrame:
    """The synthetic records of a released Parquet file; ImportError in one line naming the
    packages (pandas and pyarrow) when they are missing."""
    try:
        import pandas as pd
        import pyarrow  # noqa: F401  (pandas reads Parquet through it)
    except ImportError as exc:
        raise ImportError(
            f"reading synthetic records needs pandas and pyarrow ({exc.name} is missing): "
            f"{INSTALL_HINT}"
        ) from None
    return pd.read_parquet(io.BytesIO(data), engine="pyarrow")


@dataclass(frozen=True)
class SyntheticDataResult:
    """The released output of a `synthetic_data` step and its Parquet file's bytes."""

    output: dict[str, Any]
    data: bytes

    def frame(self) -> pd.DataFrame:
        """The synthetic records (needs the client's `synthetic` extra: pandas and pyarrow)."""
        return read_records(self.data)

    @property
    def privacy(self) -> dict[str, Any]:
        """mu, epsilon, delta, the sigmas, the tree, the ledger view and the DP risk report."""
        return dict(self.output["privacy"])

    @property
    def tree(self) -> list[tuple[str, str]]:
        return [(a, b) for a, b in self.output["privacy"]["tree"]]

    @property
    def measurements(self) -> list[dict[str, Any]]:
        """Every released noisy marginal (`clique`, C-order `values`, `sigma`): a count and its
        standard error come from here, not from the synthetic rows."""
        return list(self.output["measurements"])

    @property
    def utility(self) -> list[dict[str, Any]]:
        return list(self.output["utility"])

    def save(self, path: str) -> None:
        """Write the Parquet file."""
        with open(path, "wb") as out:
            out.write(self.data)
