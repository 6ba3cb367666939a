"""zipkv.allocator: the cross-layer pooled page allocator (docs/design.md, the allocator's four rules).

``PagePool`` owns the device heap and page tables; ``Ledger`` is its host-side bookkeeping (no torch);
``capacity.pages_fit`` is the capacity arithmetic. See docs/allocator.md.
"""

from zipkv.allocator.capacity import pages_fit
from zipkv.allocator.ledger import Ledger, LedgerConfig
from zipkv.allocator.plans import UNIT_BYTES, OutOfPages, PoolStats
from zipkv.allocator.pool import PagePool

__all__ = ["UNIT_BYTES", "Ledger", "LedgerConfig", "OutOfPages", "PagePool", "PoolStats", "pages_fit"]
