"""Catalog: small strongly consistent key-value stores with atomic transactions."""
from catalog.abc import (  # noqa: F401
    MAX_KEY_BYTES,
    MAX_REQUEST_ID,
    MAX_TXN_BYTES,
    MAX_TXN_OPS,
    MAX_VALUE_BYTES,
    Catalog,
    Check,
    Delete,
    Entry,
    Op,
    Put,
    TxnResult,
)
