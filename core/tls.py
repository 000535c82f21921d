"""TLS options shared by the network backends: libpq's names and meanings.

``sslmode`` says how much of the server's certificate is checked (``require``: none of
it, the connection is only encrypted; ``verify-ca``: signed by a trusted CA;
``verify-full``: also issued for the host of the URL), ``sslrootcert`` names the CA
certificate (a PEM file, or ``system`` for the system's trusted CAs), ``sslcert`` and
``sslkey`` a client certificate and its key. A backend reads them from its URL and its
settings section and checks the files here, before it connects.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from runstore.settings import OptionValues

#: The URL options (and settings keys) of TLS.
TLS_OPTIONS: Final = ("sslmode", "sslrootcert", "sslcert", "sslkey")
#: ``sslrootcert=system``: the system's trusted CAs (libpq 16's spelling).
SYSTEM_ROOTS: Final = "system"


def pem_file_problem(path: str) -> str | None:
    """What is wrong with ``path`` as a certificate or key file, or ``None`` if it can be read."""
    file = Path(path).expanduser()
    if not file.is_file():
        return f"no such file {str(file)!r} (give the path of a PEM file)"
    if not os.access(file, os.R_OK):
        return f"cannot read {str(file)!r} (permission denied)"
    return None


def check_tls_files(options: OptionValues) -> None:
    """Refuse unreadable certificate and key files, and a client key without its certificate
    (``options`` holds `TLS_OPTIONS`; `OptionValues.problem` says where each came from)."""
    for name in ("sslrootcert", "sslcert", "sslkey"):
        path = options[name]
        if path is not None and not (name == "sslrootcert" and path == SYSTEM_ROOTS):
            trouble = pem_file_problem(path)
            if trouble is not None:
                raise options.problem(name, trouble)
    if options["sslkey"] is not None and options["sslcert"] is None:
        raise options.problem("sslkey", "a client key needs its certificate: give sslcert too")
