"""The error classes say what happened and keep the driver error as the cause."""

from __future__ import annotations

import pytest

import runstore
from runstore.errors import BackendUnavailableError, RunstoreError


@pytest.mark.parametrize(
    ("written", "wording"),
    [(False, "nothing was written; it is safe to retry"),
     (True, "the write may have happened; check before retrying")],
)
def test_backend_unavailable_says_whether_the_write_may_have_happened(written: bool, wording: str) -> None:
    cause = ConnectionError("Error 111 connecting to redis://user:s3cr%2Fet@db:6379/0")
    err = BackendUnavailableError("redis stream bridge", "publish", write_may_have_happened=written, cause=cause)
    assert isinstance(err, RunstoreError) and runstore.BackendUnavailableError is BackendUnavailableError
    assert err.write_may_have_happened is written
    assert (err.backend, err.operation) == ("redis stream bridge", "publish")
    assert err.__cause__ is cause and err.__suppress_context__
    text = str(err)
    assert text.startswith("redis stream bridge is unavailable during publish (ConnectionError: ")
    assert text.endswith(wording)
    assert "s3cr" not in text, "a URL password in the driver's message is masked"


def test_backend_unavailable_raised_keeps_its_cause() -> None:
    cause = TimeoutError()
    with pytest.raises(BackendUnavailableError) as info:
        raise BackendUnavailableError("x", "read", write_may_have_happened=False, cause=cause)
    assert info.value.__cause__ is cause
    assert str(info.value) == "x is unavailable during read (TimeoutError): nothing was written; it is safe to retry"
