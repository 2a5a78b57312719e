"""The lease a background singleton holds: the shape ``periodic`` needs and every
provider's lease has (``db/leases.py``, ``Provider.make_lease``).

Source: docs/design.md "Background singletons take a database lease (PostgreSQL advisory
lock; a lease row elsewhere) so that exactly one process runs each when several are
deployed". Defined here, below the store, so that the runtime imports no database code.
"""

from __future__ import annotations

from typing import Protocol


class Lease(Protocol):
    """A lease that lets exactly one process run a background singleton.

    ``hold()`` acquires the lease, or confirms and renews it when already held, and
    returns whether this process holds it now; a ``False`` after a ``True`` means the
    lease was lost (the holder must stop its work). ``release()`` gives it up; idempotent.
    Both block (database I/O): call them off the event loop. Store errors propagate.
    """

    name: str

    def hold(self) -> bool: ...

    def release(self) -> None: ...
