"""Environment switches, read one way: an unset or empty variable is the default, a value is stripped and
lower-cased, and anything outside the choices fails loudly with the variable's name and what it takes.

Every ``ZIPKV_*`` switch of the kernels, the pool and the worker (the decode kernel, the page format, the
Hopper tile's options, the pack, the extend and prefill kernels) reads through ``env_choice``, so a typo
in any of them is refused at start-up the same way instead of one switch ignoring case and another not.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence


def env_choice(
    name: str, choices: Sequence[str], default: str, env: Mapping[str, str] | None = None, hint: str = ""
) -> str:
    """``$name`` (from ``env``, default ``os.environ``) as one of ``choices``; ``default`` when unset or
    empty. ValueError names the variable, the choices and ``hint`` (what they mean, where to read more)."""
    env = os.environ if env is None else env
    value = env.get(name, "").strip().lower() or default
    if value not in choices:
        detail = f" ({hint})" if hint else ""
        raise ValueError(f"{name}={env.get(name)!r}: expected one of {', '.join(choices)}{detail}")
    return value


def env_flag(name: str, off: str, env: Mapping[str, str] | None = None, default: bool = False) -> bool:
    """A 0/1 switch, ``default`` when unset; ``off`` says what 0 means, for the error."""
    return env_choice(name, ("0", "1"), "1" if default else "0", env, hint=f"0: {off}") == "1"
