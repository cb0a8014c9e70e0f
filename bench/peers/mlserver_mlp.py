"""mlp4x1024 as an MLServer (1.7) custom runtime; batching is MLServer's adaptive batching
(model-settings.json: max_batch_size, max_batch_time), written by serving_peers.py."""

from __future__ import annotations

from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from weights import forward, layers


class Mlp(MLModel):
    async def load(self) -> bool:
        self.weights = layers()
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])  # (B, 1024) fp32, B = rows of the merged batch
        y = forward(self.weights, x.reshape(-1, 1024))
        return InferenceResponse(
            id=payload.id, model_name=self.name, outputs=[NumpyCodec.encode_output("OUTPUT0", y)]
        )
