"""A request's pages in every KV group: allocation, sliding, prefix hits, forks (no JAX).

The scheduler hands its page work to :class:`GroupPages` when the model's KV
layout has several groups or a sliding window (``kv_groups.py``). Group 0's
table is ``Request.page_ids`` (what the uniform path uses too), the others are
``Request.group_pages`` (one list per group 1..G-1). All tables of a request
have the same length: entry j covers positions ``[j*page_size, (j+1)*page_size)``.

Sliding. Before a request's pages are reserved for a step starting at position
``start``, each sliding group gives back the pages whose positions all lie
before ``start - W + 1`` (no query of this step or a later one reads them); the
table keeps ``NULL_PAGE`` there. A page is given back only when the table gets
a new page or is written otherwise (the scheduler's decode fast path skips
rows within a page), so a decoding sequence holds ``ceil((W-1)/page_size) + 1``
pages per sliding group. Pages are registered in the prefix cache before they
are given back, so they stay reusable until evicted.

Prefix hits. A hit of h full pages needs, in every full group, the first h
pages cached, and in every sliding group only the pages that hold the window
of the first position computed, ``[h*page_size - W + 1, h*page_size)``. The
longest h that every group can serve wins; each group's pages are cached under
its own key (``PagePool(group=)``), so the same tokens in two groups are two
pages.

Every table change other than growth at the end lowers the table's count of
pages sent (``Request.num_pages_sent`` for group 0, ``group_pages_sent`` for the
others) to the first entry it changed, so the next row carries the table from
there (the page-change contract of ``scheduler_output.py``); giving pages back
is a change from the first page given back.
"""

from __future__ import annotations

from pagedjax.core.kv_groups import KVLayout
from pagedjax.core.page_pool import NULL_PAGE, PagePool
from pagedjax.core.request import Request
from pagedjax.utils import cdiv


class GroupPages:
    def __init__(self, pool: PagePool, layout: KVLayout, max_num_batched_tokens: int):
        self.pool = pool
        self.layout = layout
        self.page_size = pool.page_size
        self.windows = [g.window for g in layout.groups]
        self.num_groups = len(layout.groups)
        self.chunk = max_num_batched_tokens

    # ---- tables ---------------------------------------------------------------------
    def tables(self, req: Request) -> list[list[int]]:
        return [req.page_ids] + req.group_pages

    def _set(self, req: Request, g: int, table: list[int]) -> None:
        if g == 0:
            req.page_ids = table
        else:
            req.group_pages[g - 1] = table

    def _assign(self, req: Request, tables: list[list[int]]) -> None:
        req.page_ids, req.group_pages = tables[0], tables[1:]
        req.num_pages_sent = 0
        req.group_pages_sent = [0] * (len(tables) - 1)

    @staticmethod
    def _changed(req: Request, g: int, j: int) -> None:
        """Group g's table changed from entry j on: it goes out again from there."""
        if g == 0:
            req.num_pages_sent = min(req.num_pages_sent, j)
        else:
            req.group_pages_sent[g - 1] = min(req.group_pages_sent[g - 1], j)

    def changes(self, req: Request) -> tuple[list[int], list]:
        """Groups 1..: each table's first entry unchanged since the request's latest
        row and its entries from there (``ScheduledRow.group_page_starts`` and
        ``group_new_page_ids``); marks them sent."""
        starts, news = list(req.group_pages_sent), []
        for g, t in enumerate(req.group_pages):
            news.append(t[starts[g]:] if starts[g] < len(t) else ())
            req.group_pages_sent[g] = len(t)
        return starts, news

    def pages_per_seq(self, num_tokens: int) -> int:
        return self.layout.pages_per_seq(num_tokens, self.page_size, self.chunk)

    def held(self, req: Request, group: int) -> int:
        """Pages the request holds in ``group`` (NULL entries not counted)."""
        return sum(1 for p in self.tables(req)[group] if p != NULL_PAGE)

    # ---- the decode fast path ---------------------------------------------------------
    def decode_ready(self, req: Request, j: int) -> bool:
        """Every other group has page j, private to the request (group 0 checked by the
        caller) and nothing to give back: the row needs no pool work."""
        refs, sent = self.pool.ref_counts, req.group_pages_sent
        for g, t in enumerate(req.group_pages):
            if j >= len(t) or refs[t[j]] > 1 or sent[g] != len(t):
                return False
        return True

    # ---- reserve / free ---------------------------------------------------------------
    def slide(self, req: Request, start: int) -> None:
        """Give back the sliding groups' pages before the window of position ``start``."""
        ps, tables = self.page_size, None
        for g, w in enumerate(self.windows):
            if w is None:
                continue
            cut = max(0, start - w + 1) // ps  # pages [0, cut) are out of every window
            tables = tables or self.tables(req)
            t = tables[g]
            drop = [p for p in t[:cut] if p != NULL_PAGE]
            if not drop:
                continue
            if self.pool.enable_prefix_caching:
                self.register(req)  # keep them as cached content
            self.pool.free(drop)
            self._changed(req, g, t.index(drop[0]))
            self._set(req, g, [NULL_PAGE] * min(cut, len(t)) + t[cut:])

    def reserve(self, req: Request, num_new: int) -> list[tuple[int, int]] | None:
        """Pages (and copy-on-write copies) so req can write num_new tokens in every
        group; None (nothing taken) when the pool is short."""
        ps, pool = self.page_size, self.pool
        start = req.num_computed_tokens
        self.slide(req, start)
        end = start + num_new
        tables = self.tables(req)
        refs = pool.ref_counts
        need, shared = 0, []
        for g, t in enumerate(tables):
            need += max(0, cdiv(end, ps) - len(t))
            shared += [(g, j) for j in range(start // ps, min(len(t), cdiv(end, ps)))
                       if refs[t[j]] > 1]
        if need + len(shared) > pool.num_allocatable:
            return None
        cow = []
        for g in sorted({g for g, _ in shared}):
            self._set(req, g, list(tables[g]))
        tables = self.tables(req)
        for g, j in shared:
            dst, src = pool.make_writable(tables[g], j)
            cow.append((src, dst))
            self._changed(req, g, j)
        for t in tables:
            n = cdiv(end, ps) - len(t)
            if n > 0:
                t.extend(pool.allocate(n))
        return cow

    def free(self, req: Request) -> None:
        self.pool.free([p for t in self.tables(req) for p in t if p != NULL_PAGE])
        self._assign(req, [[] for _ in range(self.num_groups)])

    def truncate(self, req: Request, keep: int) -> None:
        """Keep the first ``keep`` entries of every table (a rolled-back speculation)."""
        for g, t in enumerate(self.tables(req)):
            if len(t) > keep:
                self.pool.free([p for p in t[keep:] if p != NULL_PAGE])
                self._set(req, g, t[:keep])
                self._changed(req, g, keep)

    def fork(self, parent: Request, child: Request, num_pages: int | None = None) -> None:
        """The child shares the parent's first ``num_pages`` entries of each table."""
        tables = [list(t if num_pages is None else t[:num_pages]) for t in self.tables(parent)]
        self.pool.fork([p for t in tables for p in t if p != NULL_PAGE])
        self._assign(child, tables)

    # ---- admission with prefix hits ---------------------------------------------------
    def find_hit(self, req: Request) -> tuple[int, list[list[int]]]:
        """(h, tables): the longest prefix of h full pages every group can serve, and
        each group's cached pages for it (NULL where a sliding group needs none).
        No refs taken."""
        pool, ps = self.pool, self.page_size
        empty = [[] for _ in range(self.num_groups)]
        if not pool.enable_prefix_caching:
            return 0, empty
        tokens, salt, hashes = req.all_token_ids, req.cache_salt, req.block_hashes
        h = (len(tokens) - 1) // ps
        full: dict[int, list[int]] = {}
        for g, w in enumerate(self.windows):
            if w is None:
                full[g] = pool.peek_prefix(tokens, salt, block_hashes=hashes, group=g)
                h = min(h, len(full[g]))
        probes: dict[tuple[int, int], int | None] = {}

        def probe(g: int, i: int) -> int | None:
            if (g, i) not in probes:
                probes[g, i] = pool.cached_block(i, tokens, salt, block_hashes=hashes, group=g)
            return probes[g, i]

        while h > 0:  # a missing block m rules out every h > m: jump to h = m
            missing = next((i for g, w in enumerate(self.windows) if w is not None
                            for i in range(h - 1, max(0, h * ps - w + 1) // ps - 1, -1)
                            if probe(g, i) is None), None)
            if missing is None:
                break
            h = missing
        if h == 0:
            return 0, empty
        tables = []
        for g, w in enumerate(self.windows):
            if w is None:
                tables.append(full[g][:h])
            else:
                first = max(0, h * ps - w + 1) // ps
                tables.append([NULL_PAGE] * first + [probe(g, i) for i in range(first, h)])
        return h, tables

    def admit_cost(self, req: Request, h: int, hit_tables: list[list[int]],
                   end: int) -> int:
        """Pages taken from the allocatable ones to admit req with hit h up to ``end``
        tokens: new pages plus cached (ref 0) hit pages."""
        refs = self.pool.ref_counts
        new = self.num_groups * max(0, cdiv(end, self.page_size) - h)
        cached = sum(1 for t in hit_tables for p in t if p != NULL_PAGE and refs[p] == 0)
        return new + cached

    def admit(self, req: Request, h: int, hit_tables: list[list[int]], end: int) -> None:
        """Take the hit's pages and allocate the rest up to ``end`` tokens."""
        pool, ps = self.pool, self.page_size
        if h:
            pool.acquire([p for t in hit_tables for p in t if p != NULL_PAGE])
            pool.prefix_queries += req.num_tokens
            pool.prefix_hits += h * ps
        elif pool.enable_prefix_caching:
            pool.prefix_queries += req.num_tokens
        n = max(0, cdiv(end, ps) - h)
        self._assign(req, [list(t) + pool.allocate(n) for t in hit_tables])

    # ---- prefix-cache registration ----------------------------------------------------
    def register(self, req: Request) -> None:
        """Offer every group's newly full, computed pages to the prefix cache."""
        known = min(req.num_computed_tokens, req.num_tokens)  # placeholders have no content
        full = min(known // self.page_size, len(req.page_ids))
        if full <= req.num_registered_pages:
            return
        tokens = req.all_token_ids
        for g, t in enumerate(self.tables(req)):
            self.pool.register(t, tokens, known, req.cache_salt, block_hashes=req.block_hashes,
                               start_page=req.num_registered_pages, group=g)
        req.num_registered_pages = full
