"""Small torch models exported to ONNX inside tests (random weights, fixed seeds).

Only imported by tests that already did ``pytest.importorskip("torch")``.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn


class Mlp(nn.Module):
    def __init__(self, d_in: int = 64, hidden: int = 128, d_out: int = 32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        h = nn.functional.gelu(self.fc2(h))
        return torch.sigmoid(self.fc3(h))


class Layer(nn.Module):
    """A post-LN BERT layer written the way HF's BertLayer computes it."""

    def __init__(self, hidden: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.h, self.d = heads, hidden // heads
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, hidden)
        self.o = nn.Linear(hidden, hidden)
        self.ln1 = nn.LayerNorm(hidden, eps=1e-12)
        self.f1 = nn.Linear(hidden, ffn)
        self.f2 = nn.Linear(ffn, hidden)
        self.ln2 = nn.LayerNorm(hidden, eps=1e-12)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        b, t = x.shape[0], x.shape[1]
        return x.view(b, t, self.h, self.d).permute(0, 2, 1, 3)  # (B, nh, T, D)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.d) + bias
        p = torch.softmax(scores, dim=-1)
        ctx = torch.matmul(p, v).permute(0, 2, 1, 3).contiguous()
        ctx = ctx.view(ctx.shape[0], ctx.shape[1], -1)
        x = self.ln1(self.o(ctx) + x)
        return self.ln2(self.f2(nn.functional.gelu(self.f1(x))) + x)


class Bert(nn.Module):
    def __init__(
        self,
        vocab: int = 500,
        hidden: int = 64,
        heads: int = 2,
        layers: int = 2,
        ffn: int = 128,
        max_pos: int = 64,
    ) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(max_pos, hidden)
        self.ln = nn.LayerNorm(hidden, eps=1e-12)
        self.layers = nn.ModuleList([Layer(hidden, heads, ffn) for _ in range(layers)])
        self.register_buffer("position_ids", torch.arange(max_pos).unsqueeze(0), persistent=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        x = self.word(input_ids) + self.pos(self.position_ids[:, :t])
        x = self.ln(x)
        bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, bias)
        return x


def export_mlp(path: Path, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    model = Mlp().eval()
    torch.onnx.export(
        model,
        (torch.randn(2, 64),),
        str(path),
        input_names=["x"],
        output_names=["y"],
        dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}},
        opset_version=17,
        dynamo=False,
    )
    return path


def export_bert(path: Path, seed: int = 0, opset: int = 17) -> Path:
    torch.manual_seed(seed)
    model = Bert().eval()
    ids = torch.randint(0, 500, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.int64)
    torch.onnx.export(
        model,
        (ids, mask),
        str(path),
        input_names=["input_ids", "attention_mask"],
        output_names=["last_hidden_state"],
        dynamic_axes={
            "input_ids": {0: "batch", 1: "seq"},
            "attention_mask": {0: "batch", 1: "seq"},
            "last_hidden_state": {0: "batch", 1: "seq"},
        },
        opset_version=opset,
        dynamo=False,
    )
    return path
