"""The ``fmt`` fixture: a PagePool test that takes it runs at page format v2 (the default) and v3."""

from __future__ import annotations

import pytest
from pool_harness import FORMATS

from zipkv.kernels.format.layout import PageFormat


@pytest.fixture(params=FORMATS, ids=lambda f: f"v{f.version}")
def fmt(request: pytest.FixtureRequest) -> PageFormat:
    return request.param  # type: ignore[no-any-return]
