"""The built-ins of a running GPU stack answer what their numpy twins compute (docs/executor_gpu.md,
"Built-ins on the GPU"): for each of identity, mlp and mlp4x1024 that the stack serves, its platform
(model metadata) and the largest error of a few KServe JSON answers against the numpy model.

    python bench/gpu_builtins_check.py --url http://localhost:8000 [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import httpx
import numpy as np

from anvil_executor.models.builtin import DeepMlpModel, IdentityModel, MlpModel

MODELS = {"identity": IdentityModel, "mlp": MlpModel, "mlp4x1024": DeepMlpModel}


def check(client: httpx.Client, name: str, rows: int, seed: int) -> dict[str, object]:
    meta = client.get(f"/v2/models/{name}")
    if meta.status_code != 200:
        return {"model": name, "served": False, "status": meta.status_code}
    ref_model = MODELS[name](64)
    width = ref_model.spec.inputs[0].dims[0]
    width = 257 if width == -1 else width
    x = np.random.default_rng(seed).standard_normal((rows, width)).astype(np.float32)
    tensor = {"name": "INPUT0", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}
    body = {"inputs": [tensor]}
    r = client.post(f"/v2/models/{name}/infer", json=body)
    r.raise_for_status()
    out = r.json()["outputs"][0]
    got = np.asarray(out["data"], np.float32).reshape(out["shape"])
    ref = ref_model.run([{"INPUT0": x}])[0]["OUTPUT0"]
    err = float(np.abs(got - ref).max()) / max(float(np.abs(ref).max()), 1e-30)
    return {"model": name, "served": True, "platform": meta.json().get("platform"), "rows": rows,
            "max_rel_error": err}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://localhost:8000")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    res = []
    with httpx.Client(base_url=args.url, timeout=30) as client:
        for name in MODELS:
            for rows, seed in ((1, 0), (5, 1)):
                row = check(client, name, rows, seed)
                print(json.dumps(row), flush=True)
                res.append(row)
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
