"""Where the aggregator keeps the survivors' masked inputs that a re-sum may need: in memory, or in a file.

On the complete graph the secure-aggregation server keeps every survivor's masked input from MASK to VERIFY
(:func:`~fedfair.secagg.resum.resum_decides`): below RESUMMED_WORDS for the claim, and above it for the tag set
of a round whose tags do not all arrive, which is rare. Above the bound that is n (d + 1) words a round (60 MB at
n = 3, d = 10^7 in 16-bit words), none of which the aggregator needs unless a tag is missing, so each is copied into
an unlinked file in the output folder as it arrives and read back from the file's mapping, if ever: the page cache,
not the aggregator's process, holds the n (d + 1) words from MASK to VERIFY.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.messages import MaskedInput
from fedfair.secagg.resum import resum_decides


def kept_in_files(config: SecAggConfig) -> bool:
    """Whether a round of `config` keeps its masked inputs above RESUMMED_WORDS (in files): for a tag set, or a re-check.

    A re-checked round (:attr:`~fedfair.secagg.config.SecAggConfig.rechecked`) reads each back twice, once to find
    the sum's carries and once to send it to the survivors that re-check it.
    """
    return not config.resummed and (resum_decides(config) or config.rechecked)


def in_file(parse: Callable[[bytes], object], folder: Path | None) -> Callable[[bytes], MaskedInput]:
    """`parse`, its message's vector then moved into an unlinked file in `folder` and mapped read-only.

    `parse` is the upload parser of a kind's kept stage (:attr:`~fedfair.secagg.round.SecureRound.kept`), whose
    uploads are masked inputs.
    """

    def parse_into_file(payload: bytes) -> MaskedInput:
        message = parse(payload)
        assert isinstance(message, MaskedInput)  # a kept stage's uploads are masked inputs
        handle, path = tempfile.mkstemp(prefix="fedfair-", suffix=".masked", dir=folder)
        os.unlink(path)  # it never outlives the process
        with os.fdopen(handle, "w+b") as file:
            file.write(np.ascontiguousarray(message.vector).data)
            file.flush()
            # The mapping keeps its own reference to the file, which the round's server holds until it is let go.
            vector = np.memmap(file, dtype=message.vector.dtype, mode="r", shape=message.vector.shape)
        return replace(message, vector=vector)

    return parse_into_file
