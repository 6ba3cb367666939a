"""What one request sends to a worker, and the workers dispatch has lately found unreachable.

Split from dispatch.py: `Sampling` is built by the HTTP layer (request_shape.py) and `Opening` by the
dispatcher for every attempt; `UnreachableWorkers` is the dispatcher's router-local memory of refused
connections, so that the requests after the first do not each pay a connect attempt on a worker that is
gone while its last report is still fresh (up to `state.expire_after_ms`).
"""

from __future__ import annotations

from dataclasses import dataclass

from zipkv.protos import zipkv_pb2 as pb


@dataclass(frozen=True, slots=True)
class Sampling:
    """How the worker samples a request, as the HTTP layer parsed it (the dispatcher builds the wire
    message). ``seed`` None: the worker's own."""

    temperature: float
    top_p: float
    top_k: int  # 0: off
    stop_token_ids: tuple[int, ...]
    ignore_eos: bool
    seed: int | None

    def wire(self, max_new_tokens: int) -> pb.SamplingParams:
        return pb.SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=max(self.top_k, 0),
            max_new_tokens=max_new_tokens,
            stop_token_ids=list(self.stop_token_ids),
            ignore_eos=self.ignore_eos,
            seed=0 if self.seed is None else self.seed + 1,  # 0 on the wire: no seed
        )


@dataclass(frozen=True, slots=True)
class Opening:
    """What every attempt of one request sends: the prompt, the sampling, and its prompt blocks' hashes
    (recorded in the prefix index once a worker took it)."""

    model: str
    prompt_ids: list[int]
    sampling: pb.SamplingParams
    hashes: tuple[int, ...]


class UnreachableWorkers:
    """Workers whose connection failed in the last `cooldown_s`: dispatch tries them after every other
    candidate, not never (a worker back from a blip, or the only one left, is still used)."""

    def __init__(self, cooldown_s: float) -> None:
        self.cooldown_s = cooldown_s
        self._since_s: dict[str, float] = {}  # worker id -> when its connection last failed (clock s)

    def mark(self, worker_id: str, now_s: float) -> None:
        # Bounded by the workers that failed within one cooldown: a replaced worker's id never comes back.
        self._since_s = {w: t for w, t in self._since_s.items() if now_s - t < self.cooldown_s}
        self._since_s[worker_id] = now_s

    def clear(self, worker_id: str) -> None:
        self._since_s.pop(worker_id, None)

    def cooling(self, worker_id: str, now_s: float) -> bool:
        since = self._since_s.get(worker_id)
        return since is not None and now_s - since < self.cooldown_s
