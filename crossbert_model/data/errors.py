"""DataError: bad input data (corpus, tokenizer, token cache, sequences), one class for the whole data pipeline."""

from __future__ import annotations

from ..errors import CrossbertError


class DataError(CrossbertError, ValueError):
    """Bad input data: the message names the file, the line/field and what was expected."""
