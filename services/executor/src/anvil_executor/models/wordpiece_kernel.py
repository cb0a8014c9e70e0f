"""The compiled part of the BERT WordPiece fast path (models/wordpiece.py): a batch of ASCII texts to
token ids in one numba call that releases the GIL.

The vocabulary is a byte trie held in three arrays: an open-addressing hash table from (node, byte)
to child node (`keys`, `children`; a key is ``node * 256 + byte``, -1 marks an empty slot) and each
node's token id (`token`, -1 where the path is not a piece). Node 0 is the root; continuation pieces
are stored with their prefix (``##ing``), so a continuation match walks from the prefix's node
(`cont_root`). Walking the trie from a word position as far as it goes and keeping the last node
that is a piece gives the longest piece there: the greedy longest-match-first of WordPiece, in one
pass over the characters instead of a dictionary probe per candidate length.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["DECLINED", "HASH_MULT", "encode_rows", "slot_of"]

HASH_MULT = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing of a (node, byte) key (mod 2**64)
# row status in `counts` for a row this path leaves to Hugging Face tokenizers
DECLINED = -1


def slot_of(key: int, shift: int) -> int:
    """A key's first slot, as `_child` computes it (for the table's builder, in Python ints)."""
    return ((key * int(HASH_MULT)) & 0xFFFF_FFFF_FFFF_FFFF) >> shift


@njit(cache=True, nogil=True, inline="always")
def _child(keys: np.ndarray, children: np.ndarray, shift: int, node: int, byte: int) -> np.int64:
    key = np.int64(node) * 256 + byte
    mask = np.int64(keys.shape[0] - 1)
    slot = np.int64((np.uint64(key) * HASH_MULT) >> np.uint64(shift))
    while True:
        k = keys[slot]
        if k == key:
            return np.int64(children[slot])
        if k < 0:
            return np.int64(-1)
        slot = (slot + np.int64(1)) & mask


@njit(cache=True, nogil=True, inline="always")
def _lower(b: int, lowercase: bool) -> int:
    if lowercase and 65 <= b <= 90:
        return b + 32
    return b


@njit(cache=True, nogil=True, inline="always")
def _is_punct(b: int) -> bool:
    # ASCII punctuation as BERT's pre-tokenizer splits it: ! to /, : to @, [ to `, { to ~
    return 33 <= b <= 47 or 58 <= b <= 64 or 91 <= b <= 96 or 123 <= b <= 126


@njit(cache=True, nogil=True)
def _has_added(buf: np.ndarray, s: int, e: int, added: np.ndarray, added_len: np.ndarray) -> bool:
    """Whether an added token's content (lowercased) occurs in buf[s:e], case-blind."""
    for a in range(added.shape[0]):
        n = added_len[a]
        for i in range(s, e - n + 1):
            j = 0
            while j < n and _lower(buf[i + j], True) == added[a, j]:
                j += 1
            if j == n:
                return True
    return False


@njit(cache=True, nogil=True)
def encode_rows(
    buf: np.ndarray,  # (bytes,) uint8: every text back to back
    offs: np.ndarray,  # (rows + 1,) int64: text r is buf[offs[r]:offs[r + 1]]
    keys: np.ndarray,  # (slots,) int64, slots a power of two
    children: np.ndarray,  # (slots,) int32
    token: np.ndarray,  # (nodes,) int32
    shift: int,  # 64 - log2(slots)
    cont_root: int,  # node of the continuation prefix, -1 if the vocabulary has none
    lowercase: bool,
    added: np.ndarray,  # (added tokens, longest) uint8, lowercased ASCII
    added_len: np.ndarray,  # (added tokens,) int64
    unk: int,
    cls: int,
    sep: int,
    max_word_chars: int,
    out: np.ndarray,  # (rows, max_tokens) int64: row r's ids in out[r, :counts[r]]
    counts: np.ndarray,  # (rows,) int32: tokens of row r, DECLINED where Hugging Face must do it
) -> None:
    """Tokenize every row: [CLS] pieces [SEP], truncated to out.shape[1] tokens as tokenizers'
    truncation does (content cut, [SEP] kept). A row with a byte outside printable ASCII, tab, line
    feed and carriage return, or with an added token's text in it, is DECLINED."""
    max_tokens = out.shape[1]
    full = max_tokens - 1  # [CLS] and the content kept
    longest = 0
    for r in range(offs.shape[0] - 1):
        longest = max(longest, offs[r + 1] - offs[r])
    # one word's pieces: at most one per character of a word that is not unknown
    scratch = np.empty(min(max_word_chars, longest) + 1, np.int64)
    for r in range(offs.shape[0] - 1):
        s, e = offs[r], offs[r + 1]
        ok = True
        for i in range(s, e):
            b = buf[i]
            if b > 126 or (b < 32 and b != 9 and b != 10 and b != 13):
                ok = False
                break
        if not ok or (added.shape[0] > 0 and _has_added(buf, s, e, added, added_len)):
            counts[r] = DECLINED
            continue
        out[r, 0] = cls
        n = 1
        i = s
        while i < e and n < full:
            b = buf[i]
            if b == 32 or b == 9 or b == 10 or b == 13:
                i += 1
                continue
            w0 = i  # a word: one punctuation character, or a run of letters and digits
            if _is_punct(b):
                i += 1
            else:
                while i < e:
                    c = buf[i]
                    if c == 32 or c == 9 or c == 10 or c == 13 or _is_punct(c):
                        break
                    i += 1
            m = 0  # pieces of buf[w0:i] in scratch
            if i - w0 > max_word_chars:
                scratch[0] = unk
                m = 1
            else:
                pos = w0
                while pos < i:
                    node = 0 if pos == w0 else cont_root
                    best, best_end = -1, pos
                    j = pos
                    while j < i and node >= 0:
                        node = int(_child(keys, children, shift, node, _lower(buf[j], lowercase)))
                        j += 1
                        if node >= 0 and token[node] >= 0:
                            best, best_end = token[node], j
                    if best < 0:  # the rest matches no piece: the whole word is unknown
                        scratch[0] = unk
                        m = 1
                        break
                    scratch[m] = best
                    m += 1
                    pos = best_end
            for k in range(m):  # what the truncation keeps of it
                if n >= full:
                    break
                out[r, n] = scratch[k]
                n += 1
        out[r, n] = sep
        counts[r] = n + 1
