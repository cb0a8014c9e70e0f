"""infinity-emb's server, started for bench/minilm_gpu.py on hosts whose transformers is 5.x.

infinity-emb 0.0.78 (the newest on PyPI) calls the tokenizer's ``batch_encode_plus``, which
transformers 5 removed (calling the tokenizer does the same). This launcher restores that one name
as an alias of ``__call__`` before infinity's CLI starts; nothing else of infinity is changed, so
the peer runs its own batching, engine and server.

    python bench/peers/infinity_server.py v2 --model-id DIR --engine torch ...
"""

from __future__ import annotations

import sys
from typing import Any


def _restore_batch_encode_plus() -> None:
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

    if not hasattr(PreTrainedTokenizerBase, "batch_encode_plus"):

        def batch_encode_plus(self: Any, batch: list[str], **kwargs: Any) -> Any:
            return self(batch, **kwargs)

        PreTrainedTokenizerBase.batch_encode_plus = batch_encode_plus  # type: ignore[attr-defined]


if __name__ == "__main__":
    _restore_batch_encode_plus()
    from infinity_emb.cli import cli

    sys.argv[0] = "infinity_emb"
    cli()
