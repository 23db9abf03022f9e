"""Paged KV block allocation with prefix caching over full blocks.

Blocks are reference counted. A full block whose K/V has been computed is registered under
a chained hash (hash of the previous block's hash and this block's tokens), so a later
request with the same prefix maps the same physical block instead of recomputing it.
Freed blocks keep their hash and go to the back of the free queue: they are reused last,
and a prefix hit on a free block revives it. Only blocks whose K/V is fully written are
registered, so a hit never reads a half-filled block (chunked prefill spans steps).
"""
from __future__ import annotations

from collections import deque

from backend.engine.sequence import Sequence


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "tokens")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.hash: int | None = None
        self.tokens: tuple[int, ...] | None = None  # kept to rule out hash collisions


def chain_hash(prev: int | None, tokens: tuple[int, ...]) -> int:
    return hash((prev, tokens))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: deque[int] = deque(range(num_blocks))
        self.free_set = set(range(num_blocks))
        self.by_hash: dict[int, int] = {}

    @property
    def num_free(self) -> int:
        return len(self.free_set)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free_set)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _prefix_hits(self, seq: Sequence) -> list[int]:
        """Cached block ids for the leading full blocks of seq; the last token is never
        served from cache (its logits are needed), so at most (len - 1) // bs blocks."""
        if not self.prefix_caching:
            return []
        hits, h, bs = [], None, self.block_size
        for i in range((len(seq) - 1) // bs):
            tokens = tuple(seq.token_ids[i * bs:(i + 1) * bs])
            h = chain_hash(h, tokens)
            bid = self.by_hash.get(h)
            if bid is None or self.blocks[bid].tokens != tokens:
                break
            hits.append(bid)
        return hits

    def can_allocate(self, seq: Sequence) -> bool:
        hits = self._prefix_hits(seq)
        in_use = sum(1 for b in hits if self.blocks[b].ref_count > 0)
        return self.blocks_for(len(seq)) - in_use <= self.num_free

    def allocate(self, seq: Sequence, use_prefix_cache: bool = True) -> int:
        """Blocks for all of seq's tokens; returns how many tokens the prefix cache covers."""
        assert not seq.block_table
        hits = self._prefix_hits(seq) if use_prefix_cache else []
        for bid in hits:
            block = self.blocks[bid]
            if block.ref_count == 0:
                self._take(bid)
            block.ref_count += 1
        seq.block_table = list(hits)
        seq.num_hashed_blocks = len(hits)
        for _ in range(self.blocks_for(len(seq)) - len(hits)):
            seq.block_table.append(self._alloc_fresh())
        return len(hits) * self.block_size

    def _take(self, bid: int) -> None:
        self.free.remove(bid)  # O(n) but only on a hit of a freed cached block
        self.free_set.discard(bid)

    def _alloc_fresh(self) -> int:
        bid = self.free.popleft()
        self.free_set.discard(bid)
        block = self.blocks[bid]
        if block.hash is not None and self.by_hash.get(block.hash) == bid:
            del self.by_hash[block.hash]  # its old contents are about to be overwritten
        block.hash, block.tokens, block.ref_count = None, None, 1
        return bid

    def can_append(self, seq: Sequence) -> bool:
        """Room for the K/V of position num_computed (the next decode)?"""
        return self.blocks_for(seq.num_computed + 1) <= len(seq.block_table) or self.num_free > 0

    def append_slot(self, seq: Sequence) -> None:
        if self.blocks_for(seq.num_computed + 1) > len(seq.block_table):
            seq.block_table.append(self._alloc_fresh())

    def register_computed(self, seq: Sequence) -> None:
        """Register the full blocks whose K/V is now entirely in the cache."""
        if not self.prefix_caching:
            return
        bs, full = self.block_size, seq.num_computed // self.block_size
        if full <= seq.num_hashed_blocks:  # most steps: no block filled up
            return
        h = self.blocks[seq.block_table[seq.num_hashed_blocks - 1]].hash \
            if seq.num_hashed_blocks else None
        for i in range(seq.num_hashed_blocks, full):
            tokens = tuple(seq.token_ids[i * bs:(i + 1) * bs])
            h = chain_hash(h, tokens)
            block = self.blocks[seq.block_table[i]]
            block.hash, block.tokens = h, tokens
            self.by_hash.setdefault(h, block.block_id)
        seq.num_hashed_blocks = max(seq.num_hashed_blocks, full)

    def free_seq(self, seq: Sequence) -> None:
        # Reverse order: the tail of a prefix is evicted before its head.
        for bid in reversed(seq.block_table):
            block = self.blocks[bid]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free.append(bid)
                self.free_set.add(bid)
        seq.block_table = []
        seq.num_hashed_blocks = 0
