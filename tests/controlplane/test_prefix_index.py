"""The router's prefix index: hash chains over fixed-size token blocks, the bounded LRU, the frozen match."""

from __future__ import annotations

import pytest

from zipkv.controlplane.prefix_index import PrefixIndex, PrefixMatch, block_hashes, chain_hashes

B = 4  # tokens per block in every row


def ids(*blocks: int) -> list[int]:
    """One block of B equal ids per argument: ids(1, 2) = [1, 1, 1, 1, 2, 2, 2, 2]."""
    return [t for b in blocks for t in [b] * B]


@pytest.mark.parametrize(
    ("a", "b", "shared"),
    [
        (ids(1, 2, 3), ids(1, 2, 3), 3),  # the same prompt: every block
        (ids(1, 2, 3), ids(1, 2, 9), 2),  # diverges in block 2
        (ids(1, 2, 3), ids(9, 2, 3), 0),  # diverges in block 0: no later block matches either
        (ids(1, 2), ids(1, 2, 3, 4), 2),  # a shorter prompt is a prefix of the longer one
        (ids(1, 2, 3), [*ids(1, 2), 3, 3, 3, 7], 2),  # one token off in block 2
    ],
)
def test_chain_hashes_match_exactly_the_shared_leading_blocks(
    a: list[int], b: list[int], shared: int
) -> None:
    ha, hb = block_hashes(a, B), block_hashes(b, B)
    common = next((i for i, (x, y) in enumerate(zip(ha, hb, strict=False)) if x != y), min(len(ha), len(hb)))
    assert common == shared


def test_a_block_hash_covers_every_token_before_it() -> None:
    # Same block 1 content after different block 0: different hash 1 (a chain, not per-block hashes).
    assert block_hashes(ids(1, 5), B)[1] != block_hashes(ids(2, 5), B)[1]


@pytest.mark.parametrize(("n_tokens", "blocks"), [(0, 0), (3, 0), (4, 1), (7, 1), (8, 2)])
def test_only_full_blocks_are_hashed(n_tokens: int, blocks: int) -> None:
    assert len(block_hashes(list(range(n_tokens)), B)) == blocks


def test_the_model_salts_the_chain() -> None:
    index = PrefixIndex(100, B)
    assert index.hashes(ids(1, 2), "a") != index.hashes(ids(1, 2), "b")
    assert chain_hashes([b"x"], b"a") == chain_hashes([b"x"], b"a")


def test_match_gives_each_worker_its_deepest_served_block() -> None:
    index = PrefixIndex(100, B)
    index.record(index.hashes(ids(1, 2), "m"), "w1")  # a conversation's first turn on w1
    index.record(index.hashes(ids(1), "m"), "w2")  # another prompt sharing block 0, later, on w2
    m = index.match(index.hashes(ids(1, 2, 3, 4), "m"))  # the next turn: 4 blocks
    # w1 served blocks 0..1 (its block-1 hash covers block 0 too); w2 last served block 0.
    assert m == PrefixMatch(4, (("w1", 2), ("w2", 1)))
    assert (m.fraction("w1"), m.fraction("w2"), m.fraction("w3")) == (0.5, 0.25, 0.0)


def test_a_divergent_block_stops_the_match() -> None:
    index = PrefixIndex(100, B)
    index.record(index.hashes(ids(1, 2, 3), "m"), "w1")
    assert index.match(index.hashes(ids(1, 9, 3), "m")) == PrefixMatch(3, (("w1", 1),))
    assert index.match(index.hashes(ids(9, 2, 3), "m")) == PrefixMatch(3, ())


def test_the_last_worker_to_serve_a_block_owns_it() -> None:
    index = PrefixIndex(100, B)
    h = index.hashes(ids(1, 2), "m")
    index.record(h, "w1")
    index.record(h, "w2")
    assert index.match(h) == PrefixMatch(2, (("w2", 2),))


def test_the_index_is_bounded_least_recently_used_first() -> None:
    index = PrefixIndex(4, B)
    old, new = index.hashes(ids(1, 2, 3), "m"), index.hashes(ids(7, 8), "m")
    index.record(old, "w1")
    index.record(new, "w2")  # 5 entries > 4: old's deepest block (its leaf) goes first, its head stays
    assert len(index) == 4
    assert index.match(old) == PrefixMatch(3, (("w1", 2),))
    index.record(index.hashes(ids(5, 6), "m"), "w3")  # two more: old's next leaf and then its head
    assert len(index) == 4
    assert index.match(old) == PrefixMatch(3, ())
    assert index.match(new) == PrefixMatch(2, (("w2", 2),))


@pytest.mark.parametrize(("max_blocks", "block_tokens"), [(0, 4), (4, 0)])
def test_the_index_refuses_a_zero_size(max_blocks: int, block_tokens: int) -> None:
    with pytest.raises(ValueError):
        PrefixIndex(max_blocks, block_tokens)


def test_a_request_without_blocks_has_no_affinity() -> None:
    assert PrefixMatch(0).fraction("w1") == 0.0
