"""Statistics of one text file: lines, words, sha256 and the most common words.

Pure functions, shared by the demo handlers and their tests. Words are
``[A-Za-z_][A-Za-z0-9_]*`` lower-cased (identifiers, keywords and English words
alike), which is what the Node worker counts too.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from typing import Any

WORD_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Words returned per file (the summary aggregates these across files).
TOP_WORDS_PER_FILE = 20


def file_stats(path: str, top_n: int = TOP_WORDS_PER_FILE) -> dict[str, Any]:
    """Count lines and words of a file and hash its bytes.

    Args:
        path: File to read; decoded as UTF-8 with replacement characters.
        top_n: How many of the most common words to return.

    Returns:
        ``{"path", "lines", "words", "sha256", "top_words": [[word, count], ...]}``;
        ``sha256`` is the hex digest of the raw bytes.

    Raises:
        OSError: The file cannot be read.
    """
    with open(path, "rb") as fh:
        raw = fh.read()
    text = raw.decode("utf-8", errors="replace")
    counts = Counter(w.lower() for w in WORD_RE.findall(text))
    return {
        "path": path,
        "lines": text.count("\n") + (1 if text and not text.endswith("\n") else 0),
        "words": sum(counts.values()),
        "sha256": hashlib.sha256(raw).hexdigest(),
        "top_words": [[w, c] for w, c in counts.most_common(top_n)],
    }
